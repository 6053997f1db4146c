"""Rollout/train mismatch: the rollout engine's log-probs differ from the trainer's for the same
policy (other kernels, precision, batching), which makes the update silently off-policy.

Importance weights ``w = pi_train / pi_rollout`` correct for it (Yao et al., 2025, "Your efficient RL
framework secretly brings you off-policy RL training"): per token, or per sequence as the product
over its tokens; ``truncate`` caps them at ``threshold_high`` (TIS), ``mask`` drops tokens or
sequences whose weight leaves ``[threshold_low, threshold_high]`` (masked IS).
"""

from __future__ import annotations

import torch

from rlx.algo.kl import estimate
from rlx.algo.losses import LOG_RATIO_CLAMP, masked_mean


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
    """Detached per-token weights ``[batch, response_len]`` (1 outside the mask is harmless: the loss masks)."""
    log_w = (train_logp - rollout_logp).detach() * mask
    if level == "sequence":
        log_w = log_w.sum(dim=-1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"unknown correction level {level!r}: token or sequence")
    weights = log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    if mode == "truncate":
        return weights.clamp(max=threshold_high)
    if mode == "mask":
        return ((weights >= threshold_low) & (weights <= threshold_high)).to(weights.dtype)
    raise ValueError(f"unknown correction mode {mode!r}: truncate or mask")


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
