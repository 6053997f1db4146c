"""What a rollout engine returns for one response, whatever the backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal


def row_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """Each row's sampling seed: ``seed + i`` for row ``i`` of a batch, or ``seed[i]`` when the caller
    gives every row its own (an agent loop's later turns, rlx.agents.loop)."""
    if isinstance(seed, int):
        return list(range(seed, seed + count))
    if len(seed) != count:
        raise ValueError(f"{len(seed)} seeds for {count} prompts")
    return list(seed)


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]

    def cut_at_stop_strings(self, stops: list[str]) -> Generation:
        """Drop a matched stop string and what follows it from the text (the ids stay as sampled)."""
        cuts = [self.text.find(stop) for stop in stops if stop in self.text]
        return replace(self, text=self.text[: min(cuts)]) if cuts else self
