"""What a rollout engine returns for one response, whatever the backend."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


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
