"""Verifiable rewards. ``get(name, **options)`` returns a judger; ``available()`` lists the names.

A judger scores one response against the row's gold answer: ``score(response, gold, row=None) ->
float``. ``extract(response)`` returns the answer it read (or None), kept in the judged artifact so a
notebook can show why a response scored what it did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rlx.config import JudgerConfig
from rlx.errors import UserError
from rlx.judgers.numeric import NumericAnswerJudger

_FACTORIES: dict[str, Callable[..., NumericAnswerJudger]] = {
    "arith": lambda **options: NumericAnswerJudger(**{"strict": True, **options}),
    "gsm8k": lambda **options: NumericAnswerJudger(**options),
}


def available() -> list[str]:
    return sorted(_FACTORIES)


def get(name: str, **options) -> NumericAnswerJudger:
    if name not in _FACTORIES:
        raise UserError(f"unknown judger {name!r}; available: {', '.join(available())}")
    try:
        return _FACTORIES[name](**options)
    except TypeError as exc:
        raise UserError(f"judger {name!r}: bad options {options} ({exc})") from None


@dataclass
class Verdict:
    """One response judged: the weighted total, each judger's score, the answer read, any error."""

    reward: float
    scores: dict[str, float]
    extracted: str | None
    correct: bool
    error: str | None = None


@dataclass(frozen=True)
class Seat:
    """One configured judger: what it is, its weight in the total, and the data sources it scores."""

    name: str
    judger: NumericAnswerJudger
    weight: float
    sources: tuple[str, ...]


@dataclass
class Panel:
    """The configured judgers, chosen per row by its ``data_source`` (``judger_config``)."""

    config: JudgerConfig
    seats: list[Seat] = field(init=False)

    def __post_init__(self) -> None:
        self.seats = [
            Seat(item.judger_name, get(item.judger_name, **item.options), item.weight,
                 tuple(item.data_source or [item.judger_name]))
            for item in self.config.reward_judger_configs
        ]  # fmt: skip

    def judge(self, response: str, data_source: str, gold: str) -> Verdict:
        """Score with every judger of this data source. A judger that raises scores 0 and the error
        is kept, so one bad sample never stops a run."""
        seats = [seat for seat in self.seats if data_source in seat.sources]
        if not seats:
            covered = sorted({source for seat in self.seats for source in seat.sources})
            raise UserError(
                f"no judger scores data_source {data_source!r}; judger_config.reward_judger_configs covers {covered}"
            )
        scores, extracted, errors = {}, None, []
        for seat in seats:
            try:
                scores[seat.name] = float(seat.judger.score(response, gold))
                extracted = extracted if extracted is not None else seat.judger.extract(response)
            except Exception as exc:  # a judger's bug must not end the run: count it instead
                scores[seat.name] = 0.0
                errors.append(f"{seat.name}: {type(exc).__name__}: {exc}")
        reward = sum(seat.weight * scores[seat.name] for seat in seats)
        correct = all(scores[seat.name] >= seat.judger.correct_score for seat in seats)
        return Verdict(reward, scores, extracted, correct, "; ".join(errors) or None)
