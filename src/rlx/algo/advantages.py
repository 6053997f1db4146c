"""Advantage estimators. Rewards are ordered group by group: ``[num_groups * group_size]``.

Every estimator returns one advantage per response (broadcast over its tokens by the caller).
"""

from __future__ import annotations

import torch


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)


def grpo(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group z-score, GRPO (Shao et al., 2024, DeepSeekMath): ``(r - mean_g) / (std_g + eps)``.

    The std is Bessel-corrected (as in verl and TRL). A group whose rewards are all equal carries no
    signal and gets advantage exactly 0.
    """
    if group_size < 2:
        raise ValueError("grpo compares responses within a group: group_size must be at least 2")
    groups = _groups(rewards, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    scaled = centred / (groups.std(dim=1, keepdim=True) + eps)
    return torch.where(centred == 0, torch.zeros_like(scaled), scaled).flatten()


ESTIMATORS = {"grpo": grpo}


def compute(name: str, rewards: torch.Tensor, group_size: int, mask: torch.Tensor | None = None, **options):
    """Dispatch by name (``advantage_estimator_config.type``)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; available: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name](rewards, group_size, **options)
