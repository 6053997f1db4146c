"""Advantage estimators: one advantage per response, from outcome rewards.

Rewards are ordered group by group, ``[num_groups * group_size]``; ``mask`` (``[batch, response_len]``,
0/1) gives response lengths where an estimator needs them. Every estimator returns ``[batch]``; the
loss broadcasts it over the response's tokens. A group whose rewards are all equal carries no
signal and gets exactly 0 from every group estimator.

A new estimator is one function here under ``@register("advantage", NAME)`` (``groups=True`` if it
compares responses within a group); ``advantage_estimator_config.type`` accepts NAME from then on.
"""

from __future__ import annotations

import math

import torch

from rlx.algo.registry import get, register


def _groups(rewards: torch.Tensor, group_size: int, name: str) -> torch.Tensor:
    if group_size < 2:
        raise ValueError(f"{name} compares responses within a group: group_size must be at least 2, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)


def _zero_where_flat(groups: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Exactly 0 for groups whose rewards are all equal (no rounding residue)."""
    flat = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(advantages), advantages).flatten()


def _lengths(mask: torch.Tensor | None, name: str) -> torch.Tensor:
    if mask is None:
        raise ValueError(f"{name} needs the response mask")
    return mask.float().sum(dim=-1)


@register("advantage", "grpo", groups=True)
def grpo(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, **_) -> torch.Tensor:
    """Group z-score, GRPO (Shao et al., 2024, DeepSeekMath): ``(r - mean_g) / (std_g + eps)``, with
    the Bessel-corrected std (as verl and TRL use)."""
    groups = _groups(rewards, group_size, "grpo")
    centred = groups - groups.mean(dim=1, keepdim=True)
    return _zero_where_flat(groups, centred / (groups.std(dim=1, keepdim=True) + eps))


@register("advantage", "dr_grpo", groups=True)
def dr_grpo(rewards: torch.Tensor, group_size: int, **_) -> torch.Tensor:
    """GRPO without the std division, Dr. GRPO (Liu et al., 2025): ``r - mean_g``."""
    groups = _groups(rewards, group_size, "dr_grpo")
    return _zero_where_flat(groups, groups - groups.mean(dim=1, keepdim=True))


@register("advantage", "rloo", groups=True)
def rloo(rewards: torch.Tensor, group_size: int, **_) -> torch.Tensor:
    """Leave-one-out baseline, RLOO (Ahmadian et al., 2024): ``r_i - mean_{j != i} r_j``,
    which equals ``G / (G - 1) * (r_i - mean_g)``."""
    groups = _groups(rewards, group_size, "rloo")
    others = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return _zero_where_flat(groups, groups - others)


def _whiten(values: torch.Tensor, lengths: torch.Tensor, eps: float) -> torch.Tensor:
    """Whiten per-response values over all valid tokens of the batch (each response weighs its length),
    with the unbiased variance over tokens."""
    tokens = lengths.sum()
    mean = (values * lengths).sum() / tokens.clamp(min=1)
    var = (lengths * (values - mean) ** 2).sum() / (tokens - 1).clamp(min=1)
    return (values - mean) / (var.sqrt() + eps)


@register("advantage", "reinforce_plus_plus")
def reinforce_plus_plus(
    rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None, eps: float = 1e-6, **_
) -> torch.Tensor:
    """REINFORCE++ (Hu, 2025): the outcome reward as return, whitened over the batch's valid tokens."""
    return _whiten(rewards.float(), _lengths(mask, "reinforce_plus_plus"), eps)


@register("advantage", "reinforce_plus_plus_baseline", groups=True)
def reinforce_plus_plus_baseline(
    rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None, eps: float = 1e-6, **_
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu, 2025): subtract the group mean, then whiten over the batch's tokens.
    Zero-variance groups stay exactly 0."""
    groups = _groups(rewards, group_size, "reinforce_plus_plus_baseline")
    centred = _zero_where_flat(groups, groups - groups.mean(dim=1, keepdim=True))
    whitened = _whiten(centred, _lengths(mask, "reinforce_plus_plus_baseline"), eps)
    return torch.where(centred == 0, torch.zeros_like(whitened), whitened)


@register("advantage", "opo", groups=True)
def opo(rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None, **_) -> torch.Tensor:
    """Length-weighted group baseline, OPO (Hao et al., 2025): ``r_i - sum_j L_j r_j / sum_j L_j``."""
    groups = _groups(rewards, group_size, "opo")
    lengths = _lengths(mask, "opo").view_as(groups)
    baseline = (lengths * groups).sum(dim=1, keepdim=True) / lengths.sum(dim=1, keepdim=True).clamp(min=1)
    return _zero_where_flat(groups, groups - baseline)


@register("advantage", "pass_at_k", groups=True)
def pass_at_k(rewards: torch.Tensor, group_size: int, k: int = 4, **_) -> torch.Tensor:
    """Pass@k training's analytic advantage (Chen et al., 2025), for 0/1 rewards (> 0 counts as correct).

    With ``n`` responses of which ``n_neg`` are wrong, the group's pass@k is
    ``R = 1 - C(n_neg, k) / C(n, k)`` and ``sigma = sqrt(R (1 - R))``; a correct response gets
    ``(1 - R) / sigma`` and a wrong one ``(1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / sigma``.
    """
    groups = _groups(rewards, group_size, "pass_at_k")
    if not 1 <= k <= group_size:
        raise ValueError(f"pass_at_k needs 1 <= k <= group_size ({group_size}), got k={k}")
    out = torch.zeros_like(groups)
    for row, group in enumerate(groups):
        negatives = int((group <= 0).sum())
        pass_k = 1 - math.comb(negatives, k) / math.comb(group_size, k)
        sigma = math.sqrt(pass_k * (1 - pass_k))
        if sigma == 0:
            continue
        wrong = (1 - pass_k - math.comb(negatives - 1, k - 1) / math.comb(group_size - 1, k - 1)) / sigma
        out[row] = torch.where(group > 0, torch.tensor((1 - pass_k) / sigma), torch.tensor(wrong))
    return out.flatten()


def compute(
    name: str, rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None, **options
) -> torch.Tensor:
    """Advantages by estimator name (``advantage_estimator_config.type``)."""
    return get("advantage", name)(rewards, group_size, mask=mask, **options)
