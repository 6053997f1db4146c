"""Off-policy correction: the tokens the loss learns from were sampled by the rollout engine's
policy ``pi_rollout`` (the behaviour policy), not by ``pi_train``, the policy the update starts from
(its log-probs recomputed by the trainer as the old log-probs). The two differ even for the same
weights (other kernels, precision, batching), and more when rollouts come from an older policy than
the trainer's (asynchronous rollout); left alone, the update is silently off-policy.

Importance weights ``w = pi_train / pi_rollout`` correct for it (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training"): per token, or per sequence as the product
over its tokens. A mode maps the detached log-weight to the weights that scale each token's loss; a
new mode is one function ``(log_w, *, threshold_high, threshold_low) -> weights`` under
``@register("correction", NAME)``, which the config then accepts as ``rollout_correction.mode``;
its traits: ``caps`` (weights stop at ``threshold_high``, counted in ``correction/truncated_frac``),
``lower_bound`` (it reads ``threshold_low``, which the config refuses for the other modes).
"""

from __future__ import annotations

import torch

from rlx.algo.kl import estimate
from rlx.algo.losses import LOG_RATIO_CLAMP, masked_mean
from rlx.algo.registry import get, register


@register("correction", "truncate", caps=True)
def truncate(log_w: torch.Tensor, *, threshold_high: float, **_) -> torch.Tensor:
    """Truncated IS (TIS, Yao et al.): ``min(w, threshold_high)`` bounds the variance one rare token
    can add, and keeps every token in the loss."""
    return log_w.exp().clamp(max=threshold_high)


@register("correction", "mask", lower_bound=True)
def masked(log_w: torch.Tensor, *, threshold_high: float, threshold_low: float, **_) -> torch.Tensor:
    """Masked IS (Yao et al.): weight 1 inside ``[threshold_low, threshold_high]``, 0 outside: a token
    the two policies disagree on that much is dropped rather than reweighted."""
    weights = log_w.exp()
    return ((weights >= threshold_low) & (weights <= threshold_high)).to(weights.dtype)


@register("correction", "decoupled")
def decoupled(log_w: torch.Tensor, *, threshold_high: float, **_) -> torch.Tensor:
    """Decoupled PPO (Hilton et al., 2021, "Batch size-invariance for policy optimization", arXiv
    2110.00641), the objective AReaL trains on rollouts of stale policies with (Fu et al., 2025,
    "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", arXiv
    2505.24298). It separates the policy that sampled (behaviour) from the one the update must stay
    near (proximal, here ``pi_train``, the old log-probs)::

        J(theta) = E_{y ~ pi_behav} [ sum_t w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) ]
        r_t = pi_theta(y_t) / pi_prox(y_t)   (the loss's own ratio and clip)
        w_t = pi_prox(y_t) / pi_behav(y_t)   (this weight, detached)

    so the clip bounds how far one update moves the policy however stale the rollout was, and ``w``
    reweights each token as if ``pi_prox`` had sampled it. A token with ``w > threshold_high`` (AReaL's
    ``behav_imp_weight_cap``) gets weight 0: it is dropped, not truncated. There is no lower bound.
    Dropped tokens still count in the loss's token denominator, as in AReaL."""
    weights = log_w.exp()
    return torch.where(weights <= threshold_high, weights, torch.zeros_like(weights))


def importance_weights(
    train_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    threshold_high: float = 2.0,
    threshold_low: float = 0.5,
) -> torch.Tensor:
    """Detached per-token weights ``[batch, response_len]`` of the correction ``mode`` (1 outside the
    mask is harmless: the loss masks)."""
    log_w = (train_logp - rollout_logp).detach() * mask
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"unknown correction level {level!r}: token or sequence")
    log_w = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return get("correction", mode)(log_w, threshold_high=threshold_high, threshold_low=threshold_low)


def weight_metrics(weights: torch.Tensor, mask: torch.Tensor, *, cap: float | None = None) -> dict[str, float]:
    """What the correction did to the loss, over the response tokens: the weights' mean and max, the
    fraction dropped (weight 0) and, for a mode that caps at ``cap``, the fraction held at the cap."""
    with torch.no_grad():
        applied = weights[mask > 0]
        count = max(1, applied.numel())
        metrics = {
            "correction/weight_mean": applied.sum().item() / count,
            "correction/weight_max": applied.max().item() if applied.numel() else 1.0,
            "correction/dropped_frac": (applied == 0).sum().item() / count,
        }
        if cap is not None:  # compared in the weights' own dtype, in which the cap is exact
            metrics["correction/truncated_frac"] = (applied >= cap).sum().item() / count
        return metrics


def mismatch_metrics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout engine's distribution is from the trainer's, logged whether or not corrected."""
    with torch.no_grad():
        ratio = (train_logp - rollout_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
        valid = mask > 0
        return {
            "mismatch/k3_kl": masked_mean(estimate(rollout_logp, train_logp, "k3"), mask).item(),
            "mismatch/abs_logprob_diff": masked_mean((train_logp - rollout_logp).abs(), mask).item(),
            "mismatch/is_weight_mean": masked_mean(ratio, mask).item(),
            "mismatch/is_weight_max": ratio[valid].max().item() if valid.any() else 1.0,
        }
