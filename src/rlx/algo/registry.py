"""Name tables of the algorithm library, one per kind, filled by ``@register(kind, name)``.

A name is spelled once, where its function is registered: the train stage looks functions up here
and the config validates its fields against ``names(kind)``. This module does not import torch, so
importing the config stays cheap; the first lookup imports the modules that register (and torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

KINDS = {
    "advantage": "advantage estimator",
    "policy_loss": "policy loss",
    "kl": "KL estimator",
    "loss_agg": "loss aggregation",
    "correction": "rollout correction mode",
}
_MODULES = ("rlx.algo.advantages", "rlx.algo.losses", "rlx.algo.kl", "rlx.algo.correction")
_TABLES: dict[str, dict[str, tuple[Callable, dict[str, Any]]]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str, **traits: Any) -> Callable[[Callable], Callable]:
    """Register the decorated function as ``name`` of ``kind``; ``traits`` are facts the config checks
    (e.g. ``groups=True``: the estimator compares responses within a prompt's group)."""
    if kind not in KINDS:
        raise ValueError(f"unknown algorithm kind {kind!r}; kinds: {', '.join(KINDS)}")

    def decorate(function: Callable) -> Callable:
        if name in _TABLES[kind]:
            raise ValueError(f"{KINDS[kind]} {name!r} is registered twice")
        _TABLES[kind][name] = (function, traits)
        return function

    return decorate


def _table(kind: str) -> dict[str, tuple[Callable, dict[str, Any]]]:
    for module in _MODULES:
        importlib.import_module(module)  # a no-op once imported
    return _TABLES[kind]


def names(kind: str, **traits: Any) -> list[str]:
    """The registered names of ``kind`` in registration order, those with all of ``traits`` if given."""
    return [
        name
        for name, (_, own) in _table(kind).items()
        if all(own.get(trait) == value for trait, value in traits.items())
    ]


def get(kind: str, name: str) -> Callable:
    """The function registered as ``name`` of ``kind``."""
    table = _table(kind)
    if name not in table:
        raise ValueError(f"unknown {KINDS[kind]} {name!r}; registered: {', '.join(table)}")
    return table[name][0]
