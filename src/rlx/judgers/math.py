"""Competition math answers (MATH, MATH-500): the last ``\\boxed{...}`` (nested braces handled), or a
configured answer pattern, checked for symbolic equivalence with the ``math-verify`` library
(fractions, radicals, intervals, sets, LaTeX forms), as the Open R1 / TRL accuracy reward does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    opening = text.find("{", start)
    if opening < 0:
        return None
    depth = 0
    for position in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[opening + 1 : position]
    return None


@dataclass(frozen=True)
class MathJudger:
    answer_pattern: str | None = None  # a regex whose first group is the answer, instead of \boxed{}
    tail_chars: int = 4000
    correct_score: float = 1.0
    wrong_score: float = 0.0
    in_process = False  # sympy can take long: score in worker processes, under the time limit

    def extract(self, response: str) -> str | None:
        tail = response[-self.tail_chars :]
        if self.answer_pattern:
            found = re.findall(self.answer_pattern, tail)
            return found[-1] if found else None
        return last_boxed(tail)

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        from math_verify import parse, verify

        answer = self.extract(response)
        if answer is None:
            return self.wrong_score
        gold_parsed = parse(f"${gold}$")
        answer_parsed = parse(f"${answer}$")
        correct = bool(gold_parsed) and bool(answer_parsed) and verify(gold_parsed, answer_parsed)
        return self.correct_score if correct else self.wrong_score
