"""One write at a time in a thread of its own: a checkpoint is written while the next steps run, by the
run's process (rlx.run.recording) and by each worker rank (rlx.workers.worker) alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class BackgroundWriter:
    """Writes in a thread of its own, one at a time: a write starts only once the one before it ended, so
    a caller that waits before copying what it writes holds at most two copies (the one being written and
    the next)."""

    def __init__(self, name: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.pending: Future | None = None

    def wait(self) -> float:
        """Block until the pending write ended (its error, if any, raised here); the seconds waited."""
        started = time.perf_counter()
        if self.pending is not None:
            self.pending.result()
        return time.perf_counter() - started

    def start(self, write: Callable, *args, **kwargs) -> None:
        """``write(*args, **kwargs)`` in the thread, once the pending write ended."""
        self.wait()
        self.pending = self._thread.submit(write, *args, **kwargs)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
