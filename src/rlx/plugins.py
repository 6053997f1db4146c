"""User code the config names as ``package.module:name`` (custom judgers, agent tools and environments):
imported only because the config names it, never from data (model output or a dataset row is never
evaluated as code). A module in the project's folder is found as DVC's stages find it: every process rlx
runs user code in works in that folder, which joins the end of ``sys.path`` (installed packages win).
From Python, the function itself may be given where its ``module:name`` imports it back (:func:`spec_of`).

An agent's tools (:class:`Toolbox`) are functions, or the public methods of an environment class, plain or
``async def``. Each tool's JSON schema comes from its type hints and docstring through
``transformers.utils.get_json_schema``, the function chat templates render ``tools`` with (TRL and verl
derive schemas the same way), so the schema the model is shown is the one checked, when the config is."""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

from rlx.errors import UserError


def load_object(path: str, what: str):
    """The object ``path`` names; a one-line UserError starting with ``what`` when it cannot be imported."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise UserError(f"{what} {path!r}: expected 'package.module:name'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"{what} {path!r}: cannot import it ({exc})") from None


def load_callable(path: str, what: str):
    function = load_object(path, what)
    if not callable(function):
        raise UserError(f"{what} {path!r}: not callable")
    return function


def spec_of(function, where: str) -> str:
    """``module:name`` of a function (or class) given from Python, which every process rlx starts imports back
    to this very object; a UserError naming ``where`` for one they cannot import (defined in the running
    script or notebook, or inside a function), which would run nowhere else."""
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    try:
        found = module not in (None, "__main__") and getattr(importlib.import_module(module), name, None)
    except ImportError:
        found = None
    if found is not function:
        raise UserError(
            f"{where}: {name or function!r} from {module} cannot be imported by the processes rlx starts; define it "
            "in a module of its own (e.g. my_rewards.py beside params.yaml) and import it from there, or give its "
            "'module:name'"
        )
    return f"{module}:{name}"


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
class AgentProgram:
    """What ``agent_loop_config.program`` names (rlx.agents.programs runs it): an async function, or a command."""

    function: Callable | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def load(cls, spec: str | list[str]) -> AgentProgram:
        """The program, checked before a run writes anything: one-line UserErrors otherwise."""
        if isinstance(spec, str):
            function = load_callable(spec, "program")
            if not inspect.iscoroutinefunction(function):
                raise UserError(f"program {spec!r}: expected an async def run(client, row)")
            return cls(function=function)
        if not spec or shutil.which(spec[0]) is None:
            raise UserError(f"program {spec!r}: {spec[0] if spec else 'the command'} is not an executable on PATH")
        return cls(command=tuple(spec))


@dataclass(frozen=True)
class Toolbox:
    """The run's tools (``dataflow_config.agent_loop_config``) and their schemas; each rollout calls them in
    a session of its own (rlx.agents.tools.open_session)."""

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
