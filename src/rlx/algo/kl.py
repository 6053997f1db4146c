"""KL estimators between the policy and a reference, per token (Schulman, "Approximating KL
divergence", 2020), each a function of ``log_ratio = logp - ref_logp`` sampled from the policy:

- ``k1 = log_ratio`` (unbiased, high variance, can be negative)
- ``k2 = log_ratio**2 / 2``
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (unbiased, non-negative, low variance)
- ``abs = |log_ratio|``

A new estimator is one function under ``@register("kl", NAME)``.
"""

from __future__ import annotations

import torch

from rlx.algo.registry import get, register

K3_CLAMP = 10.0


@register("kl", "k1")
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


@register("kl", "k2")
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


@register("kl", "k3")
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # Clamped so one token whose probabilities collapsed cannot blow the loss up (as verl does).
    negative = (-log_ratio).clamp(-20.0, 20.0)
    return (negative.exp() - 1 - negative).clamp(-K3_CLAMP, K3_CLAMP)


@register("kl", "abs")
def absolute(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL by estimator name (``kl_loss_type``, ``kl_penalty``)."""
    return get("kl", kind)(logp - ref_logp)


def adaptive_kl_coef(coef: float, observed_kl: float, target_kl: float, horizon: int, batch_size: int) -> float:
    """The adaptive KL controller of Ziegler et al. (2019): move the coefficient towards the value
    that keeps the observed KL at ``target_kl``, by at most 20 % per ``horizon`` samples."""
    error = max(-0.2, min(0.2, observed_kl / target_kl - 1))
    return coef * (1 + error * batch_size / horizon)
