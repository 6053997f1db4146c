"""``judger_config.timeout`` for judgers that run in this process.

Each call runs as a chain of one call in the pool the agents' tool calls run in
(:class:`rlx.agents.calls.Chain`), which the caller waits on for at most the timeout: a call past it
scores 0 with a timeout error (as in a worker process), and its thread is asked to stop
(rlx.agents.stopping) while the next call goes to another.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rlx.agents.calls import Chain


def call_within(timeout: float, function: Callable[..., tuple], *args) -> tuple:
    """``function(*args)`` (which must not raise), or ``(0.0, None, 'timeout: ...')`` after ``timeout`` s."""
    (outcome,) = Chain([partial(function, *args)]).outcomes(timeout)
    if outcome.timed_out:
        return 0.0, None, f"timeout: no score within {timeout} s"
    return outcome.value if outcome.error is None else (0.0, None, outcome.error)
