"""Reward shaping that depends on the response, not on its correctness."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al., 2025): 0 up to ``max_tokens - buffer``, then a
    linear ramp to ``-factor`` at ``max_tokens`` (and beyond)."""
    start = max_tokens - buffer
    ramp = (start - lengths.float()) / max(buffer, 1)
    return factor * torch.where(lengths <= start, torch.zeros_like(ramp), ramp.clamp(min=-1.0))
