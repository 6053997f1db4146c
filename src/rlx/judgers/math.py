"""Competition math answers (MATH, MATH-500), judged by the ``math-verify`` library.

Two ways to read the response's answer (option ``extraction``):

- ``math_verify`` (the default): math-verify's own extraction, configured as its README recommends
  and its test suite runs it: LaTeX first (a ``\\boxed{}`` before anything else, then "final answer
  is ..." and "answer: ..." phrases, then the last math environment), then plain numbers and
  expressions. An answer scores however it is written, so MATH-500 figures compare with published ones.
- ``boxed``: only the last ``\\boxed{}`` counts, as in verl's MATH reward (``last_boxed_only_string``);
  an answer written anywhere else scores 0, so a training reward teaches the format.
  ``answer_pattern`` reads the last match of a regex instead of the last box.

Either way the answer is compared with the gold by ``math_verify.verify``, whose options
``float_rounding``, ``strict`` and ``allow_set_relation_comp`` are the judger's, with its defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from rlx.errors import UserError

EXTRACTIONS = ("math_verify", "boxed")

# A math environment, where math-verify's LaTeX extraction looks: $...$, \(...\), \[...\], \boxed{}.
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed\b")

# One number in the forms math-verify's expression extraction reads: a sign, digits and a decimal
# point or comma, or groups of three digits split by commas or spaces.
_NUMBER = re.compile(r"-?(?:\d+(?:[.,]\d+)?|\d{1,3}(?:[ ,]\d{3})+(?:\.\d+)?|\.\d+)")


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


@lru_cache(maxsize=256)
def read(text: str, latex_only: bool = False) -> tuple:
    """math-verify's ``parse`` with a box first (``boxed_match_priority=0``): the parsed answer, then
    the text it was read from; empty if nothing was found. Cached because the panel asks for the
    score and then for the extracted answer of the same response (and golds repeat)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse  # sympy: loaded when judging

    latex = LatexExtractionConfig(boxed_match_priority=0)
    return tuple(parse(text, [latex] if latex_only else [latex, ExprExtractionConfig()]))


def read_gold(gold: str) -> tuple:
    """The gold, parsed as math-verify's README says: LaTeX is read only inside a math environment, so
    a bare LaTeX gold (MATH's ``answer`` column: ``\\frac{14}{3}``) goes in ``$...$`` first, and a gold
    with its own environment or box is parsed as it is. A bare gold that is one number is also read as
    math-verify reads numbers, where a comma is a decimal or thousands separator (``1,22``), while in
    MATH's LaTeX it separates answers (``-2,1``): either reading counts."""
    if _DELIMITED.search(gold):
        return read(gold)
    as_latex = read(f"${gold}$")
    return as_latex + read(gold) if _NUMBER.fullmatch(gold.strip()) else as_latex


@dataclass(frozen=True)
class MathJudger:
    extraction: str = "math_verify"
    answer_pattern: str | None = None  # extraction "boxed": a regex whose one group is the answer
    float_rounding: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False
    tail_chars: int = 4000
    correct_score: float = 1.0
    wrong_score: float = 0.0
    in_process = False  # sympy can take long: score in worker processes, under the time limit

    def __post_init__(self) -> None:
        check_options(self)

    def answer(self, response: str) -> tuple:
        """The response's answer as ``read`` returns it, taken from its last ``tail_chars`` characters."""
        tail = response[-self.tail_chars :]
        if self.extraction == "math_verify":
            return read(tail)
        found = last_boxed(tail) if self.answer_pattern is None else last_match(self.answer_pattern, tail)
        return () if found is None else read(f"\\boxed{{{found}}}", latex_only=True)

    def extract(self, response: str) -> str | None:
        """The text the answer was read from (what ``judged.parquet`` shows), or None."""
        answer = self.answer(response)
        return str(answer[-1]) if answer else None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        from math_verify import verify

        answer, expected = self.answer(response), read_gold(str(gold))
        correct = bool(answer) and bool(expected) and verify(
            list(expected), list(answer), float_rounding=self.float_rounding, strict=self.strict,
            allow_set_relation_comp=self.allow_set_relation_comp,
        )  # fmt: skip
        return self.correct_score if correct else self.wrong_score


def last_match(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text)
    return found[-1] if found else None


def check_options(judger: MathJudger) -> None:
    """Each option's type and range, so a typo fails when the judger is configured, not mid-run."""
    if judger.extraction not in EXTRACTIONS:
        refuse("extraction", f"one of {', '.join(EXTRACTIONS)}", judger.extraction)
    if judger.answer_pattern is not None:
        check_pattern(judger)
    for name, minimum in (("float_rounding", 0), ("tail_chars", 1)):
        value = getattr(judger, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            refuse(name, f"an integer of at least {minimum}", value)
    for name in ("strict", "allow_set_relation_comp"):
        if not isinstance(getattr(judger, name), bool):
            refuse(name, "true or false", getattr(judger, name))
    for name in ("correct_score", "wrong_score"):
        value = getattr(judger, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            refuse(name, "a number", value)


def check_pattern(judger: MathJudger) -> None:
    if judger.extraction != "boxed":
        raise UserError("judger 'math': answer_pattern needs extraction 'boxed' (it stands for the last \\boxed{})")
    try:
        groups = re.compile(judger.answer_pattern).groups
    except (re.error, TypeError) as exc:
        raise UserError(f"judger 'math': answer_pattern is not a regular expression ({exc})") from None
    if groups != 1:
        refuse("answer_pattern", "a regex with exactly one group (the answer)", judger.answer_pattern)


def refuse(name: str, wanted: str, value) -> None:
    raise UserError(f"judger 'math': option {name} must be {wanted}; got {value!r}")
