"""The tools an agent may call, from the config only: functions named ``package.module:function``, or
the public methods of an environment class, plain or ``async def``. Each tool's JSON schema comes from
its type hints and docstring through ``transformers.utils.get_json_schema``, the function chat templates
render ``tools`` with (TRL and verl derive schemas the same way), so the schema the model is shown is
the one checked.

An environment (TRL's ``environment_factory``, OpenRLHF's ``AgentInstance``) is a class made once per
rollout: ``reset(row)`` gives the conversation to start from (chat messages, a string taken as the
user's message, or None for the row's own prompt), its other public methods are the tools, acting on
that rollout's state, and an optional ``reward()`` scores the finished rollout (the ``environment``
judger reads it from the artifact).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, field

from rlx.agents import calls
from rlx.errors import UserError
from rlx.plugins import load_callable, load_object

ENVIRONMENT_HOOKS = ("reset", "reward")  # an environment's methods that are not tools


def tool_schema(function: Callable, what: str) -> dict:
    """The function's schema as chat templates take it; a one-line error when its docstring or type
    hints cannot give one (every argument needs a type hint and an ``Args:`` line)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(function)
    except Exception as exc:  # noqa: BLE001 - transformers raises several types for a missing docstring or hint
        raise UserError(f"{what}: no tool schema from its type hints and docstring ({exc})") from None


def method_schema(method: Callable, what: str) -> dict:
    """An environment method's schema without ``self``, read from the method bound to a stand-in
    object (nothing is called, and no environment is made at configuration time)."""
    return tool_schema(types.MethodType(method, object()), what)


@dataclass(frozen=True)
class Toolbox:
    """The run's tools (``dataflow_config.agent_loop_config``): their schemas, and how each rollout gets
    its own :class:`Session` to call them in."""

    functions: dict[str, Callable] = field(default_factory=dict)
    environment: type | None = None
    schemas: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, config) -> Toolbox:
        """The tools an ``AgentLoopConfig`` names, imported and given their schemas; one-line errors otherwise."""
        if config.environment is not None:
            return cls.of_environment(config.environment)
        functions, schemas = {}, []
        for path in config.tools:
            function = load_callable(path, "tools entry")
            schema = tool_schema(function, f"tools entry {path!r}")
            name = schema["function"]["name"]
            if name in functions:
                raise UserError(f"tools: two tools are named {name!r}")
            functions[name] = function
            schemas.append(schema)
        return cls(functions, None, schemas)

    @classmethod
    def of_environment(cls, path: str) -> Toolbox:
        what = "environment"
        environment = load_object(path, what)
        if not inspect.isclass(environment) or not callable(getattr(environment, "reset", None)):
            raise UserError(f"{what} {path!r}: expected a class with a reset(row) method")
        methods = {
            name: member
            for name, member in inspect.getmembers(environment, inspect.isfunction)
            if not name.startswith("_") and name not in ENVIRONMENT_HOOKS
        }
        if not methods:
            raise UserError(f"{what} {path!r}: no public methods besides reset and reward, so no tools")
        schemas = [method_schema(method, f"{what} {path!r}, method {name!r}") for name, method in methods.items()]
        return cls(methods, environment, schemas)

    def session(self, row: dict) -> Session:
        """One rollout's tools: a fresh environment, reset with the prompt row, or the shared functions."""
        if self.environment is None:
            return Session(self.functions, None, None)
        instance = self.environment()
        start = instance.reset(row)
        if inspect.isawaitable(start):  # an async reset, run on the async tools' event loop
            start, error = calls.LOOP.submit(calls.settled(start)).result()
            if error is not None:
                raise RuntimeError(error)
        bound = {name: getattr(instance, name) for name in self.functions}
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
