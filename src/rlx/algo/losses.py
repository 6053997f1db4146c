"""Policy-gradient surrogates and how per-token losses are reduced to one number.

Token tensors are ``[batch, response_len]`` with a 0/1 ``mask`` of valid response tokens. A new
surrogate is one function ``(logp, old_logp, advantages, mask, clip) -> Surrogate`` under
``@register("policy_loss", NAME)``; a new reduction one function ``(per_token_loss, mask, **options)``
under ``@register("loss_agg", NAME)``. The config accepts NAME from then on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.algo.registry import get, register

LOG_RATIO_CLAMP = 20.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


# ---- loss aggregation ------------------------------------------------------------------------


@register("loss_agg", "token-mean")
def token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, global_tokens=None, **_) -> torch.Tensor:
    """Sum over all valid tokens / ``global_tokens`` (default: this batch's count). Passing the step's
    total token count makes micro-batches add up to the full-batch mean (DAPO, Yu et al., 2025)."""
    return (per_token_loss * mask).sum() / (global_tokens or mask.sum().clamp(min=1))


@register("loss_agg", "seq-mean-token-mean")
def seq_mean_token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, **_) -> torch.Tensor:
    """Mean over each response, then over responses (the original GRPO)."""
    return ((per_token_loss * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()


@register("loss_agg", "seq-mean-token-sum")
def seq_mean_token_sum(per_token_loss: torch.Tensor, mask: torch.Tensor, **_) -> torch.Tensor:
    """Sum over each response, then mean over responses."""
    return (per_token_loss * mask).sum(dim=-1).mean()


@register("loss_agg", "seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(per_token_loss: torch.Tensor, mask: torch.Tensor, norm_length=None, **_) -> torch.Tensor:
    """Total sum / (responses x ``norm_length``), Dr. GRPO's constant normaliser (Liu et al., 2025),
    by default the response length budget."""
    norm_length = norm_length or per_token_loss.shape[-1]
    return (per_token_loss * mask).sum() / (per_token_loss.shape[0] * norm_length)


def aggregate(per_token_loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", **options) -> torch.Tensor:
    """Reduce a per-token loss to a scalar by ``loss_agg_mode`` (options: ``global_tokens``, ``norm_length``)."""
    return get("loss_agg", mode)(per_token_loss, mask.to(per_token_loss.dtype), **options)


# ---- policy losses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    """Clip settings: the ratio's bounds ``[1 - low, 1 + high]`` and the dual-clip bound ``dual``."""

    low: float = 0.2
    high: float = 0.2
    dual: float = 3.0


@dataclass
class Surrogate:
    """A policy loss per token, the token log-ratio, and where each clip acted (bool per token): at
    ``1 - low`` (``clipped_low``), at ``1 + high`` (``clipped_high``), at the dual bound (``clipped_dual``)."""

    loss: torch.Tensor
    log_ratio: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    clipped_dual: torch.Tensor


@register("policy_loss", "vanilla")
def vanilla(logp, old_logp, advantages, mask, clip: Clip) -> Surrogate:
    """PPO's clipped surrogate (Schulman et al., 2017) per token, with asymmetric bounds (clip-higher,
    DAPO, arXiv 2503.14476) and the dual clip ``-A * dual`` capping the loss of negative advantages
    (Ye et al., 2020, arXiv 1912.09729). A clip acts where it takes the token's gradient away: the
    upper bound for ``A > 0``, the lower bound and the dual bound for ``A < 0``."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip.low, 1 + clip.high))
    loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip.dual), loss)
    negative = advantages < 0
    return Surrogate(
        loss,
        log_ratio,
        negative & (ratio < 1 - clip.low),
        (advantages > 0) & (ratio > 1 + clip.high),
        negative & (ratio > clip.dual),
    )


@register("policy_loss", "gspo")
def gspo(logp, old_logp, advantages, mask, clip: Clip) -> Surrogate:
    """GSPO (Zheng et al., 2025, arXiv 2507.18071): one length-normalised ratio per sequence,
    ``s_i = exp(mean_t(logp - old_logp))``, clipped like PPO; the token-level form
    ``s_i * pi(y_t) / sg(pi(y_t))`` keeps a per-token gradient of the same value. No dual clip."""
    token_log_ratio = logp - old_logp
    seq_log_ratio = (token_log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    log_ratio = (logp - logp.detach() + seq_log_ratio.detach()).clamp(max=LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip.low, 1 + clip.high))
    value = ratio.detach()
    return Surrogate(
        loss,
        token_log_ratio,
        (advantages < 0) & (value < 1 - clip.low),
        (advantages > 0) & (value > 1 + clip.high),
        torch.zeros_like(mask, dtype=torch.bool),
    )


@register("policy_loss", "cispo")
def cispo(logp, old_logp, advantages, mask, clip: Clip) -> Surrogate:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE with a clipped, stop-gradient importance weight,
    ``-sg(clip(r, 1 - low, 1 + high)) * A * logp``: no token is ever dropped from the gradient; a clip
    acts where it truncates the weight, whatever the advantage's sign. No dual clip."""
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1 - clip.low, 1 + clip.high).detach()
    return Surrogate(
        -weight * advantages * logp,
        log_ratio,
        ratio < 1 - clip.low,
        ratio > 1 + clip.high,
        torch.zeros_like(mask, dtype=torch.bool),
    )


def _ratio_metrics(surrogate: Surrogate, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token fractions where each clip acted (``clipfrac`` is any of them), and how far the ratio moved."""
    with torch.no_grad():
        low, high, dual = surrogate.clipped_low, surrogate.clipped_high, surrogate.clipped_dual
        return {
            "clipfrac": masked_mean((low | high | dual).to(mask.dtype), mask),
            "clipfrac_low": masked_mean(low.to(mask.dtype), mask),
            "clipfrac_high": masked_mean(high.to(mask.dtype), mask),
            "clipfrac_dual": masked_mean(dual.to(mask.dtype), mask),
            "approx_kl": masked_mean(-surrogate.log_ratio, mask),
            "ratio_mean": masked_mean(surrogate.log_ratio.exp(), mask),
        }


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
    """The policy-gradient loss registered as ``kind`` (``policy_loss_cfg.loss_type``), aggregated.

    ``advantages`` is ``[batch]`` (one per response) or ``[batch, response_len]``; ``token_weights``
    (detached, e.g. rollout-correction importance weights) scale each token's loss. Returns the loss
    and detached metrics ``clipfrac`` (``_low``, ``_high``, ``_dual``), ``approx_kl``, ``ratio_mean``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    mask = mask.to(logp.dtype)
    surrogate = get("policy_loss", kind)(
        logp, old_logp, advantages, mask, Clip(cliprange_low, cliprange_high, clip_ratio_c)
    )
    loss = surrogate.loss if token_weights is None else surrogate.loss * token_weights
    return aggregate(loss, mask, loss_agg_mode, **options), _ratio_metrics(surrogate, mask)
