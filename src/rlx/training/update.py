"""One policy update from a step's judged rollouts, in place on the trainer.

Old log-probs are recomputed by the training engine (the rollout engine's are kept to measure the
mismatch; with a single update per batch they come from the loss's own forward), the step's samples
are split into ``optimizer_steps`` mini-batches, each cut into micro-batches that fit the
``pack_max_length`` token budget, and each mini-batch ends in one DeepSpeed optimizer step. The
stage around it (rlx.stages.train) reads and writes the step's files.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import torch

from rlx import clock
from rlx.algo import advantages as adv
from rlx.algo import distill, registry
from rlx.algo.correction import mismatch_metrics, weight_metrics
from rlx.algo.kl import adaptive_kl_coef
from rlx.config import RLTrainerConfig, staleness
from rlx.debugging import timed
from rlx.errors import UserError
from rlx.store.artifacts import read_rows
from rlx.store.layout import StepPaths
from rlx.training import distributed
from rlx.training.flops import device_peak, forward_flops, mfu, training_flops
from rlx.training.microbatch import (
    Micro,
    all_ranks,
    correction_weights,
    kl_in_reward,
    micro_loss,
    model_tokens,
    needs_reference,
    per_token,
    prepare_micro_batches,
    response_mask,
    reuses_old_logprobs,
)

log = logging.getLogger(__name__)

UPDATE_SCHEMA = pa.schema(
    [
        ("reward_used", pa.float64()),  # what the advantages were computed from (judged reward - KL penalty)
        ("kl", pa.float64()),  # the response's summed KL to the reference, when use_kl_in_reward
        ("advantage", pa.float64()),
        ("is_weight_mean", pa.float64()),  # importance weights over the response's tokens (rollout correction)
        ("is_weight_min", pa.float64()),
        ("is_weight_max", pa.float64()),
        ("old_logprob_source", pa.string()),  # the loss's own forward, or a separate no-grad pass
        ("staleness", pa.int64()),  # updates between the policy that generated the response and this one
    ]
)


@dataclass
class Scored:
    """A step's batch made ready for the update: its micro-batches, carrying their advantages."""

    rollouts: list[dict]
    minis: list[list[Micro]]
    rewards: torch.Tensor  # what the advantages were computed from
    kl: torch.Tensor | None  # per response, when use_kl_in_reward
    advantages: torch.Tensor
    extra: dict  # the KL-in-reward metrics
    timings: dict


def update_policy(config: RLTrainerConfig, paths: StepPaths, engines, trainer) -> tuple[dict, list[dict]]:
    """The step's policy update, in place on ``trainer``, at its seams: score the batch, update, report.
    Returns its metrics and, per response, the numbers it used (``update.parquet``)."""
    scored = score_batch(config, paths, engines, trainer)
    metrics = apply_updates(config, paths.number, scored.minis, trainer, scored.timings)
    bf16 = config.train_worker_cfg.deepspeed.precision == "bf16"  # MFU is against the bf16 peak
    metrics.update(utilisation(config, scored, trainer, device_peak(trainer.module.device) if bf16 else None))
    return report(config, scored, metrics)


def score_batch(config: RLTrainerConfig, paths: StepPaths, engines, trainer) -> Scored:
    """The step's judged rollouts as micro-batches with old and reference log-probs, shaped rewards,
    advantages and (under rollout correction) importance weights."""
    rollouts, judged = read_rows(paths.checked(paths.rollouts)), read_rows(paths.checked(paths.judged))
    with clock.part("old_logprob") as watch:
        minis = prepare_micro_batches(config, rollouts, trainer, engines)
    timings = {"time/train/old_logprob": watch.seconds}
    kl_coef = trainer.state.get("kl_coef", config.advantage_estimator_config.kl_ctrl.kl_coef)
    rewards, kl, extra, next_kl_coef = shaped_rewards(config, minis, judged, kl_coef)
    trainer.state["kl_coef"] = next_kl_coef  # the checkpoint keeps it: an adaptive coefficient goes on from there
    advantages = adv.compute(
        config.advantage_estimator_config.type,
        rewards,
        config.dataflow_config.prompt_repeat_k,
        mask=response_mask(rollouts),
        eps=config.advantage_estimator_config.eps,
        k=config.advantage_estimator_config.k,
    )
    every = [m for micros in minis for m in micros]
    attach_weights(config.train_worker_cfg.loss_cfg.rollout_correction, every, advantages)
    if config.teacher_config is not None:
        teachers = read_rows(paths.checked(paths.teacher))
        attach_distillation(config.teacher_config, every, advantages, rollouts, teachers)
    return Scored(rollouts, minis, rewards, kl, advantages, extra, timings)


def report(config: RLTrainerConfig, scored: Scored, metrics: dict) -> tuple[dict, list[dict]]:
    """The update's metrics completed (rollout/train mismatch, advantages, throughput) and its
    per-response numbers."""
    kept = [m for micros in scored.minis for m in micros if m.weight]
    mask = all_ranks(m.batch.mask for m in kept)
    mismatch = mismatch_metrics(all_ranks(m.old_logp for m in kept), all_ranks(m.rollout_logp for m in kept), mask)
    corrected = correction_metrics(config.train_worker_cfg.loss_cfg.rollout_correction, kept, mask)
    rollouts, timings = scored.rollouts, scored.timings
    tokens = sum(row["prompt_len"] + row["response_len"] for row in rollouts)
    busy = timings["time/train/forward_backward"] + timings["time/train/optimizer"]
    metrics.update(mismatch | corrected | scored.extra | timings)
    if config.teacher_config is not None:
        metrics.update(distillation_metrics(kept))
    metrics.update({"train/advantages/abs_mean": scored.advantages.abs().mean().item(), "train/tokens": tokens})
    metrics["train/world_size"] = distributed.world_size()
    metrics["perf/train_tokens_per_s"] = tokens / busy
    numbers = per_response_numbers(config, scored.rewards, scored.kl, scored.advantages, kept, len(rollouts))
    for row, rollout in zip(numbers, rollouts, strict=True):
        row["staleness"] = staleness(rollout)
    return metrics, numbers


def utilisation(config: RLTrainerConfig, scored: Scored, trainer, peak: float | None) -> dict:
    """``perf/mfu/forward_backward`` and, when the update scores the batch without gradients first (old
    log-probs, the KL reference's), ``perf/mfu/old_logprob``: the model FLOPs of the update's real
    tokens (rlx.training.flops: PaLM's count, no padding, no repeats that only keep ranks in step) over
    what every rank's device, at ``peak`` FLOP/s, could do in this rank's time. None without a peak
    (training not in bf16, or a device whose bf16 peak is unknown: a CPU)."""
    if peak is None:
        return {}
    rows = [scored.rollouts[i] for micros in scored.minis for m in micros if m.weight for i in m.indices]
    sequences = [(row["prompt_len"] + row["response_len"], model_tokens(row)) for row in rows]
    passes = (not reuses_old_logprobs(config)) + needs_reference(config)
    shape, trained = trainer.model_shape, not trainer.lora
    done = [training_flops(shape, sequences, trained), passes * forward_flops(shape, sequences)]
    update, scoring = distributed.sum_across(torch.tensor(done, dtype=torch.float64)).tolist()
    devices, timings = distributed.world_size(), scored.timings
    metrics = {"perf/mfu/forward_backward": mfu(update, timings["time/train/forward_backward"], peak, devices)}
    if passes:
        metrics["perf/mfu/old_logprob"] = mfu(scoring, timings["time/train/old_logprob"], peak, devices)
    return metrics


def correction_metrics(correction, kept: list[Micro], mask: torch.Tensor) -> dict:
    """The weights rollout correction applied to every rank's response tokens (``mask``, gathered in
    the order of ``kept``), none when it is off: what the loss learnt from, where ``mismatch/*`` says
    only how far the two policies were apart."""
    if not correction.enabled:
        return {}
    caps = correction.mode in registry.names("correction", caps=True)
    weights = all_ranks(m.token_weights for m in kept)
    return weight_metrics(weights, mask, cap=correction.threshold_high if caps else None)


def shaped_rewards(config: RLTrainerConfig, minis, judged: list[dict], kl_coef: float):
    """The rewards the advantages are computed from: the judged ones, less ``kl_coef`` x the KL when
    ``use_kl_in_reward``; with the KL, its metrics and the coefficient for the next step (adapted to
    the KL seen under an adaptive controller, the same otherwise)."""
    estimator = config.advantage_estimator_config
    rewards = torch.tensor([row["reward"] for row in judged], dtype=torch.float32)
    if not estimator.use_kl_in_reward:
        return rewards, None, {}, kl_coef
    kl = kl_in_reward(config, minis, len(judged))
    extra = {"train/kl_in_reward": kl.mean().item(), "train/kl_in_reward_coef": kl_coef}
    ctrl, next_coef = estimator.kl_ctrl, kl_coef
    if ctrl.type == "adaptive":
        next_coef = adaptive_kl_coef(kl_coef, kl.mean().item(), ctrl.target_kl, ctrl.horizon, len(judged))
    return rewards - kl_coef * kl, kl, extra, next_coef


def attach_distillation(teaching, micros: list[Micro], advantages: torch.Tensor, rollouts, teachers) -> None:
    """Replace each micro-batch's advantages by per-token ones under on-policy distillation (rlx.algo.distill): the
    teacher's signal on the student's sampled tokens (the rollout engine's log-probs, those that sampled
    them) plus ``reward_coef`` x the reward's; a row no teacher scored keeps its reward's advantage."""
    for micro in micros:
        rows = [teachers[i] for i in micro.indices]
        taught = torch.tensor([row["teacher"] is not None for row in rows], dtype=micro.batch.mask.dtype)
        mask = micro.batch.mask * taught.unsqueeze(-1)
        values = [row["teacher_logprobs"] or [] for row in rows]
        teacher_logp = per_token(rollouts, values, micro.indices, micro.batch.mask)
        micro.distill = distill.reverse_kl_advantages(micro.rollout_logp, teacher_logp, mask, teaching.kl_coef)
        coef = torch.where(taught > 0, teaching.reward_coef, 1.0)
        micro.advantages = distill.mixed_advantages(advantages[micro.indices], micro.distill, micro.batch.mask, coef)


def distillation_metrics(kept: list[Micro]) -> dict:
    """How much of the update's advantage came from the teachers: ``distill/advantage_share``, the
    distillation part's share of the summed absolute per-token advantages (every rank's tokens)."""
    mask = all_ranks(m.batch.mask for m in kept) > 0
    taught = all_ranks(m.distill for m in kept)[mask]
    reward = (all_ranks(m.advantages.expand_as(m.batch.mask) for m in kept)[mask] - taught).abs()
    taught = taught.abs()
    return {
        "distill/advantage_share": (taught.sum() / (taught.sum() + reward.sum()).clamp(min=1e-12)).item(),
        "distill/advantage_abs_mean": taught.mean().item() if taught.numel() else 0.0,
    }


def attach_weights(correction, micros: list[Micro], advantages: torch.Tensor) -> None:
    """Give each micro-batch its advantages and, under rollout correction, its importance weights (those
    whose old log-probs come from the loss's own forward get them there: rlx.training.microbatch.micro_loss)."""
    for micro in micros:
        micro.advantages = advantages[micro.indices]
        if micro.old_logp is not None:
            micro.token_weights = correction_weights(correction, micro)


def apply_updates(config: RLTrainerConfig, step: int, minis, trainer, timings: dict) -> dict:
    """One optimizer step per mini-batch (a non-finite one skipped and counted); the update's metrics."""
    loss_cfg, sampling = config.train_worker_cfg.loss_cfg, config.dataflow_config.sample_params
    totals, updates = defaultdict(float), defaultdict(float)
    skipped, applied_tokens = 0, 0
    timings.update({"time/train/forward_backward": 0.0, "time/train/optimizer": 0.0})
    for number, micros in enumerate(minis, start=1):
        mini = defaultdict(float)
        with clock.part("update") as watch:
            for micro in micros:
                with timed(timings, "time/train/forward", config.debug):
                    loss, values = micro_loss(trainer, micro, loss_cfg, sampling, sampling.max_tokens)
                with timed(timings, "time/train/backward", config.debug):
                    trainer.backward(loss * distributed.world_size())  # DeepSpeed averages gradients over ranks
                for name, value in values.items():
                    mini[name] += value
        timings["time/train/forward_backward"] += watch.seconds
        with clock.part("update") as watch:
            update = trainer.optimizer_step(mini["loss"])
        timings["time/train/optimizer"] += watch.seconds
        log.debug("step %d, mini-batch %d of %d: %d micro-batches, loss %.4g, %s", step, number, len(minis),
                  len(micros), mini["loss"], update)  # fmt: skip
        in_a_row = trainer.state.get("nonfinite_in_a_row", 0) + 1 if update.pop("skipped") else 0
        trainer.state["nonfinite_in_a_row"] = in_a_row
        if in_a_row:
            skipped += 1
            check_nonfinite(config, step, number, mini["loss"], update["grad_norm"], in_a_row)
            continue
        applied_tokens += micros[0].mini_tokens
        for name, value in mini.items():
            totals[name] += value
        for name, value in update.items():
            updates[name] += value
    summed = distributed.sum_across(torch.tensor(list(totals.values()), dtype=torch.float64))
    totals = dict(zip(totals, summed.tolist(), strict=True))
    applied = len(minis) - skipped
    per_update = {"loss", "pg_loss", "entropy", "kl"}
    metrics = {
        f"train/{name}": value / (applied if name in per_update else max(1, applied_tokens))
        for name, value in totals.items()
    }
    metrics.update({f"train/{name}": value / max(1, applied) for name, value in updates.items()})
    metrics["train/skipped_updates"] = skipped
    return metrics


def per_response_numbers(config, rewards, kl, advantages, micros: list[Micro], count: int) -> list[dict]:
    """What the update used for each response, in rollout order: reward (after any KL penalty), the
    response's summed KL, its advantage, and the mean/min/max of its importance weights."""
    weights = torch.full((count, 3), float("nan"), dtype=torch.float64)
    for micro in (m for m in micros if m.token_weights is not None):
        mask = micro.batch.mask > 0
        for row, index in enumerate(micro.indices):
            values = micro.token_weights[row][mask[row]].double()
            if values.numel():
                weights[index] = torch.stack([values.mean(), values.min(), values.max()])
    weights = distributed.cat_across(weights.flatten()).view(-1, count, 3).nan_to_num(nan=float("inf")).amin(dim=0)
    source = "loss forward" if reuses_old_logprobs(config) else "no-grad pass"
    return [
        {
            "reward_used": float(rewards[i]),
            "kl": None if kl is None else float(kl[i]),
            "advantage": float(advantages[i]),
            "is_weight_mean": None if weights[i, 0].isinf() else float(weights[i, 0]),
            "is_weight_min": None if weights[i, 1].isinf() else float(weights[i, 1]),
            "is_weight_max": None if weights[i, 2].isinf() else float(weights[i, 2]),
            "old_logprob_source": source,
        }
        for i in range(count)
    ]


def check_nonfinite(config: RLTrainerConfig, step: int, number: int, loss: float, norm: float, in_a_row: int) -> None:
    """Warn about a skipped optimizer step; stop the run once ``max_consecutive_nonfinite`` were skipped
    in a row (before anything of this step is recorded, so a rerun starts again from the step before)."""
    limit = config.train_worker_cfg.max_consecutive_nonfinite
    log.warning(
        "step %d, mini-batch %d: loss %s, grad norm %s are not finite; the update was skipped (%d in a row, limit %d)",
        step, number, loss, norm, in_a_row, limit,
    )  # fmt: skip
    if in_a_row >= limit:
        raise UserError(
            f"train: {in_a_row} optimizer steps in a row had a non-finite loss or gradient norm (the last at step "
            f"{step}, mini-batch {number}: loss {loss}, grad norm {norm}), reaching "
            f"train_worker_cfg.max_consecutive_nonfinite={limit}; nothing of step {step} was recorded, step "
            f"{step - 1} is the last good one. Check the rewards (judge/errors) or lower "
            "train_worker_cfg.optim_cfg.lr, then rerun"
        )
