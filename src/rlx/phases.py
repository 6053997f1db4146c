"""Progress lines for the long phases that have no bar of their own (the demo model's warm start, a replay):
``what: done/total, elapsed, time left`` on stderr, at most one every few seconds, so that a terminal, a
log file and CI alike see that work goes on and how long it has left. A phase shorter than that prints
nothing."""

from __future__ import annotations

import sys
import time


class Phase:
    """``advance()`` after each of ``total`` equal units of work."""

    def __init__(self, what: str, total: int, every: float = 5.0):
        self.what, self.total, self.every = what, total, every
        self.done = 0
        self.started = self.shown = time.monotonic()

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.shown >= self.every:
            self.shown = now
            print(self.line(now - self.started), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        left = elapsed / self.done * (self.total - self.done)
        return f"{self.what}: {self.done}/{self.total}, {elapsed:.0f} s so far, about {left:.0f} s left"
