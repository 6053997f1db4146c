"""Running tool calls under ``agent_loop_config.tool_timeout``, the way judgers run under theirs
(rlx.judgers.deadline): a thread cannot be stopped, so calls run in daemon threads that the caller
waits on until the deadline and then abandons (they never hold up the process's exit).

One rollout's calls of a turn form a :class:`Chain`, run one after another in one thread (they may
act on the same environment's state); the chains of different rollouts run at the same time, so a
turn costs its slowest chain, not the sum. Each call gets ``timeout`` seconds from when the call
before it ended; past that, it and the calls after it in its chain are given up.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """What one call gave back: its value, or the error (an exception's type and message, a timeout)."""

    value: object = None
    error: str | None = None
    seconds: float = 0.0
    timed_out: bool = False


def timed_out(timeout: float) -> Outcome:
    return Outcome(error=f"timeout: no result within {timeout:g} s", seconds=timeout, timed_out=True)


SKIPPED = Outcome(error="not run: an earlier call of this turn timed out")


class Chain:
    """Calls (functions of no arguments) run in order in a daemon thread, started at once."""

    def __init__(self, calls: list[Callable[[], object]]):
        self.futures: list[Future] = [Future() for _ in calls]
        self.ended: list[float | None] = [None] * len(calls)  # monotonic time each call ended
        self.started = time.monotonic()
        if calls:
            threading.Thread(target=self._run, args=(calls,), name="rlx-tool", daemon=True).start()

    def _run(self, calls: list[Callable[[], object]]) -> None:
        for index, call in enumerate(calls):
            begun = time.perf_counter()
            try:
                value, error = call(), None
            except Exception as exc:  # noqa: BLE001 - a tool's bug is shown to the model, not the run's end
                value, error = None, f"{type(exc).__name__}: {exc}"
            self.ended[index] = time.monotonic()
            self.futures[index].set_result(Outcome(value, error, time.perf_counter() - begun))

    def left(self, index: int, timeout: float) -> float:
        """Seconds call ``index`` has left: ``timeout`` from the end of the call before it (its start)."""
        since = self.ended[index - 1] if index else self.started
        return max(0.0, since + timeout - time.monotonic())

    def outcomes(self, timeout: float) -> list[Outcome]:
        """Every call's outcome, waiting for each until its deadline."""
        results: list[Outcome] = []
        for index, future in enumerate(self.futures):
            try:
                results.append(future.result(timeout=self.left(index, timeout)))
            except FutureTimeout:
                return results + [timed_out(timeout)] + [SKIPPED] * (len(self.futures) - index - 1)
        return results

    async def outcomes_async(self, timeout: float) -> list[Outcome]:
        """:meth:`outcomes` for an event loop: waiting takes no thread, so other requests go on meanwhile."""
        results: list[Outcome] = []
        for index, future in enumerate(self.futures):
            try:
                if not future.done():  # (a done one is taken as is: the loop may come to it past its deadline)
                    await asyncio.wait_for(asyncio.wrap_future(future), self.left(index, timeout))
            except TimeoutError:
                return results + [timed_out(timeout)] + [SKIPPED] * (len(self.futures) - index - 1)
            results.append(future.result())
        return results


def run_chains(chains: list[list[Callable[[], object]]], timeout: float) -> list[list[Outcome]]:
    """Each chain's outcomes; all chains run at the same time."""
    started = [Chain(calls) for calls in chains]
    return [chain.outcomes(timeout) for chain in started]
