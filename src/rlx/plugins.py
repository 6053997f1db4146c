"""User code the config names as ``package.module:name`` (custom judgers, agent tools and environments):
imported only because the config names it, never from data (model output or a dataset row is never
evaluated as code). A module in the project's folder is found as DVC's stages find it: every process rlx
runs user code in works in that folder, which joins the end of ``sys.path`` (installed packages win).
From Python, the function itself may be given where its ``module:name`` imports it back (:func:`spec_of`)."""

from __future__ import annotations

import importlib
import os
import sys

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
