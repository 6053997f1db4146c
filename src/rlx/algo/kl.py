"""KL estimators between the policy and a reference, per token (Schulman, "Approximating KL
divergence", 2020). With ``log_ratio = logp - ref_logp`` sampled from the policy:

- ``k1 = log_ratio`` (unbiased, high variance, can be negative)
- ``k2 = log_ratio**2 / 2``
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (unbiased, non-negative, low variance)
- ``abs = |log_ratio|``
"""

from __future__ import annotations

import torch

K3_CLAMP = 10.0


def estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        # Clamped so one token whose probabilities collapsed cannot blow the loss up (as verl does).
        negative = (-log_ratio).clamp(-20.0, 20.0)
        return (negative.exp() - 1 - negative).clamp(-K3_CLAMP, K3_CLAMP)
    if kind == "abs":
        return log_ratio.abs()
    raise ValueError(f"unknown KL estimator {kind!r}; available: k1, k2, k3, abs")


def adaptive_kl_coef(coef: float, observed_kl: float, target_kl: float, horizon: int, batch_size: int) -> float:
    """The adaptive KL controller of Ziegler et al. (2019): move the coefficient towards the value
    that keeps the observed KL at ``target_kl``, by at most 20 % per ``horizon`` samples."""
    error = max(-0.2, min(0.2, observed_kl / target_kl - 1))
    return coef * (1 + error * batch_size / horizon)
