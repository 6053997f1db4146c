"""The policy's training engine: DeepSpeed around a HF causal LM, saved as a HF folder plus state.

DeepSpeed owns the optimizer step, ZeRO partitioning, precision and gradient clipping. rlx owns the
accumulation boundary (``managed_gradient_accumulation: false``): an optimizer step covers however
many token-bounded micro-batches its mini-batch needed, and the loss scaling is explicit.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlx.algo.support import entropy as support_entropy
from rlx.algo.support import support_log_probs
from rlx.config import LRConfig, SampleParams, WorkerConfig
from rlx.lineage.fingerprint import fingerprint, tensor_hashes
from rlx.store import faults
from rlx.store.artifacts import read_json, write_json
from rlx.training import distributed, lora
from rlx.training.flops import ModelShape
from rlx.training.loading import pretrained

if TYPE_CHECKING:
    from rlx.training.safe_checkpoint import SnapshotCheckpointEngine

DEEPSPEED_TAG = "state"
GATHER_BUCKET_BYTES = 1 << 28  # weights per ZeRO-3 gather when the policy is read whole


@dataclass
class TokenBatch:
    """Prompt+response sequences, right-padded. ``mask[b, t]`` is 1 where token ``t + 1`` is a response token
    the model generated (an agent's tool tokens are in the sequence, as context, but 0 in the mask)."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T - 1]

    @classmethod
    def from_ids(
        cls,
        prompts: list[list[int]],
        responses: list[list[int]],
        pad_id: int,
        response_masks: list[list[int] | None] | None = None,
    ) -> TokenBatch:
        """``response_masks``: per response, 1 for each token the model generated, 0 for a tool's (None: all 1)."""
        width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
        ids, attention, mask = [], [], []
        for prompt, response, scored in zip(prompts, responses, response_masks or [None] * len(prompts), strict=True):
            pad = width - len(prompt) - len(response)
            ids.append(prompt + response + [pad_id] * pad)
            attention.append([1] * (len(prompt) + len(response)) + [0] * pad)
            mask.append([0] * (len(prompt) - 1) + (list(scored) if scored else [1] * len(response)) + [0] * pad)
        return cls(torch.tensor(ids), torch.tensor(attention), torch.tensor(mask, dtype=torch.float32))

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def first_scored(self) -> int:
        """The first column of ``mask`` any row scores (``T - 1`` when none does)."""
        scored = self.mask.any(dim=0).nonzero()
        return int(scored[0]) if len(scored) else self.mask.shape[1]


def token_logprobs(
    model, batch: TokenBatch, sampling: SampleParams | None = None, forward=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the entropy of each next-token distribution: ``[B, T - 1]`` each,
    0 before the batch's first response token. The distribution is the one rollouts sample from with
    ``sampling`` (its temperature; its top-k / top-p support, rlx.algo.support); None: the model's own.

    Only the positions from the batch's first response token on go through the output head and the
    vocabulary-wide softmax (the model's ``logits_to_keep``, as TRL's GRPOTrainer does): no loss reads
    a prompt's logits, and at a real vocabulary (151 k for Qwen) they were most of the update's
    activation memory. The vocabulary-wide work runs where the model is; the two results come back to
    the CPU, where the loss is assembled with the batch's other tensors (the copy is part of the
    autograd graph). ``forward``: what runs the model (default: the model itself)."""
    device = model.device
    input_ids = batch.input_ids.to(device)
    start = batch.first_scored if takes_logits_to_keep(model) else 0
    keep = {"logits_to_keep": input_ids.shape[1] - start} if start else {}
    outputs = (forward or model)(input_ids=input_ids, attention_mask=batch.attention_mask.to(device), **keep)
    targets = input_ids[:, start + 1 :]
    logp_all, entropy = next_token_distribution(outputs.logits[:, :-1].float(), targets, sampling)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    before = (start, 0)  # the unscored positions, as zeros
    return torch.nn.functional.pad(logp.cpu(), before), torch.nn.functional.pad(entropy.cpu(), before)


def next_token_distribution(logits: torch.Tensor, targets: torch.Tensor, sampling: SampleParams | None):
    """Log-probs over the vocabulary at each position, and their entropy, as rollouts sampled them."""
    temperature = (sampling.temperature or 1.0) if sampling else 1.0
    if sampling is None or not (sampling.top_k or sampling.top_p < 1.0):
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        return logp_all, -(logp_all.exp() * logp_all).sum(dim=-1)
    logp_all = support_log_probs(logits, temperature, sampling.top_k, sampling.top_p, sampled=targets)
    return logp_all, support_entropy(logp_all)


def takes_logits_to_keep(model) -> bool:
    """Whether the model (under a peft wrapper, its base) scores only the last positions when asked;
    transformers' own causal LMs do, a remote-code model may not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def lr_factor(cfg: LRConfig, step: int, total_steps: int, base_lr: float) -> float:
    """Multiplier of the base LR after ``step`` optimizer steps: linear warm-up, then constant,
    cosine or linear decay to ``lr_min``."""
    warmup = int(cfg.warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.lr_type == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    floor = cfg.lr_min / base_lr
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_type == "cosine" else 1 - progress
    return floor + (1 - floor) * shape


def deepspeed_config(cfg: WorkerConfig) -> dict:
    zero: dict = {"stage": cfg.deepspeed.zero_stage}
    if cfg.deepspeed.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.optim_cfg.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.deepspeed.precision == "bf16", "check_grad_overflow": True},  # skip NaN/inf steps
        "steps_per_print": 2**31 - 1,
        "activation_checkpointing": {"partition_activations": cfg.deepspeed.activation_checkpointing},
    }


@torch.no_grad()
def nonfinite_parameter(module) -> str | None:
    """The first trained parameter holding a NaN or an infinity (an update with finite gradients can
    still overflow the weights, e.g. at a huge learning rate), or None; frozen ones (LoRA's base) cannot
    change. A parameter's sum is finite only if every element is, so the sum, a reduction with no
    temporary the size of the weights, clears it at a tenth of the cost of ``isfinite`` on every
    element (docs/performance.md); a sum that overflows is checked element by element."""
    for name, p in module.named_parameters():
        if p.requires_grad and not math.isfinite(float(p.sum())) and not bool(torch.isfinite(p).all()):
            return name
    return None


def gradients_finite(module) -> bool:
    return all(bool(torch.isfinite(p.grad).all()) for p in module.parameters() if p.grad is not None)


def trained_model(cfg: WorkerConfig, policy_dir: Path, base_dir: Path, seed: int, strict: bool = True):
    """The model to train: the full policy in ``policy_dir``; under LoRA the base in ``base_dir`` with the
    adapter in ``policy_dir`` (a new one, drawn from ``seed``, when ``policy_dir`` holds a full model: step 0).
    ``strict``: ``strict_load`` (rlx.training.loading.pretrained)."""
    if cfg.lora is None:
        return pretrained(policy_dir, strict, dtype=torch.float32)
    model = pretrained(base_dir, strict, dtype=torch.float32)
    return lora.adapt(model, cfg.lora, base_dir, policy_dir if lora.is_adapter(policy_dir) else None, seed)


def checkpoint_engine(engine, adapter_only: bool):
    """How DeepSpeed reads and writes its state (rlx.training.safe_checkpoint): loading tensors only, saving to
    host memory, and under LoRA (``adapter_only``) the adapter only."""
    from rlx.training.safe_checkpoint import SnapshotCheckpointEngine

    trainable = {name for name, p in engine.module.named_parameters() if p.requires_grad} if adapter_only else None
    return SnapshotCheckpointEngine(engine._config, trainable)


class PolicyTrainer:
    """A policy under training: load from a step's folders, update, save to the next step's."""

    def __init__(
        self,
        cfg: WorkerConfig,
        policy_dir: Path,
        state_dir: Path,
        total_optimizer_steps: int,
        base_dir: Path | None = None,
        seed: int = 0,
        strict: bool = True,
    ):
        import deepspeed

        distributed.ensure_rendezvous()
        if not torch.cuda.is_available():
            distributed.clear_stale_build_lock(distributed.CPU_COMM_OP)  # DeepSpeed's start would wait on it
        model = trained_model(cfg, policy_dir, base_dir or policy_dir, seed, strict)
        self.lora = lora.is_lora(model)
        self.frozen_sums: dict = {}  # the fingerprint's sums of the weights that do not train, read once
        if cfg.deepspeed.activation_checkpointing:
            model.gradient_checkpointing_enable()
            if self.lora:  # the frozen embeddings give no gradient, which the recomputed layers need as input
                model.enable_input_require_grads()
        optim = cfg.optim_cfg
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(cfg.lr_cfg, step, total_optimizer_steps, optim.lr)
        )
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg)
        )
        self.engine.checkpoint_engine = checkpoint_engine(self.engine, self.lora)
        distributed.writers_group()  # made by every rank at once, here, for the checkpoint writers to agree over
        if (state_dir / DEEPSPEED_TAG).is_dir():  # a LoRA state holds the adapter only: the base is base_dir's
            self.engine.load_checkpoint(str(state_dir), tag=DEEPSPEED_TAG, load_module_strict=strict and not self.lora)
        self.state = (
            read_json(state_dir / "state.json").get("extra", {}) if (state_dir / "state.json").is_file() else {}
        )

    @property
    def module(self):
        return self.engine.module

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, sampling: SampleParams | None = None) -> torch.Tensor:
        self.engine.module.eval()
        return token_logprobs(self.engine.module, batch, sampling)[0]

    def scored(self, batch: TokenBatch, sampling: SampleParams | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`token_logprobs` for the loss, the forward run by DeepSpeed's engine: ZeRO-3 counts a step's
        micro-batches there, and without it each backward replaced the gradients of the ones before."""
        return token_logprobs(self.engine.module, batch, sampling, forward=self.engine)

    @torch.no_grad()
    def reference_logprobs(self, batch: TokenBatch, sampling: SampleParams | None, frozen) -> torch.Tensor:
        """The KL reference's log-probs: under LoRA this very module with its adapter switched off (the base,
        without a second copy in memory); otherwise ``frozen()``'s, the frozen base model."""
        if not self.lora:
            return token_logprobs(frozen(), batch, sampling)[0]
        self.engine.module.eval()
        with self.engine.module.disable_adapter():
            return token_logprobs(self.engine.module, batch, sampling)[0]

    @cached_property
    def model_shape(self) -> ModelShape:
        """The policy's parameters by role and its attention's size, to count its FLOPs (read once)."""
        return ModelShape.of(self.module.config)

    @property
    def trainable_parameters(self) -> int:
        return lora.trainable_parameters(self.engine.module)

    def optimizer_state_bytes(self) -> int:
        """What this rank's optimizer keeps besides the weights (AdamW's moments of the trainable part,
        ZeRO's shard of them): the memory LoRA saves."""
        optimizer = self.engine.optimizer
        while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
            optimizer = optimizer.optimizer  # DeepSpeed's wrappers hold the torch optimizer that keeps the state
        tensors = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.module.train()
        self.engine.backward(loss, scale_wrt_gas=False)

    def finite_on_every_rank(self, loss: float) -> bool:
        """Whether no rank has a non-finite loss or gradient: all ranks must skip an update together."""
        bad = 0.0 if math.isfinite(loss) and gradients_finite(self.module) else 1.0
        return float(distributed.sum_across(torch.tensor([bad]))) == 0.0

    def optimizer_step(self, loss: float) -> dict[str, float]:
        """Apply the accumulated gradients (clipped by DeepSpeed); return grad norm, the LR used and
        ``skipped``: a step whose loss or gradients are not finite leaves weights and optimizer state
        as they were. ZeRO's optimizer checks the reduced gradients itself (it drops them and skips);
        without ZeRO (stage 0) the gradients are whole on the parameters and checked here."""
        lr = self.scheduler.get_last_lr()[0]
        if self.engine.zero_optimization_stage() == 0 and not self.finite_on_every_rank(loss):
            self.engine.zero_grad()
            return {"grad_norm": float("nan"), "lr": lr, "skipped": 1}
        skipped_before = self.engine.skipped_steps
        faults.point("train.optimizer_step")
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        skipped = int(self.engine.skipped_steps > skipped_before)
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": lr, "skipped": skipped}

    @property
    def partitioned(self) -> bool:
        """Whether ZeRO-3 holds the weights in pieces (on every rank, one rank included): outside a gather the
        module's parameters are empty, so it cannot be sampled from or read as it is."""
        return self.engine.zero_optimization_stage() == 3

    def gathered_weights(self, limit: int = GATHER_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole policy's tensors by their ``state_dict`` names, ZeRO-3's pieces gathered a bucket of
        ``limit`` bytes at a time: one collective per bucket rather than one per parameter, and never the
        whole model at once. Each is a copy out of its gather. Every rank must read them all (the gathers
        are collective)."""
        import deepspeed

        for bucket in distributed.buckets(self.module.state_dict(keep_vars=True).items(), limit):
            pieces = {id(t): t for t in bucket.values() if hasattr(t, "ds_id")}  # a tied weight once
            with deepspeed.zero.GatheredParameters(list(pieces.values())):
                yield from ((name, tensor.detach().clone()) for name, tensor in bucket.items())

    def full_parameters(self):
        """A context in which every rank holds the whole policy (ZeRO-3 gathers its partitions)."""
        if not self.partitioned:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()))

    def fingerprint(self) -> dict:
        """The weights' fingerprint (rlx.lineage.fingerprint), computed where they live (ZeRO-3 gathers them)."""
        with self.full_parameters():
            return fingerprint(self.engine.module, frozen=self.frozen_sums)

    def rank_weight_spread(self, own: dict) -> float:
        """How many ranks' weights differ from rank 0's (by ``own``, this rank's fingerprint); data-parallel
        ranks must end every update identical, so anything but 0 is a bug."""
        if distributed.world_size() == 1:
            return 0.0
        hashes = torch.tensor([int(value, 16) for value in tensor_hashes(own)], dtype=torch.int64)
        every = distributed.cat_across(hashes).view(distributed.world_size(), -1)
        spread = float((every != every[0]).any(dim=1).sum())
        if spread:
            raise RuntimeError(f"the training ranks' weights diverged ({spread:.0f} ranks differ from rank 0)")
        return spread

    def snapshot(self, tokenizer) -> TrainerSnapshot:
        """The policy and optimizer state as they are now, copied to host memory (seconds where writing
        them takes tens), so training can go on while ``TrainerSnapshot.write`` puts them on disk."""
        from rlx.training.safe_checkpoint import copies_done, host_copy

        checkpoints = self.engine.checkpoint_engine
        with self.full_parameters():
            weights = checkpoints.only_trainable(self.module.state_dict())  # peft saves an adapter from these
            policy = host_copy(weights, checkpoints.copies) if distributed.is_main() else None
            copies_done()  # before ZeRO-3 frees the gathered weights
        with tempfile.TemporaryDirectory(prefix="rlx-snapshot-") as scratch:
            self.engine.save_checkpoint(scratch, tag=DEEPSPEED_TAG, save_latest=False)
            states = checkpoints.take(scratch)
            plain = {str(f.relative_to(scratch)): f.read_bytes() for f in Path(scratch).rglob("*") if f.is_file()}
        state = {"global_steps": self.engine.global_steps, "extra": copy.deepcopy(self.state)}
        return TrainerSnapshot(self.module, tokenizer, policy, checkpoints, states, plain, state)


@dataclass
class TrainerSnapshot:
    """A trainer's state in host memory, to be written as a checkpoint: the policy (rank 0's state
    dict, written as a HF folder; under LoRA the adapter's, as peft's folder), DeepSpeed's files (every
    rank its shard), the files DeepSpeed wrote itself (its recovery scripts) and ``state``: what else
    the next step needs (e.g. an adaptive KL coefficient)."""

    module: object  # for its config and how it names its weights; its tensors are not read
    tokenizer: object
    policy: dict | None
    engine: SnapshotCheckpointEngine
    states: dict[str, object]
    plain: dict[str, bytes]
    state: dict

    def write(self, policy_dir: Path, state_dir: Path) -> None:
        """Write the policy folder and the state folder, each atomically (a kill mid-write leaves the
        previous ones as they were). The ranks agree over a group of their own, so that they may write
        while training goes on (rlx.workers.worker.Worker.start_checkpoint)."""
        writers = distributed.writers_group()
        with distributed.atomic_dir_on_all_ranks(policy_dir, writers) as tmp:
            if self.policy is not None:
                self.module.save_pretrained(tmp, state_dict=self.policy, safe_serialization=True)
                self.tokenizer.save_pretrained(tmp)
        faults.point("train.save")
        with distributed.atomic_dir_on_all_ranks(state_dir, writers) as tmp:
            for relative, data in self.plain.items():
                (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
                (tmp / relative).write_bytes(data)
            self.engine.write(self.states, tmp)
            if distributed.is_main():
                write_json(self.state, tmp / "state.json")
