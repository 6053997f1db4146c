"""rlx's DeepSpeed checkpoint engine: it reads state without unpickling code, and saves into memory.

Reading: DeepSpeed saves its state with ``torch.save`` and loads it with ``torch.load(weights_only=False)``,
which can run code hidden in a tampered file. rlx loads with ``weights_only=True``: tensors and plain
data, plus the few DeepSpeed records the state holds. Policy weights never go through here; they are
safetensors.

Saving: ``save_checkpoint`` hands each file's state to the engine, which keeps a host copy of it
(under LoRA of the adapter only) instead of writing it (``PolicyTrainer.snapshot``). Training may then
go on at once while a thread writes the copies: the copy costs a memory copy, the write the disk.
"""

from __future__ import annotations

import copy
import os
import pickle
import re

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from rlx.errors import UserError

STATE_RECORDS = [LossScaler, ZeroStageEnum, fragment_address]  # what ZeRO's optimizer state holds besides tensors


def host_copy(item, copies: dict):
    """``item`` with every tensor copied to host memory and every container rebuilt, so that training
    can change the original at once. ``copies`` maps a tensor's storage and view to its copy: a tensor
    met twice (tied weights, the module in both the policy and DeepSpeed's state) is copied once."""
    if torch.is_tensor(item):
        key = (item.untyped_storage().data_ptr(), item.storage_offset(), item.shape, item.stride(), item.dtype)
        if key not in copies:
            copies[key] = to_host(item.detach())
        return copies[key]
    if isinstance(item, dict):
        return type(item)((key, host_copy(value, copies)) for key, value in item.items())
    if isinstance(item, list | tuple):
        return type(item)(host_copy(value, copies) for value in item)
    return copy.deepcopy(item)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of ``tensor``. From a GPU it goes to page-locked memory without waiting (``take``
    waits once for all): a copy into pageable memory is staged through a driver buffer at a fraction
    of the bus's speed (docs/performance.md), page-locked memory at its full speed. torch's
    caching host allocator keeps the page-locked blocks when a written snapshot frees them, so the next
    checkpoint of the same tensors reuses them instead of locking memory again."""
    if not tensor.is_cuda:
        return tensor.to("cpu", copy=True)
    return torch.empty_like(tensor, device="cpu", pin_memory=True).copy_(tensor, non_blocking=True)


def copies_done() -> None:
    """Wait for the device-to-host copies ``to_host`` queued (nothing to wait for on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class SnapshotCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, reading with ``weights_only=True`` and saving to memory:
    after ``save_checkpoint(root, ...)``, ``take(root)`` gives each file's path under ``root`` and its
    state's host copy."""

    def __init__(self, config_params=None, trainable: set[str] | None = None):
        super().__init__(config_params)
        self.trainable = trainable  # under LoRA the adapter's names: the frozen base is ``load_from``'s
        self.copies: dict = {}
        self.saved: dict[str, object] = {}

    def load(self, path: str, map_location=None):
        """The state in ``path``; a file holding anything but tensors, plain data and DeepSpeed's records is
        refused in one line (torch's own error would advise loading it unsafely)."""
        try:
            with torch.serialization.safe_globals(STATE_RECORDS):
                return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL (\S+)", str(exc))
            holds = f" ({found[1]})" if found else ""
            raise UserError(
                f"{path}: refused: it holds more than tensors and DeepSpeed's records{holds}, so a tampered or foreign "
                "optimizer state; nothing in it was run. Restore the checkpoint, or delete its trainer_state/ and "
                "rlx re-creates it by replay"
            ) from None

    def save(self, state_dict, path: str) -> None:
        """Keep a host copy of ``state_dict``; under LoRA of its trainable tensors only: the frozen base is
        ``load_from``'s. DeepSpeed's own ``exclude_frozen_parameters`` would keep a frozen tensor tied under
        a second name (a tied output head: the whole embedding), and without it ZeRO-2 and -3 add every
        frozen weight as ``frozen_param_fragments`` (most of a LoRA checkpoint's bytes)."""
        if self.trainable is not None and "module" in state_dict:
            frozen = {"frozen_param_shapes": None, "frozen_param_fragments": None}  # as DeepSpeed's exclusion writes
            state_dict = state_dict | {"module": self.only_trainable(state_dict["module"])} | frozen
        self.saved[path] = host_copy(state_dict, self.copies)

    def only_trainable(self, tensors: dict) -> dict:
        return tensors if self.trainable is None else {k: v for k, v in tensors.items() if k in self.trainable}

    def preserves_storage_sharing(self) -> bool:
        return False  # DeepSpeed need not clone views before saving: host_copy makes each tensor compact

    def take(self, root: str) -> dict[str, object]:
        """The states saved since the last ``take``, by their path relative to ``root``, every copy complete."""
        copies_done()
        saved = {os.path.relpath(path, root): state for path, state in self.saved.items()}
        self.saved, self.copies = {}, {}
        return saved

    def write(self, states: dict[str, object], folder) -> None:
        """Write ``take``'s states under ``folder``, as DeepSpeed's own engine would have."""
        for relative, state in states.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, target, _use_new_zipfile_serialization=self.zipfile_serialization)
