"""A judger of the user's own: any callable named ``package.module:function``.

It is called as ``function(prompt=..., response=..., gold=..., row=...)`` and returns a number, or a
dict with a ``score`` number (other keys are ignored); it may be ``async``. A score that is not a
finite number within ``rlx.judgers.SCORE_LIMIT`` is the judger's error (scored 0 and counted). Only
what the config names is ever imported: model output is never evaluated as code.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from dataclasses import dataclass

from rlx.errors import UserError


def load_callable(path: str):
    module_name, sep, function_name = path.partition(":")
    if not sep or not module_name or not function_name:
        raise UserError(f"custom judger {path!r}: expected 'package.module:function'")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"custom judger {path!r}: cannot import it ({exc})") from None
    if not callable(function):
        raise UserError(f"custom judger {path!r}: not callable")
    return function


@dataclass(frozen=True)
class CustomJudger:
    function: str
    correct_score: float = 1.0
    in_process = False  # user code may be slow or hang: score in worker processes, under the time limit

    def __post_init__(self) -> None:
        load_callable(self.function)  # fail at configuration time, not in the middle of a run

    def extract(self, response: str) -> str | None:
        return None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        function = load_callable(self.function)
        prompt = (row or {}).get("prompt")
        result = function(prompt=prompt, response=response, gold=gold, row=row)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        return result.get("score") if isinstance(result, dict) else result  # checked by the caller
