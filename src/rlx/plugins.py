"""User code the config names as ``package.module:name`` (custom judgers, agent tools and environments):
imported only because the config names it, never from data (model output or a dataset row is never
evaluated as code)."""

from __future__ import annotations

import importlib

from rlx.errors import UserError


def load_object(path: str, what: str):
    """The object ``path`` names; a one-line UserError starting with ``what`` when it cannot be imported."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise UserError(f"{what} {path!r}: expected 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"{what} {path!r}: cannot import it ({exc})") from None


def load_callable(path: str, what: str):
    function = load_object(path, what)
    if not callable(function):
        raise UserError(f"{what} {path!r}: not callable")
    return function
