"""A judger of the user's own: any callable named ``package.module:function``.

It is called as ``function(prompt=..., response=..., gold=..., row=...)`` and returns a number, or a
dict with a ``score`` number (other keys are ignored); it may be ``async``. A score that is not a
finite number within ``rlx.judgers.SCORE_LIMIT`` is the judger's error (scored 0 and counted). Only
what the config names is ever imported: model output is never evaluated as code.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

from rlx.plugins import load_callable


@dataclass(frozen=True)
class CustomJudger:
    function: str
    correct_score: float = 1.0
    in_process = False  # user code may be slow or hang: score in worker processes, under the time limit

    def __post_init__(self) -> None:
        load_callable(self.function, "custom judger")  # fail at configuration time, not in the middle of a run

    def extract(self, response: str) -> str | None:
        return None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        function = load_callable(self.function, "custom judger")
        prompt = (row or {}).get("prompt")
        result = function(prompt=prompt, response=response, gold=gold, row=row)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        return result.get("score") if isinstance(result, dict) else result  # checked by the caller
