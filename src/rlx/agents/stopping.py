"""Stopping a call's thread when its deadline has passed.

A call given up at its deadline that goes on computing keeps its share of the GIL: four abandoned
CPU-bound tools made the rest of the process's Python work 4.1x slower (issue 45). CPython can raise an
exception in another thread, at that thread's next bytecode (``PyThreadState_SetAsyncExc``), so a
given-up call that runs Python code ends within a switch interval (5 ms). What it cannot reach: a thread
blocked in C (``time.sleep``, a socket) or holding the GIL inside one C function (a regex, a huge integer
power) gets the exception only when that function returns, and a tool that swallows ``BaseException``
(a bare ``except:``) goes on. Such calls are counted by :func:`still_running` and named in a warning.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
import weakref

log = logging.getLogger(__name__)


class Stopped(BaseException):
    """Raised in a call's thread past its deadline: a BaseException, so a tool's ``except Exception``
    lets it through (as it does KeyboardInterrupt)."""


def raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in the thread at its next bytecode; None withdraws one not raised yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception else None
    )


ASKED: weakref.WeakSet = weakref.WeakSet()  # the threads asked to stop, until they leave their call


class StoppableThread:
    """The thread a chain of calls runs in, stopped at most once: while a call runs (between
    :meth:`enter` and :meth:`leave`), :meth:`stop` raises :class:`Stopped` in it; a stop not yet raised
    when the call ends is withdrawn, so it can never land in the code that runs the next job."""

    def __init__(self) -> None:
        self.name = ""  # the running call's, set by enter
        self._lock = threading.Lock()
        self._thread: int | None = None  # the thread's id while a call runs
        self.asked: float | None = None  # monotonic time the stop was asked

    def enter(self, name: str) -> None:
        """Mark a call begun in this thread; :class:`Stopped` at once if the stop came before it."""
        with self._lock:
            if self.asked is not None:
                raise Stopped
            self.name, self._thread = name, threading.get_ident()

    def leave(self) -> None:
        with self._lock:
            if self.asked is not None and self._thread is not None:
                raise_in(self._thread, None)
                ASKED.discard(self)
            self._thread = None

    def stop(self) -> None:
        with self._lock:
            if self.asked is None:
                self.asked = time.monotonic()
                if self._thread is not None:
                    raise_in(self._thread, Stopped)
                    ASKED.add(self)

    def running(self) -> bool:
        return self._thread is not None


def still_running(grace: float = 1.0) -> list[str]:
    """The calls asked to stop more than ``grace`` seconds ago that have not ended (blocked in C, or
    swallowing the stop): each keeps a thread, and may keep a CPU, until it returns."""
    now = time.monotonic()
    return sorted(t.name for t in list(ASKED) if t.running() and t.asked is not None and now - t.asked > grace)


def warn_still_running() -> None:
    """A warning naming the calls :func:`still_running` finds, if any."""
    if stuck := still_running():
        log.warning(
            "%d call(s) given up at their deadline still run (%s): blocked in C code or swallowing the stop, "
            "each holds a thread and may hold a CPU until it returns; run such work in a subprocess",
            len(stuck), ", ".join(sorted(set(stuck))),
        )  # fmt: skip
