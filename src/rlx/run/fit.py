"""`rlx fit`: the whole run, step after step through the pipeline's stages, resumable at any point.

For each step: run its stages, start its checkpoint if one is due, and hand the step to the recorder,
which commits it to DVC in the background (rlx.run.recording). The stages are the very ``run_stage``
that `rlx stage NAME` (and so ``dvc repro``) calls, but in one process, so models stay loaded between
stages and steps. A rerun picks up after the last finished step (rlx.run.resume); every stage is
deterministic in its inputs and the run's seed, so the result equals an uninterrupted run wherever the
run was killed (tests/test_resume.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlx import clock
from rlx.config import RLTrainerConfig, load
from rlx.engines import Engines
from rlx.errors import UserError
from rlx.lineage import experiment, workspace
from rlx.lineage.record import point_at_step
from rlx.run import preflight
from rlx.run.ahead import RolloutsAhead
from rlx.run.recording import BackgroundCheckpoints, Finisher, newest_checkpoint, recording
from rlx.run.resume import set_up, steps_to_run
from rlx.run.tracking import Tracker
from rlx.stages import is_complete, refresh_curves, run_stage
from rlx.stages.checkpoint import is_due
from rlx.store.artifacts import read_json, write_text
from rlx.store.layout import ITERATION, SETUP, RunLayout
from rlx.tasks.data import run_length
from rlx.workers.group import warm_engines
from rlx.workers.home import take_counters

log = logging.getLogger(__name__)


def fit(params: Path, overrides: list[str], console: Console | None = None) -> list[dict]:
    """Run (or resume) the run described by ``params``; returns each step's metrics.

    Paths in params.yaml are relative to its folder (as for `dvc repro`), so the run happens there.
    Everything is checked before anything is written (rlx.run.preflight); a run refused while it sets up
    leaves params.yaml as it was and removes the work_dir it created.
    """
    params = Path(params).resolve()
    config = load(params, overrides)
    console = console or Console()
    with preflight.entered(params, config) as existed, contextlib.ExitStack() as warm:
        with undone_if_refused(params, config.work_dir, existed):
            config, start = set_up(params, overrides, config)
            if note := workspace.differences_from_committed(params, config):
                console.print(note, highlight=False)
            engines = warm.enter_context(warm_engines(config))  # several workers: started here, kept for the run
        if config.debug_rollout:
            return [debug_rollout(config, params, start, engines, console)]
        history = run_steps(config, params, engines, start, console)
        save_as_experiment(params.parent, config.work_dir, console)
        return history


def run_steps(config: RLTrainerConfig, params: Path, engines: Engines, start: int, console: Console) -> list[dict]:
    """Step 0 (the base model) if the run is new, then for each step: start the rollouts it makes ahead
    (rlx.run.ahead), run its stages, start its checkpoint if one is due, hand the step to the recorder."""
    layout, total = RunLayout(config.work_dir), run_length(config, engines.prompt_pool)
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    preflight.record_configuration(config)
    tracker = Tracker(config, first_step=0 if start == 1 else start)
    try:
        if start == 1:
            point_at_step(params, 1, 0, config.dataflow_config.max_staleness)
            run_base(config, engines)
            tracker.log(0, read_json(layout.step(0).metrics("base")))
        steps, again = steps_to_run(layout, start, total)
        if start > total:
            console.print(
                f"{config.work_dir} holds every step of this run ({total}) already: its last step is checked and "
                "recorded again, and the finished run returned; for a new run, give another work_dir"
            )
        with progress_bar(console) as progress:
            task = progress.add_task("", total=total, completed=start - 1)
            finish = Finisher(config, layout, params.parent, tracker, again, progress, task)
            ahead = RolloutsAhead(config, engines, total)
            with contextlib.closing(ahead), recording(config, params, engines, total, finish) as records:
                for step in steps:
                    records.hand_over(step, clocked_step(config, step, total, engines, ahead, records.checkpoints))
        return finish.history
    finally:
        tracker.close()


def clocked_step(
    config: RLTrainerConfig,
    step: int,
    total: int,
    engines: Engines,
    ahead: RolloutsAhead,
    checkpoints: BackgroundCheckpoints,
) -> dict:
    """One step: the rollouts it makes ahead, its stages; its metrics with ``time/step`` and where that
    time went (``time/step/<part>``, rlx.clock; the wait for DVC's record is added when the step ends)."""
    with clock.step() as parts:
        started = time.perf_counter()
        ahead.start(step)
        metrics = run_step(config, step, total, engines, checkpoints)
        with clock.part("rollout"):  # rollouts made in the background: what the step waits for them
            metrics.update(ahead.wait())
        metrics.update(take_counters(engines))
        metrics["time/step"] = time.perf_counter() - started
    return metrics | clock.breakdown(metrics["time/step"], parts)


def run_step(config: RLTrainerConfig, step: int, total: int, engines: Engines, checkpoints: BackgroundCheckpoints):
    """Every stage of one step from the first one not complete on (a due checkpoint in the background);
    returns the step's merged metrics, the checkpoint's still to come."""
    metrics, rerun = {"time/checkpoint_wait": 0.0, "time/checkpoint_snapshot": 0.0}, False
    engines.replay_seconds = 0.0
    layout = RunLayout(config.work_dir)
    for name in ITERATION:
        rerun = rerun or not is_complete(name, step, layout)
        if not rerun:
            refresh_curves(name, config, step)
            metrics.update(read_json(layout.step(step).metrics(name)))
        elif name == "checkpoint" and is_due(config, step, total):
            with clock.part("checkpoint"):  # the host copy, and any wait for the previous write
                metrics.update(checkpoints.start(step))
        else:
            metrics.update(run_stage(name, config, step, engines))
    metrics["time/replay"] = engines.replay_seconds
    return metrics


def run_base(config: RLTrainerConfig, engines: Engines) -> None:
    """Step 0: the base model's fingerprint and evaluation, who teaches the run, then checkpoint 0 (unless
    already done)."""
    for name in (*SETUP, "checkpoint"):
        if not is_complete(name, 0, RunLayout(config.work_dir)):
            run_stage(name, config, 0, engines)


def debug_rollout(config: RLTrainerConfig, params: Path, step: int, engines: Engines, console: Console) -> dict:
    """``debug_rollout``: prepare, roll out and judge one step, then stop, to check sampling and rewards."""
    total = run_length(config, engines.prompt_pool)
    checkpoint = newest_checkpoint(config, RunLayout(config.work_dir), step - 1, total)
    point_at_step(params, step, checkpoint, config.dataflow_config.max_staleness)
    run_base(config, engines)
    metrics = {
        k: v for name in ("prepare", "rollout", "judge") for k, v in run_stage(name, config, step, engines).items()
    }
    console.print_json(data=metrics)
    return metrics


@contextlib.contextmanager
def undone_if_refused(params: Path, work_dir: Path, existed: bool):
    """On a UserError inside: params.yaml back as it was, and the work_dir removed if this run made it."""
    text = params.read_text()
    try:
        yield
    except UserError:
        if params.read_text() != text:
            write_text(text, params)
        if not existed:
            shutil.rmtree(work_dir, ignore_errors=True)
        raise


def save_as_experiment(project: Path, work_dir: Path, console: Console) -> None:
    """The finished run as a DVC experiment named after its folder (rlx.lineage.experiment), or why it is not one."""
    try:
        name, commit = experiment.save(project, work_dir)
    except ValueError as reason:
        log.warning("the run is not saved as a DVC experiment: %s", reason)
        return
    console.print(f"saved as DVC experiment {name} ({commit[:7]}): see `dvc exp show` and `dvc exp diff`")


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]rlx fit"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
        transient=False,
    )
