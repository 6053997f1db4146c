"""A step's rollouts as mini- and micro-batches: ``optimizer_steps`` mini-batches, each packed into
micro-batches within the ``pack_max_length`` token budget and dealt to the ranks, carrying the
log-probs the loss compares against (old, rollout, reference), and each micro-batch's share of its
mini-batch loss. The train stage builds them once per update; replay builds the same ones again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.algo import kl as kl_estimators
from rlx.algo.correction import importance_weights
from rlx.algo.losses import aggregate, policy_loss
from rlx.config import LossConfig, RLTrainerConfig, RolloutCorrectionConfig, SampleParams
from rlx.training import distributed
from rlx.training.packing import micro_batches
from rlx.training.trainer import TokenBatch


@dataclass
class Micro:
    """One micro-batch with what the loss needs besides the live policy."""

    indices: list[int]
    batch: TokenBatch
    old_logp: torch.Tensor | None  # None until the loss's own forward, for a batch's only update
    rollout_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    share: float  # its samples / its mini-batch's samples
    mini_tokens: int  # loss tokens of its whole mini-batch, all ranks together
    weight: float  # 1, or 0 for a repeat that only keeps the ranks in step
    advantages: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    distill: torch.Tensor | None = None  # on-policy distillation's part of the advantages, per token


def micro_loss(trainer, micro: Micro, loss_cfg: LossConfig, sampling: SampleParams, norm_length: int):
    """The micro-batch's share of its mini-batch loss, and its metrics (scalars, zero for a repeat)."""
    logp, entropy = trainer.scored(micro.batch, sampling)
    if micro.old_logp is None:  # the batch's only update: the policy has not moved yet (see reuses_old_logprobs)
        micro.old_logp = logp.detach()
        micro.token_weights = correction_weights(loss_cfg.rollout_correction, micro)
    mask = micro.batch.mask
    options = {"global_tokens": micro.mini_tokens, "norm_length": norm_length}
    # token-mean divides by the mini-batch's token count itself; the per-sequence modes need weighting.
    scale = micro.weight * (1.0 if loss_cfg.loss_agg_mode == "token-mean" else micro.share)
    clip = loss_cfg.policy_loss_cfg
    pg_loss, metrics = policy_loss(
        logp,
        micro.old_logp,
        micro.advantages,
        mask,
        kind=clip.loss_type,
        cliprange_low=clip.cliprange_low,
        cliprange_high=clip.cliprange_high,
        clip_ratio_c=clip.clip_ratio_c,
        loss_agg_mode=loss_cfg.loss_agg_mode,
        token_weights=micro.token_weights,
        **options,
    )
    entropy_term = aggregate(entropy, mask, loss_cfg.loss_agg_mode, **options)
    loss = scale * (pg_loss - loss_cfg.entropy_coef * entropy_term)
    values = {"pg_loss": scale * pg_loss.item(), "entropy": scale * entropy_term.item()}
    if loss_cfg.use_kl_loss:
        kl_per_token = kl_estimators.estimate(logp, micro.ref_logp, loss_cfg.kl_loss_type)
        kl = aggregate(kl_per_token, mask, loss_cfg.loss_agg_mode, **options)
        loss = loss + scale * loss_cfg.kl_loss_coef * kl
        values["kl"] = scale * kl.item()
    values["loss"] = loss.item()
    tokens = micro.weight * micro.batch.num_tokens
    values.update({name: value.item() * tokens for name, value in metrics.items()})
    return loss, values


def rollout_logprobs(rollouts: list[dict], indices: list[int], like: torch.Tensor) -> torch.Tensor:
    """The rollout engine's log-probs laid out like the trainer's ``[B, T - 1]`` tensor."""
    return per_token(rollouts, [rollouts[i]["rollout_logprobs"] for i in indices], indices, like)


def per_token(rollouts: list[dict], values: list[list], indices: list[int], like: torch.Tensor) -> torch.Tensor:
    """Per response token ``values`` of the rollouts at ``indices`` (None at a tool's token: 0) laid out like
    the trainer's ``[B, T - 1]`` tensor."""
    out = torch.zeros_like(like)
    for row, (index, tokens) in enumerate(zip(indices, values, strict=True)):
        start = rollouts[index]["prompt_len"] - 1
        out[row, start : start + len(tokens)] = torch.tensor([0.0 if v is None else v for v in tokens])
    return out


def model_tokens(row: dict) -> int:
    """Response tokens the model generated: all of them, but an agent's tool tokens (``response_mask`` 0)."""
    return sum(row["response_mask"]) if row.get("response_mask") is not None else row["response_len"]


def trained_tokens(row: dict, loss_cfg: LossConfig) -> int:
    """Response tokens of a rollout that enter the loss (none for a truncated one under ``mask_truncated``)."""
    return 0 if loss_cfg.mask_truncated and row["finish_reason"] == "length" else model_tokens(row)


def reuses_old_logprobs(config: RLTrainerConfig) -> bool:
    """With one optimizer step per batch, the old log-probs are the live ones detached, so the loss's
    forward gives them and the separate no-grad pass is skipped (as verl and TRL do; the rollout
    correction's weights are then made from them there) -- unless the advantages need them first (KL in
    the reward)."""
    worker = config.train_worker_cfg
    return worker.optimizer_steps == 1 and not config.advantage_estimator_config.use_kl_in_reward


def needs_reference(config: RLTrainerConfig) -> bool:
    """Whether the update scores the batch with the KL reference too (a KL loss, or KL in the reward)."""
    return config.train_worker_cfg.loss_cfg.use_kl_loss or config.advantage_estimator_config.use_kl_in_reward


def correction_weights(correction: RolloutCorrectionConfig, micro: Micro) -> torch.Tensor | None:
    """The micro-batch's importance weights under rollout correction (rlx.algo.correction), or None."""
    if not correction.enabled:
        return None
    return importance_weights(
        micro.old_logp,
        micro.rollout_logp,
        micro.batch.mask,
        level=correction.level,
        mode=correction.mode,
        threshold_high=correction.threshold_high,
        threshold_low=correction.threshold_low,
    )


def prepare_micro_batches(config: RLTrainerConfig, rollouts: list[dict], trainer, engines) -> list[list[Micro]]:
    """This rank's micro-batches of each mini-batch, with the old (unless reused) and reference
    log-probs computed before any update, and each mini-batch's token count over all ranks."""
    worker, loss_cfg = config.train_worker_cfg, config.train_worker_cfg.loss_cfg
    sampling = config.dataflow_config.sample_params  # the distribution rollouts sampled from
    scores_reference = needs_reference(config)
    lengths = [row["prompt_len"] + row["response_len"] for row in rollouts]
    ranks, me = distributed.world_size(), distributed.rank()
    minis = []
    for mini in torch.arange(len(rollouts)).chunk(worker.optimizer_steps):
        mini = mini.tolist()
        everyone = micro_batches(mini, lengths, worker.pack_max_length)
        mine = distributed.deal(everyone, ranks, me)
        tokens = max(1, sum(trained_tokens(rollouts[i], loss_cfg) for i in mini))
        micros = []
        for position, indices in enumerate(mine):
            batch = TokenBatch.from_ids(
                [rollouts[i]["prompt_ids"] for i in indices],
                [rollouts[i]["response_ids"] for i in indices],
                engines.tokenizer.pad_token_id,
                [rollouts[i].get("response_mask") for i in indices],
            )
            if loss_cfg.mask_truncated:
                kept = torch.tensor([rollouts[i]["finish_reason"] != "length" for i in indices], dtype=batch.mask.dtype)
                batch.mask = batch.mask * kept.unsqueeze(-1)
            old = None if reuses_old_logprobs(config) else trainer.logprobs(batch, sampling)
            ref = trainer.reference_logprobs(batch, sampling, lambda: engines.reference) if scores_reference else None
            rollout = rollout_logprobs(rollouts, indices, batch.mask)
            padding = position * ranks + me >= len(everyone)  # a repeat that only keeps the ranks in step
            micros.append(
                Micro(indices, batch, old, rollout, ref, len(indices) / len(mini), tokens, 0.0 if padding else 1.0)
            )
        minis.append(micros)
    return minis


def kl_in_reward(config: RLTrainerConfig, minis: list[list[Micro]], count: int) -> torch.Tensor:
    """Each response's summed KL to the reference (``kl_penalty`` estimator), in rollout order."""
    kind = config.advantage_estimator_config.kl_penalty
    kl = torch.zeros(count)
    for micro in (m for micros in minis for m in micros if m.weight):
        per_token = kl_estimators.estimate(micro.old_logp, micro.ref_logp, kind) * micro.batch.mask
        kl[micro.indices] = per_token.sum(dim=-1)
    return distributed.sum_across(kl)


def all_ranks(tensors) -> torch.Tensor:
    """These tensors of every rank, flattened into one (a rank may hold none: it only kept in step)."""
    return distributed.cat_across(torch.cat([tensor.flatten() for tensor in tensors] or [torch.zeros(0)]))


def response_mask(rollouts: list[dict]) -> torch.Tensor:
    """``[batch, longest response]``: 1 at each token the model generated, for the advantages' length terms."""
    if all(row.get("response_mask") is None for row in rollouts):
        lengths = torch.tensor([row["response_len"] for row in rollouts])
        return (torch.arange(int(lengths.max().clamp(min=1))) < lengths.unsqueeze(-1)).float()
    width = max(1, max(row["response_len"] for row in rollouts))
    mask = torch.zeros(len(rollouts), width)
    for index, row in enumerate(rollouts):
        scored = row.get("response_mask") or [1] * row["response_len"]
        mask[index, : row["response_len"]] = torch.tensor(scored, dtype=mask.dtype)
    return mask
