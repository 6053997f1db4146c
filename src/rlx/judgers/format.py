"""A reward for following a required format, e.g. ``<think>...</think><answer>...</answer>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlx.errors import UserError


@dataclass(frozen=True)
class FormatJudger:
    pattern: str = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"
    correct_score: float = 1.0
    wrong_score: float = 0.0
    in_process = True

    def __post_init__(self) -> None:
        """Compile the pattern now: a wrong one would otherwise make every response a judger error."""
        try:
            re.compile(self.pattern, flags=re.DOTALL)
        except (re.error, TypeError) as exc:
            raise UserError(f"judger 'format': pattern {self.pattern!r} is not a regular expression ({exc})") from None

    def extract(self, response: str) -> str | None:
        return None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        matched = re.match(self.pattern, response, flags=re.DOTALL)
        return self.correct_score if matched else self.wrong_score
