"""Running tool calls under ``agent_loop_config.tool_timeout`` (judgers run under theirs in the same
threads, rlx.judgers.deadline): calls run in daemon threads that the caller waits on until the deadline;
a call past it is given up and its thread asked to stop (rlx.agents.stopping: Python code ends at once,
a call blocked in C when it returns), and never holds up the process's exit.

One rollout's calls of a turn form a :class:`Chain`, run one after another in one thread (they may
act on the same environment's state); the chains of different rollouts run at the same time, so a
turn costs its slowest chain, not the sum. Each call gets ``timeout`` seconds from when the call
before it ended; past that, it and the calls after it in its chain are given up.

The threads are kept for the next turn's chains (:class:`DaemonThreads`): starting one costs about as
much as a turn's other work for its rollout (~0.2 ms), 25 ms for a turn of 128 rollouts.

A chain whose tools are all coroutine functions (``async def``, as verl's tools are) runs on one event loop
in a thread of its own (:class:`EventLoopThread`) instead: its calls take no thread each, and a call past
its deadline is cancelled, which a thread cannot be. (Not faster here: 128 calls of 50 ms end 7.9-8.4 ms
after the first starts, against 9.7-11 ms in threads, within the agent benchmark's noise.) Such a tool
must not block: it would hold up every other one.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from rlx.agents.stopping import StoppableThread, Stopped
from rlx.errors import described


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
IDLE_S = 60.0  # a thread idle this long ends: the threads of a turn with many calls do not stay for the run


class DaemonThreads:
    """An unbounded pool of daemon threads: a job goes to an idle thread, a new one starts only when none
    is idle, and one idle for ``IDLE_S`` ends. A thread stuck in a hung tool is simply never idle again,
    so it costs the pool nothing (concurrent.futures' pool joins its threads at exit and is bounded)."""

    def __init__(self, name: str = "rlx-tool") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0  # threads free for a job not yet taken
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` (which must not raise) in a thread of the pool."""
        with self._lock:
            start = self._idle == 0
            self._idle -= not start
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # (else a job was just given to the idle threads: stay for it)
                        self._idle -= 1
                        return
                continue
            try:
                job()
            except Stopped:  # a stop that arrived as its chain ended (rlx.agents.stopping): the thread goes on
                pass
            with self._lock:
                self._idle += 1


class EventLoopThread:
    """An event loop run in a daemon thread, started on first use, for the coroutines of async tools."""

    def __init__(self, name: str = "rlx-tool-loop") -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock, self.name = threading.Lock(), name

    def submit(self, coroutine: Coroutine) -> Future:
        """Run ``coroutine`` on the loop; its future (cancelling it cancels the coroutine)."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._serve, args=(self._loop,), name=self.name, daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        """Run ``loop`` until stopped, then close it with its executor's threads (a DNS lookup starts them)."""
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def stop(self) -> None:
        """End the loop and its thread (once what runs on it yields: a coroutine that blocks keeps both)."""
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


THREADS, LOOP = DaemonThreads(), EventLoopThread()


def _new_pool_in_child() -> None:
    global THREADS, LOOP
    THREADS, LOOP = DaemonThreads(), EventLoopThread()  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_new_pool_in_child)


async def settled(awaitable) -> tuple[object, str | None]:
    """``(value, None)``, or ``(None, error)`` for whatever a user's coroutine raised: on the shared event loop a
    SystemExit or KeyboardInterrupt would end the loop's thread, and every later async call with it. A
    cancellation (the call given up at its deadline) goes on: it ends the chain."""
    try:
        return await awaitable, None
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - see above
        return None, described(exc)


class Chain:
    """Calls (functions of no arguments) run in order, started at once: on the event loop if every call is
    a coroutine function, else in a daemon thread (where an async call's coroutine is run on the loop)."""

    def __init__(self, calls: list[Callable[[], object]]):
        self.futures: list[Future] = [Future() for _ in calls]
        self.ended: list[float | None] = [None] * len(calls)  # monotonic time each call ended
        self.started = time.monotonic()
        self.task: Future | None = None  # the chain's coroutine on the event loop, if it runs there
        self.thread: StoppableThread | None = None  # the thread it runs in, if it runs in one
        if calls and all(inspect.iscoroutinefunction(call) for call in calls):
            self.task = LOOP.submit(self._run_async(calls))
        elif calls:
            self.thread = StoppableThread()
            THREADS.submit(lambda: self._run(calls))

    def _run(self, calls: list[Callable[[], object]]) -> None:
        try:
            for index, call in enumerate(calls):
                if not self._begin(index):
                    return
                self._end(index, self._called(call))
        except Stopped:  # it arrived between two calls: the chain was given up, its waiter has its outcomes
            pass
        finally:
            self.thread.leave()

    def _called(self, call: Callable[[], object]) -> Outcome:
        begun = time.perf_counter()
        try:
            self.thread.enter(call_name(call))
            value, error = call(), None
            if inspect.isawaitable(value):
                value, error = LOOP.submit(settled(value)).result()
        except BaseException as exc:  # noqa: BLE001 - a tool's bug (SystemExit too) is the model's to see
            value, error = None, described(exc)
        finally:
            self.thread.leave()
        return Outcome(value, error, time.perf_counter() - begun)

    async def _run_async(self, calls: list[Callable[[], object]]) -> None:
        for index, call in enumerate(calls):
            if not self._begin(index):
                return
            begun = time.perf_counter()
            value, error = await settled(call())
            self._end(index, Outcome(value, error, time.perf_counter() - begun))

    def _begin(self, index: int) -> bool:
        """Mark call ``index`` running, so its waiter can no longer cancel its future (an event loop's
        waiter cancels the future it gave up on); False if it already did: the chain's waiter is gone."""
        return self.futures[index].set_running_or_notify_cancel()

    def _end(self, index: int, outcome: Outcome) -> None:
        self.ended[index] = time.monotonic()
        self.futures[index].set_result(outcome)

    def given_up(self, index: int, timeout: float) -> list[Outcome]:
        """The outcomes from call ``index``, which ran past its deadline, on: a timeout, then the skipped
        calls, which will not start. An async chain is cancelled, a thread asked to stop."""
        for future in self.futures[index:]:
            future.cancel()  # (the running call's cannot be: it is stopped below)
        if self.task is not None:
            self.task.cancel()
        if self.thread is not None:
            self.thread.stop()
        return [timed_out(timeout)] + [SKIPPED] * (len(self.futures) - index - 1)

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
                return results + self.given_up(index, timeout)
        return results

    async def outcomes_async(self, timeout: float) -> list[Outcome]:
        """:meth:`outcomes` for an event loop: waiting takes no thread, so other requests go on meanwhile."""
        results: list[Outcome] = []
        for index, future in enumerate(self.futures):
            try:
                if not future.done():  # (a done one is taken as is: the loop may come to it past its deadline)
                    await asyncio.wait_for(asyncio.wrap_future(future), self.left(index, timeout))
            except TimeoutError:
                return results + self.given_up(index, timeout)
            results.append(future.result())
        return results


def call_name(call: Callable) -> str:
    """A call's name for messages: its function's, through a partial."""
    function = getattr(call, "func", call)
    return getattr(function, "__qualname__", repr(function))


def run_chains(chains: list[list[Callable[[], object]]], timeout: float) -> list[list[Outcome]]:
    """Each chain's outcomes; all chains run at the same time."""
    started = [Chain(calls) for calls in chains]
    return [chain.outcomes(timeout) for chain in started]
