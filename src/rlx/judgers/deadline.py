"""``judger_config.timeout`` for judgers that run in this process.

A thread cannot be stopped, so each call runs in a daemon thread that the caller waits on for at
most the timeout; a call past it scores 0 with a timeout error (as in a worker process), and its
thread is abandoned (a daemon, it never holds up the process's exit) for a fresh one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout


class DeadlineRunner:
    """Runs calls one at a time in a daemon thread, each under a deadline."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue | None = None

    def _start(self) -> queue.SimpleQueue:
        calls: queue.SimpleQueue = queue.SimpleQueue()

        def serve() -> None:
            while True:
                function, args, future = calls.get()
                future.set_result(function(*args))

        threading.Thread(target=serve, name="rlx-judge", daemon=True).start()
        return calls

    def call(self, timeout: float, function: Callable[..., tuple], *args) -> tuple:
        """``function(*args)`` (which must not raise), or ``(0.0, None, 'timeout: ...')`` after ``timeout`` s."""
        if self._calls is None:
            self._calls = self._start()
        future: Future = Future()
        self._calls.put((function, args, future))
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            self._calls = None  # the thread is stuck in the judger: leave it, the next call starts another
            return 0.0, None, f"timeout: no score within {timeout} s"
