"""Policy-gradient surrogates and how per-token losses are reduced to one number.

Token tensors are ``[batch, response_len]`` with a 0/1 ``mask`` of valid response tokens.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", **options) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    - ``token-mean``: sum over all valid tokens / ``global_tokens`` (default: this batch's count). Passing
      the step's total token count makes micro-batches add up to the full-batch mean (DAPO, Yu et al. 2025).
    - ``seq-mean-token-mean``: mean over each response, then over responses (the original GRPO).
    - ``seq-mean-token-sum``: sum over each response, then mean over responses.
    - ``seq-mean-token-sum-norm``: total sum / (responses x ``norm_length``), Dr.GRPO's constant
      normaliser (Liu et al., 2025), default the response length budget.
    """
    mask = mask.to(per_token_loss.dtype)
    if mode == "token-mean":
        global_tokens = options.get("global_tokens") or mask.sum().clamp(min=1)
        return (per_token_loss * mask).sum() / global_tokens
    per_sequence_sum = (per_token_loss * mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        return (per_sequence_sum / mask.sum(dim=-1).clamp(min=1)).mean()
    if mode == "seq-mean-token-sum":
        return per_sequence_sum.mean()
    if mode == "seq-mean-token-sum-norm":
        norm_length = options.get("norm_length") or per_token_loss.shape[-1]
        return per_sequence_sum.sum() / (per_token_loss.shape[0] * norm_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "vanilla",
    cliprange_low: float = 0.2,
    cliprange_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    **options,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al., 2017) with asymmetric clip (DAPO's clip-higher) and
    dual clip for negative advantages (Ye et al., 2020, bound ``clip_ratio_c``).

    ``advantages`` is ``[batch]`` (one per response) or ``[batch, response_len]``.
    Returns the aggregated loss and detached metrics ``clipfrac``, ``approx_kl``, ``ratio_mean``.
    """
    if kind != "vanilla":
        raise ValueError(f"unknown policy loss {kind!r}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange_low, 1 + cliprange_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.minimum(loss, -advantages * clip_ratio_c)
    loss = torch.where(advantages < 0, dual, loss)
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((clipped > unclipped).to(logp.dtype), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return aggregate(loss, mask, loss_agg_mode, **options), metrics
