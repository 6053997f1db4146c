"""Verifiable rewards. ``get(name, **options)`` returns a judger; ``available()`` lists the names.

A judger scores one response against the row's gold answer: ``score(response, gold, row=None) ->
float`` (and ``score_batch`` for many). ``extract(response)`` returns the answer it read (or None),
kept in the judged artifact so a notebook can show why a response scored what it did.

:class:`Panel` applies the configured judgers to many responses: cheap ones in this process, the
others (``math``, ``custom``) in worker processes, each call under ``judger_config.timeout`` (in
this process in a thread with a deadline, :mod:`rlx.judgers.deadline`), and a reward model in batches. A judger that
raises, runs out of time, or returns a non-number, NaN, an infinity or a score beyond ``SCORE_LIMIT``
scores 0; the error is kept and counted (a NaN reward would skip every update, an infinite one zero
the advantages, and neither would show as an error). Judgers see
at most the last ``judger_config.max_response_chars`` characters of a response.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from math import isfinite
from numbers import Real

from rlx.agents.stopping import warn_still_running
from rlx.config import JudgerConfig
from rlx.errors import UserError, described
from rlx.helper_processes import helper_context
from rlx.judgers.custom import CustomJudger
from rlx.judgers.deadline import call_within
from rlx.judgers.environment import EnvironmentJudger
from rlx.judgers.format import FormatJudger
from rlx.judgers.math import MathJudger
from rlx.judgers.numeric import NumericAnswerJudger
from rlx.judgers.reward_model import RewardModelJudger

SCORE_LIMIT = 1e6  # larger than any real reward (reward-model logits included): beyond it, a judger's bug
_FACTORIES: dict[str, Callable] = {
    "arith": lambda **options: NumericAnswerJudger(**{"strict": True, **options}),
    "gsm8k": NumericAnswerJudger,
    "math": MathJudger,
    "format": FormatJudger,
    "custom": CustomJudger,
    "reward_model": RewardModelJudger,
    "environment": EnvironmentJudger,
}


def available() -> list[str]:
    return sorted(_FACTORIES)


def get(name: str, **options):
    if name not in _FACTORIES:
        raise UserError(f"unknown judger {name!r}; available: {', '.join(available())}")
    try:
        return _FACTORIES[name](**options)
    except TypeError as exc:
        raise UserError(f"judger {name!r}: bad options {options} ({exc})") from None


def score_batch(judger, responses: list[str], golds: list[str], rows: list[dict] | None = None) -> list[float]:
    """Scores of many responses with one judger (errors raise: this is the plain API)."""
    rows = rows or [None] * len(responses)
    return [checked(judger.score(r, g, row)) for r, g, row in zip(responses, golds, rows, strict=True)]


def checked(score) -> float:
    """``score`` as a float, or ValueError/TypeError when it is not one a reward can be."""
    if isinstance(score, bool) or not isinstance(score, Real):  # numpy's scalars are Real too
        raise TypeError(f"returned {score!r}, not a number")
    if not isfinite(score) or abs(score) > SCORE_LIMIT:
        raise ValueError(f"returned {score!r}, not a finite score within +-{SCORE_LIMIT:g}")
    return float(score)


def safe_score(judger, response: str, gold: str, row: dict | None) -> tuple[float, str | None, str | None]:
    """(score, extracted answer, error): never raises; a score ``checked`` refuses is an error."""
    try:
        return checked(judger.score(response, gold, row)), judger.extract(response), None
    except Exception as exc:  # noqa: BLE001 - a judger's bug must not end the run: count it instead
        return failure(exc)


def failure(exc: Exception) -> tuple[float, None, str]:
    """A failed score: 0, no answer read, and the error as kept in the judged artifact."""
    return 0.0, None, described(exc)


def batch_scores(judger, items: list[tuple]) -> list[tuple[float, str | None, str | None]]:
    """``safe_score`` for a batched judger (a reward model): a failure of the call scores the whole
    batch 0, a bad score only its own response."""
    try:
        scores = list(judger.score_batch([i[0] for i in items], [i[2] for i in items], [i[3] for i in items]))
        if len(scores) != len(items):
            raise ValueError(f"returned {len(scores)} scores for {len(items)} responses")
    except Exception as exc:  # noqa: BLE001 - a judger's failure must not end the run: count it instead
        return [failure(exc)] * len(items)
    return [one_batch_score(score) for score in scores]


def one_batch_score(score) -> tuple[float, None, str | None]:
    try:
        return checked(score), None, None
    except (TypeError, ValueError) as exc:
        return failure(exc)


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
    judger: object
    weight: float
    sources: tuple[str, ...]


_POOL: dict[str, object] = {}


def _ready() -> bool:
    return True


def worker_pool():
    """Worker processes for the judgers that may be slow, kept for the life of this process. They are
    started (and their imports done) before any judging, so start-up never eats a sample's time limit."""
    if "pool" not in _POOL:
        processes = min(4, os.cpu_count() or 1)
        pool = helper_context().Pool(processes, importlib.import_module, ("rlx.judgers",))
        pool.starmap(_ready, [()] * processes, chunksize=1)
        _POOL["pool"] = pool
        atexit.register(discard_pool)
    return _POOL["pool"]


def discard_pool() -> None:
    """Kill the workers (one may be stuck in a judger that hangs); the next call starts fresh ones."""
    pool = _POOL.pop("pool", None)
    if pool is not None:
        pool.terminate()


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

    def seats_for(self, data_source: str) -> list[Seat]:
        seats = [seat for seat in self.seats if data_source in seat.sources]
        if not seats:
            covered = sorted({source for seat in self.seats for source in seat.sources})
            raise UserError(
                f"no judger scores data_source {data_source!r}; judger_config.reward_judger_configs covers {covered}"
            )
        return seats

    def judge(self, response: str, data_source: str, gold: str, row: dict | None = None) -> Verdict:
        return self.judge_many([(response, data_source, gold, row)])[0]

    def judge_many(self, items: list[tuple[str, str, str, dict | None]]) -> list[Verdict]:
        """Judge ``(response, data_source, gold, row)`` items; slow judgers run in parallel processes.
        Every judger sees only a response's last ``max_response_chars`` characters (where its answer is),
        so no parser gets unbounded model output."""
        cap = self.config.max_response_chars
        items = [(response[-cap:], *rest) for response, *rest in items]
        results: list[dict[str, tuple]] = [{} for _ in items]
        pending, batched = [], {}
        for index, (response, data_source, gold, row) in enumerate(items):
            for seat in self.seats_for(data_source):
                if getattr(seat.judger, "batched", False):
                    batched.setdefault(seat.name, (seat, []))[1].append(index)
                elif seat.judger.in_process:
                    outcome = call_within(self.config.timeout, safe_score, seat.judger, response, gold, row)
                    results[index][seat.name] = outcome
                else:
                    task = worker_pool().apply_async(safe_score, (seat.judger, response, gold, row))
                    pending.append((index, seat.name, task))
        for seat, indices in batched.values():
            for index, outcome in zip(indices, batch_scores(seat.judger, [items[i] for i in indices]), strict=True):
                results[index][seat.name] = outcome
        timed_out = False
        for index, name, task in pending:
            try:
                results[index][name] = task.get(timeout=self.config.timeout)
            except multiprocessing.TimeoutError:
                results[index][name] = (0.0, None, f"timeout: no score within {self.config.timeout} s")
                timed_out = True
        if timed_out:
            discard_pool()
        warn_still_running()
        return [self.verdict(items[i][1], results[i]) for i in range(len(items))]

    def verdict(self, data_source: str, results: dict[str, tuple]) -> Verdict:
        seats = self.seats_for(data_source)
        scores = {seat.name: results[seat.name][0] for seat in seats}
        extracted = next((results[seat.name][1] for seat in seats if results[seat.name][1] is not None), None)
        errors = [f"{seat.name}: {results[seat.name][2]}" for seat in seats if results[seat.name][2]]
        reward = sum(seat.weight * scores[seat.name] for seat in seats)
        correct = all(scores[seat.name] >= seat.judger.correct_score for seat in seats)
        return Verdict(reward, scores, extracted, correct, "; ".join(errors) or None)
