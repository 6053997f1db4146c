"""``judger_config.timeout`` for judgers that run in this process.

A thread cannot be stopped, so each call runs in a daemon thread of the pool the agents' tool calls run
in (:class:`rlx.agents.calls.DaemonThreads`), which the caller waits on for at most the timeout; a call
past it scores 0 with a timeout error (as in a worker process), and its thread is left to it (a daemon,
it never holds up the process's exit) while the next call goes to another.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from rlx.agents import calls


def call_within(timeout: float, function: Callable[..., tuple], *args) -> tuple:
    """``function(*args)`` (which must not raise), or ``(0.0, None, 'timeout: ...')`` after ``timeout`` s."""
    future: Future = Future()
    calls.THREADS.submit(lambda: future.set_result(function(*args)))  # (the pool as it is now: a fork renews it)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        return 0.0, None, f"timeout: no score within {timeout} s"
