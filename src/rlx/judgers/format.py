"""A reward for following a required format, e.g. ``<think>...</think><answer>...</answer>``."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FormatJudger:
    pattern: str = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"
    correct_score: float = 1.0
    wrong_score: float = 0.0
    in_process = True

    def extract(self, response: str) -> str | None:
        return None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        matched = re.match(self.pattern, response, flags=re.DOTALL)
        return self.correct_score if matched else self.wrong_score
