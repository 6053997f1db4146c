"""rlx's DeepSpeed checkpoint engine: it reads state without unpickling code, and saves into memory.

Reading: DeepSpeed saves its state with ``torch.save`` and loads it with ``torch.load(weights_only=False)``,
which can run code hidden in a tampered file. rlx loads with ``weights_only=True``: tensors and plain
data, plus the few DeepSpeed records the state holds. Policy weights never go through here; they are
safetensors.

Saving: ``save_checkpoint`` hands each file's state to the engine, which keeps a host copy of it
instead of writing it (``rlx.snapshot``). Training may then go on at once while a thread writes the
copies; the copy costs a memory copy of the state, the write costs the disk.
"""

from __future__ import annotations

import copy
import os

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

STATE_RECORDS = [LossScaler, ZeroStageEnum, fragment_address]  # what ZeRO's optimizer state holds besides tensors


def host_copy(item, copies: dict):
    """``item`` with every tensor copied to host memory and every container rebuilt, so that training
    can change the original at once. ``copies`` maps a tensor's storage and view to its copy: a tensor
    met twice (tied weights, the module in both the policy and DeepSpeed's state) is copied once."""
    if torch.is_tensor(item):
        key = (item.untyped_storage().data_ptr(), item.storage_offset(), item.shape, item.stride(), item.dtype)
        if key not in copies:
            copies[key] = item.detach().to("cpu", copy=True)
        return copies[key]
    if isinstance(item, dict):
        return type(item)((key, host_copy(value, copies)) for key, value in item.items())
    if isinstance(item, list | tuple):
        return type(item)(host_copy(value, copies) for value in item)
    return copy.deepcopy(item)


class SnapshotCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, reading with ``weights_only=True`` and saving to memory:
    after ``save_checkpoint(root, ...)``, ``take(root)`` gives each file's path under ``root`` and its
    state's host copy."""

    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.copies: dict = {}
        self.saved: dict[str, object] = {}

    def load(self, path: str, map_location=None):
        with torch.serialization.safe_globals(STATE_RECORDS):
            return torch.load(path, map_location=map_location, weights_only=True)

    def save(self, state_dict, path: str) -> None:
        self.saved[path] = host_copy(state_dict, self.copies)

    def preserves_storage_sharing(self) -> bool:
        return False  # DeepSpeed need not clone views before saving: host_copy makes each tensor compact

    def take(self, root: str) -> dict[str, object]:
        """The states saved since the last ``take``, by their path relative to ``root``."""
        saved = {os.path.relpath(path, root): state for path, state in self.saved.items()}
        self.saved, self.copies = {}, {}
        return saved

    def write(self, states: dict[str, object], folder) -> None:
        """Write ``take``'s states under ``folder``, as DeepSpeed's own engine would have."""
        for relative, state in states.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, target, _use_new_zipfile_serialization=self.zipfile_serialization)
