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


def _ratio_metrics(log_ratio: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {
            "clipfrac": masked_mean(clipped.to(mask.dtype), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(log_ratio.exp(), mask),
        }


def vanilla(logp, old_logp, advantages, cliprange_low, cliprange_high, clip_ratio_c):
    """PPO's clipped surrogate (Schulman et al., 2017) per token, with asymmetric bounds (DAPO's
    clip-higher, Yu et al., 2025) and the dual clip ``clip_ratio_c`` for negative advantages (Ye et
    al., 2020). Returns (per-token loss, log-ratio, clipped mask)."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange_low, 1 + cliprange_high)
    loss = torch.maximum(unclipped, clipped)
    loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_ratio_c), loss)
    return loss, log_ratio, clipped > unclipped


def gspo(logp, old_logp, advantages, cliprange_low, cliprange_high, mask):
    """GSPO (Zheng et al., 2025): one length-normalised ratio per sequence,
    ``s_i = exp(mean_t(logp - old_logp))``, clipped like PPO; the token-level form
    ``s_i * pi(y_t) / sg(pi(y_t))`` keeps a per-token gradient of the same value."""
    token_log_ratio = logp - old_logp
    seq_log_ratio = (token_log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    log_ratio = (logp - logp.detach() + seq_log_ratio.detach()).clamp(max=LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - cliprange_low, 1 + cliprange_high)
    return torch.maximum(unclipped, clipped), token_log_ratio, clipped > unclipped


def cispo(logp, old_logp, advantages, cliprange_low, cliprange_high):
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight,
    ``-sg(clip(r, 1 - low, 1 + high)) * A * logp``: no token is ever dropped from the gradient."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - cliprange_low, 1 + cliprange_high).detach()
    return -weight * advantages * logp, log_ratio, (ratio < 1 - cliprange_low) | (ratio > 1 + cliprange_high)


POLICY_LOSSES = ("vanilla", "gspo", "cispo")


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
    token_weights: torch.Tensor | None = None,
    **options,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of ``kind`` (``vanilla``, ``gspo`` or ``cispo``), aggregated.

    ``advantages`` is ``[batch]`` (one per response) or ``[batch, response_len]``; ``token_weights``
    (detached, e.g. rollout-correction importance weights) scale each token's loss. Returns the loss
    and detached metrics ``clipfrac``, ``approx_kl``, ``ratio_mean``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    mask = mask.to(logp.dtype)
    if kind == "vanilla":
        loss, log_ratio, clipped = vanilla(logp, old_logp, advantages, cliprange_low, cliprange_high, clip_ratio_c)
    elif kind == "gspo":
        loss, log_ratio, clipped = gspo(logp, old_logp, advantages, cliprange_low, cliprange_high, mask)
    elif kind == "cispo":
        loss, log_ratio, clipped = cispo(logp, old_logp, advantages, cliprange_low, cliprange_high)
    else:
        raise ValueError(f"unknown policy loss {kind!r}; available: {', '.join(POLICY_LOSSES)}")
    if token_weights is not None:
        loss = loss * token_weights
    return aggregate(loss, mask, loss_agg_mode, **options), _ratio_metrics(log_ratio, clipped, mask)
