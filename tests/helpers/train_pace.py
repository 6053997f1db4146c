"""Training throughput as MFU under each setting, for the GPU check's training sweep: one trainer, the
same rollouts, every setting measured in the same process.

A setting changes one thing from rlx's defaults: the micro-batches' token budget (``pack_max_length``,
and so how many micro-batches the batch needs), the attention implementation, activation checkpointing
(the call ``PolicyTrainer`` makes for ``deepspeed.activation_checkpointing``), or scoring every position
instead of only the responses' (``logits_to_keep`` off). Each runs the update's forward and backward
(``token_logprobs`` and ``PolicyTrainer.backward``, as the train stage does) over every micro-batch, then
one optimizer step, and the no-grad forward of the old log-probs; MFU is rlx.training.flops's count of
the real tokens over the measured seconds and the device's peak, as the train stage's ``perf/mfu/*``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
from unittest import mock

import torch

from helpers.engine_pace import timed
from rlx.training import trainer as trainer_module
from rlx.training.flops import forward_flops, mfu, training_flops
from rlx.training.packing import micro_batches
from rlx.training.trainer import TokenBatch, token_logprobs

BASE = {"pack": 4096, "attention": "sdpa", "checkpointing": False, "logits_to_keep": True}
SETTINGS = {  # the riskiest (memory) last: a setting that runs out of memory is recorded as such
    "pack_4096": {},  # rlx's default budget
    "pack_8192": {"pack": 8192},
    "pack_16384": {"pack": 16384},  # the GPU recipe's
    "all_positions_scored": {"logits_to_keep": False},
    "activation_checkpointing_pack_16384": {"pack": 16384, "checkpointing": True},
    "flash_attention_2_pack_16384": {"pack": 16384, "attention": "flash_attention_2"},
    "pack_32768": {"pack": 32768},
}


def synthetic_rollouts(count: int, response_len: int, vocab: int, seed: int = 0) -> list[dict]:
    """Rollout rows of random tokens: prompts of 20-40 tokens, every response ``response_len`` long."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 41, (count,), generator=generator).tolist()
    return [
        {
            "prompt_ids": torch.randint(10, vocab, (length,), generator=generator).tolist(),
            "response_ids": torch.randint(10, vocab, (response_len,), generator=generator).tolist(),
            "prompt_len": length,
            "response_len": response_len,
        }
        for length in lengths
    ]


def unavailable(setting: dict) -> str | None:
    """Why a setting cannot run here, if it cannot."""
    if setting.get("attention") == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "flash_attn is not installed"
    return None


@contextlib.contextmanager
def configured(model, attention: str, checkpointing: bool, logits_to_keep: bool):
    """The model with a setting applied, put back as it was afterwards."""
    before = model.config._attn_implementation
    with contextlib.ExitStack() as undo:
        if attention != before:
            model.set_attn_implementation(attention)
            undo.callback(model.set_attn_implementation, before)
        if checkpointing:
            model.gradient_checkpointing_enable()
            undo.callback(model.gradient_checkpointing_disable)
        if not logits_to_keep:
            undo.enter_context(mock.patch.object(trainer_module, "takes_logits_to_keep", lambda _: False))
        yield


def passes(trainer, batches: list[TokenBatch]) -> tuple[float, float]:
    """Seconds of the update's forward and backward over ``batches`` (after one untimed micro-batch:
    kernels, allocator), then of their no-grad forward; one optimizer step in between."""
    model = trainer.module

    def update():
        for batch in batches:
            logp, _ = token_logprobs(model, batch)
            trainer.backward(-(logp * batch.mask).sum() / batch.mask.sum())

    warm = batches[0]
    trainer.backward(-(token_logprobs(model, warm)[0] * warm.mask).sum() / warm.mask.sum())
    _, update_s = timed(update)
    trainer.optimizer_step(0.0)
    _, forward_s = timed(lambda: [trainer.logprobs(batch) for batch in batches])
    return update_s, forward_s


def measure(trainer, rollouts: list[dict], pad_id: int, setting: dict, peak: float) -> dict:
    """One setting's MFU of the update's forward and backward and of the old log-probs' forward."""
    setting = {**BASE, **setting}
    if reason := unavailable(setting):
        return {**setting, "skipped": reason}
    lengths = [row["prompt_len"] + row["response_len"] for row in rollouts]
    groups = micro_batches(list(range(len(rollouts))), lengths, setting["pack"])
    batches = [
        TokenBatch.from_ids([rollouts[i]["prompt_ids"] for i in g], [rollouts[i]["response_ids"] for i in g], pad_id)
        for g in groups
    ]
    sequences = [(row["prompt_len"] + row["response_len"], row["response_len"]) for row in rollouts]
    shape, on_gpu = trainer.model_shape, torch.cuda.is_initialized()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    try:
        with configured(trainer.module, setting["attention"], setting["checkpointing"], setting["logits_to_keep"]):
            update_s, forward_s = passes(trainer, batches)
    except torch.cuda.OutOfMemoryError as error:
        return {**setting, "micro_batches": len(batches), "error": str(error).splitlines()[0]}
    finally:
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    return {
        **setting,
        "micro_batches": len(batches),
        "tokens": sum(lengths),
        "forward_backward_s": update_s,
        "mfu_forward_backward": mfu(training_flops(shape, sequences, not trainer.lora), update_s, peak),
        "old_logprob_forward_s": forward_s,
        "mfu_old_logprob": mfu(forward_flops(shape, sequences), forward_s, peak),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
    }
