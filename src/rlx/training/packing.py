"""How samples are packed into micro-batches within a token budget (``pack_max_length``): for the update's
micro-batches and for a teacher scoring a step's responses alike."""

from __future__ import annotations


def micro_batches(indices: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive samples grouped so that count x longest length stays within the token budget
    (a single longer sample gets a micro-batch of its own)."""
    batches, current, longest = [], [], 0
    for index in indices:
        widest = max(longest, lengths[index])
        if current and widest * (len(current) + 1) > budget:
            batches.append(current)
            current, widest = [], lengths[index]
        current.append(index)
        longest = widest
    return [*batches, current] if current else batches
