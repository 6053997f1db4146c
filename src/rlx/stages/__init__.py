"""The pipeline's stages. Each is a module with ``run(config, step, engines) -> metrics`` and
``outputs(step_paths)``; ``run_stage`` is the one way to run any of them, for `rlx stage NAME`
(what ``dvc.yaml`` calls) and for `rlx fit` alike.
"""

from __future__ import annotations

import importlib
import time
from types import ModuleType

from rlx.artifacts import write_json
from rlx.config import RLTrainerConfig

ITERATION = ["prepare", "rollout", "judge", "train", "evaluate", "export"]
STAGES = ["base", *ITERATION]


def module(name: str) -> ModuleType:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(f"rlx.stages.{name}")


def step_of(name: str, step: int) -> int:
    """``base`` always produces step 0; the others produce the step they are given."""
    return 0 if name == "base" else step


def is_complete(name: str, step: int, engines) -> bool:
    """A stage is complete when its metrics file, written after all its outputs, exists."""
    paths = engines.layout.step(step_of(name, step))
    return paths.metrics(name).is_file() and all(path.exists() for path in module(name).outputs(paths))


def run_stage(name: str, config: RLTrainerConfig, step: int, engines) -> dict:
    """Run one stage, then write its metrics (its wall time included) as the mark that it finished."""
    stage, step = module(name), step_of(name, step)
    started = time.perf_counter()
    metrics = stage.run(config, step, engines)
    metrics[f"time/{name}"] = time.perf_counter() - started
    write_json(metrics, engines.layout.step(step).metrics(name))
    refresh_curves(name, config, step, engines)
    return metrics


def refresh_curves(name: str, config: RLTrainerConfig, step: int, engines) -> None:
    """Rebuild the curves a stage owns (idempotent: also called for a stage found complete on resume)."""
    after_run = getattr(module(name), "after_run", None)
    if after_run:
        after_run(config, step_of(name, step), engines)
