"""The pipeline's stages. Each is a module with ``run(config, step, paths, engines) -> metrics``
(``paths``: the step's folder, rlx.store.layout.StepPaths; ``engines``: the models kept warm) and
``outputs(paths)``; ``run_stage`` is the one way to run any of them, for `rlx stage NAME` (what
``dvc.yaml`` calls) and for `rlx fit` alike.

A stage is complete when its metrics file exists and its outputs are exactly what it wrote: before
the metrics it records each output file's size and hash in ``<stage>_outputs.json`` (rlx.store.integrity),
and a file found truncated, corrupted or missing on resume makes the stage run again.
"""

from __future__ import annotations

import importlib
import logging
import random
import time
from pathlib import Path
from types import ModuleType

import torch

from rlx import clock, seeds
from rlx.config import RLTrainerConfig
from rlx.errors import UserError, first_line
from rlx.store import faults
from rlx.store.artifacts import read_json, write_json
from rlx.store.integrity import first_changed, folder_records
from rlx.store.layout import SETUP, STAGES, RunLayout

log = logging.getLogger(__name__)
# The stages in the order their seeds were first numbered: a stage added later goes at the end, so that no
# earlier stage's numbers (and no recorded run) change.
SEEDED = ["base", "prepare", "rollout", "judge", "train", "checkpoint", "evaluate", "export", "teachers", "teacher"]


def module(name: str) -> ModuleType:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(f"rlx.stages.{name}")


def step_of(name: str, step: int) -> int:
    """``base`` and ``teachers`` always produce step 0; the others produce the step they are given."""
    return 0 if name in SETUP else step


def output_files(name: str, paths) -> list[Path]:
    """The files a stage produced: its outputs, folders file by file."""
    files = []
    for out in module(name).outputs(paths):
        files += sorted(p for p in out.rglob("*") if p.is_file()) if out.is_dir() else [out]
    return files


def record_outputs(name: str, paths) -> None:
    """Size and hash of each output file, so a resume can tell them from truncated or corrupted ones."""
    write_json(folder_records(output_files(name, paths), paths.dir), paths.outputs(name), indent=None)


def damaged_output(name: str, paths) -> str | None:
    """Why a stage that finished cannot be trusted (an output missing or changed since), or None. A stage
    whose outputs are checked when they are read (``checked_when_loaded``: a checkpoint's gigabytes) has
    only their sizes checked here."""
    for record in (paths.metrics(name), paths.outputs(name)):
        try:
            read_json(record)
        except (OSError, ValueError):
            return f"{record}: missing or unreadable"
    for out in module(name).outputs(paths):
        if not out.exists():
            return f"{out}: missing"
    hashed = not getattr(module(name), "checked_when_loaded", False)
    return first_changed(paths.dir, read_json(paths.outputs(name)), hashed)


def is_complete(name: str, step: int, layout: RunLayout) -> bool:
    """Whether the stage finished (its metrics file, written last, exists) with its outputs intact."""
    paths = layout.step(step_of(name, step))
    if not paths.metrics(name).is_file():
        return False
    problem = damaged_output(name, paths)
    if problem:
        log.warning("%s; stage %s of step %d runs again", problem, name, step_of(name, step))
    return problem is None


def reseed(config: RLTrainerConfig, name: str, step: int) -> None:
    """Seed every RNG from (seed, step, stage), so a stage draws the same numbers whatever ran before it in
    this process: a resumed run, which did not run the earlier stages, must match an uninterrupted one."""
    seed = (seeds.derive(config.seed, step) * len(SEEDED) + SEEDED.index(name)) % 2**32
    random.seed(seed)
    torch.manual_seed(seed)


def run_stage(name: str, config: RLTrainerConfig, step: int, engines, **given) -> dict:
    """Run one stage (``given``: what `rlx fit` hands it beyond the files, e.g. a checkpoint's host copy),
    then record its outputs and write its metrics (its wall time included) as the mark that it finished."""
    stage, step = module(name), step_of(name, step)
    paths = RunLayout(config.work_dir).step(step)
    faults.point(f"{name}.start")
    if getattr(stage, "draws_random_numbers", True):  # not from a background thread, whose RNGs are the run's
        reseed(config, name, step)
    cpu = time.process_time()
    try:
        with clock.part(name) as watch:
            metrics = run_where_it_belongs(stage, name, config, step, paths, engines, **given)
    except FileNotFoundError as exc:  # e.g. `rlx stage train` before the step's rollouts exist
        raise UserError(
            f"stage {name} of step {step}: an input is missing ({first_line(exc)}); run the stages before it "
            "first (`dvc repro` runs them in order)"
        ) from None
    metrics[f"time/{name}"] = watch.seconds
    if config.debug:  # the process's CPU seconds, its other threads' (a checkpoint written meanwhile) included
        metrics[f"time/{name}/cpu"] = time.process_time() - cpu
        log.debug(
            "stage %s of step %d: %.2f s, %.2f CPU s", name, step, metrics[f"time/{name}"], metrics[f"time/{name}/cpu"]
        )
    faults.point(f"{name}.metrics")
    with clock.part("record"):
        record_outputs(name, paths)
        write_json(metrics, paths.metrics(name), indent=None)
        refresh_curves(name, config, step)
    return metrics


def run_where_it_belongs(stage: ModuleType, name: str, config: RLTrainerConfig, step: int, paths, engines, **given):
    """A stage run where its module says: one that ``runs_where_the_policy_is`` by the policy's home (this
    process or every worker, rlx.workers.home), any other here."""
    if getattr(stage, "runs_where_the_policy_is", False):
        return engines.home.run(name, step)
    return stage.run(config, step, paths, engines, **given)


def refresh_curves(name: str, config: RLTrainerConfig, step: int) -> None:
    """Rebuild the curves a stage owns (idempotent: also called for a stage found complete on resume)."""
    after_run = getattr(module(name), "after_run", None)
    if after_run:
        after_run(config, RunLayout(config.work_dir), step_of(name, step))
