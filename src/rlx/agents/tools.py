"""An agent's tools at work: each rollout's :class:`Session`, with a fresh environment where the config
names one (the tools themselves are imported and given their schemas with the config, rlx.plugins.Toolbox).

An environment (TRL's ``environment_factory``, OpenRLHF's ``AgentInstance``) is a class made once per
rollout: ``reset(row)`` gives the conversation to start from (chat messages, a string taken as the
user's message, or None for the row's own prompt), its other public methods are the tools, acting on
that rollout's state, and an optional ``reward()`` scores the finished rollout (the ``environment``
judger reads it from the artifact).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from rlx.agents import calls
from rlx.plugins import Toolbox


def open_session(toolbox: Toolbox, row: dict) -> Session:
    """One rollout's tools: a fresh environment, reset with the prompt row, or the shared functions."""
    if toolbox.environment is None:
        return Session(toolbox.functions, None, None)
    instance = toolbox.environment()
    start = instance.reset(row)
    if inspect.isawaitable(start):  # an async reset, run on the async tools' event loop
        start, error = calls.LOOP.submit(calls.settled(start)).result()
        if error is not None:
            raise RuntimeError(error)
    bound = {name: getattr(instance, name) for name in toolbox.functions}
    return Session(bound, instance, start)


@dataclass
class Session:
    """What one rollout calls: its tools by name, its environment (if any) and the conversation that
    environment's ``reset`` started (None: the row's own prompt)."""

    tools: dict[str, Callable]
    environment: object | None
    start: object

    def job(self, name: str, arguments: dict) -> Callable[[], object]:
        """The call ``name(**arguments)``, to run later under the deadline (a partial, so an async tool's
        call is still seen as a coroutine function: rlx.agents.calls.Chain runs it on the event loop)."""
        return functools.partial(self.tools[name], **arguments)

    def has_reward(self) -> bool:
        return callable(getattr(self.environment, "reward", None))
