"""Where a step's time goes: named parts, timed where they run, that add up to the step.

Code times a part with ``with part(name) as watch`` (``watch.seconds`` once the block ends). Inside
:func:`step`, on the same thread, each part's seconds also go to the step's record, less those of the
parts nested in it: a weight sync inside the rollout stage counts as weight sync, not again as
rollout. No second is counted twice, so the step's time less the parts is what none of them measured
(``time/step/other`` in :func:`breakdown`). Parts timed in other threads (a checkpoint written in the
background, rollouts made ahead in a thread) overlap the step and are not its own; the time the step
waits for them is.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_thread = threading.local()  # per thread: ``open``, the parts being timed; ``record``, inside step()


@dataclass
class Watch:
    seconds: float = 0.0  # the part's whole time, once it ended
    nested: float = 0.0  # the seconds of the parts timed inside it


@contextmanager
def part(name: str) -> Iterator[Watch]:
    """Time the block as part ``name`` of the step this thread is in, if any."""
    watch, started = Watch(), time.perf_counter()
    open_parts = _thread.__dict__.setdefault("open", [])
    open_parts.append(watch)
    try:
        yield watch
    finally:
        watch.seconds = time.perf_counter() - started
        open_parts.pop()
        if open_parts:
            open_parts[-1].nested += watch.seconds
        record = getattr(_thread, "record", None)
        if record is not None:
            record[name] += watch.seconds - watch.nested


@contextmanager
def step() -> Iterator[dict[str, float]]:
    """Record this thread's parts while the block runs: seconds by part name, nested parts apart."""
    _thread.record = defaultdict(float)
    try:
        yield _thread.record
    finally:
        del _thread.record


def breakdown(seconds: float, parts: dict[str, float]) -> dict[str, float]:
    """A step's ``time/step/<part>`` metrics, and ``time/step/other``: of its ``seconds``, what no part measured."""
    return {
        **{f"time/step/{name}": value for name, value in parts.items()},
        "time/step/other": seconds - sum(parts.values()),
    }
