"""Numeric final answers, GSM8K style (the semantics of verl's and XTuner's GSM8K reward).

Strict mode reads the last ``#### <number>`` in the response's tail; flexible mode falls back to the
last number anywhere in the tail. Commas and ``$`` are stripped and values compared as numbers, so
``72.0`` equals ``72`` and ``1,600`` equals ``1600``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HASH_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def to_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("$", "").strip())
    except ValueError:
        return None


@dataclass(frozen=True)
class NumericAnswerJudger:
    strict: bool = False
    tail_chars: int = 300
    correct_score: float = 1.0
    wrong_score: float = 0.0
    in_process = True

    def extract(self, response: str) -> str | None:
        tail = response[-self.tail_chars :]
        found = _HASH_ANSWER.findall(tail)
        if not found and not self.strict:
            found = _NUMBER.findall(tail)
        return found[-1].replace(",", "") if found else None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        answer = self.extract(response)
        value, expected = (to_number(answer) if answer else None), to_number(str(gold))
        correct = value is not None and expected is not None and abs(value - expected) < 1e-9
        return self.correct_score if correct else self.wrong_score
