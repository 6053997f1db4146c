"""`rlx fit`: the whole run, step after step through the pipeline's stages, resumable at any point.

The driver is not a second pipeline: it calls the same ``run_stage`` that `rlx stage NAME` (and so
``dvc repro``) calls, but in one process, so models stay loaded between stages and steps and a
checkpoint is written in the background while the next step rolls out. After each step it commits
the step to DVC, so the lock records exactly what ``dvc repro`` would have, and keeps a copy of that
lock in the step's folder for per-step lineage.

Resume: a step is finished when ``step-N/done.json`` exists, a stage when its metrics file does and
its outputs are intact. A rerun skips both and redoes only what was interrupted (or found damaged,
and what follows it in its step); the policy of a step without a checkpoint is re-created by
replaying the recorded updates after the last one. Every stage is deterministic in its inputs and
the run's seed, so the result equals an uninterrupted run, wherever the run was killed
(tests/test_resume.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlx.config import RLTrainerConfig, load
from rlx.engines import Engines
from rlx.errors import UserError
from rlx.lineage import dvcdeps, experiment
from rlx.lineage.record import (
    edit_params,
    fault_point_inside_dvc_writes,
    point_at_step,
    record_step,
    recorder,
    repair_dvc_files,
)
from rlx.run import preflight
from rlx.run.tracking import Tracker
from rlx.stages import damaged_output, is_complete, refresh_curves, run_stage
from rlx.stages.checkpoint import is_due
from rlx.stages.train import clip_cannot_act, replay
from rlx.store import faults
from rlx.store.artifacts import read_json, write_json, write_text
from rlx.store.layout import ITERATION, RunLayout
from rlx.training.trainer import DEEPSPEED_TAG

log = logging.getLogger(__name__)


INPUT_STAGES = ["convert_gsm8k", "convert_math500"]  # cheap: the public sets in rlx's row shape
MAX_UNRECORDED = 2  # steps run ahead of DVC's record before the run waits for it


def ensure_inputs(config: RLTrainerConfig) -> None:
    """Bring the stages upstream of the iteration up to date through DVC, so a run leaves the whole
    pipeline clean: the public sets always, the demo's data and base model when this run uses them."""
    generated = [config.synthetic_task.output_dir, config.tiny_model.output_dir]
    used = [config.load_from, *(d.anno_path for d in config.replay_buffer_config.dataset_cfg)]
    uses_demo = any(Path(p).resolve().is_relative_to(Path(g).resolve()) for p in used for g in generated)
    targets = [*INPUT_STAGES, *(["init_model"] if uses_demo else [])]
    from dvc.cli import main as dvc_main

    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    fault_point_inside_dvc_writes("inputs.dvc_write")
    with dvc_errors() as errors:
        status = dvc_main(["repro", "--quiet", *targets])
    logging.getLogger("dvc").setLevel(logging.WARNING)  # DVC's CLI set its logger up for itself
    if status != 0:
        reason = f": {errors[0]}" if errors else ""
        raise UserError(f"bringing the run's inputs up to date failed (`dvc repro {' '.join(targets)}`){reason}")


@contextlib.contextmanager
def dvc_errors():
    """The first lines of the errors DVC logs meanwhile: its own words for why it failed."""
    errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage().strip().splitlines()[0])
    logging.getLogger("dvc").addHandler(handler)
    try:
        yield errors
    finally:
        logging.getLogger("dvc").removeHandler(handler)


def first_step_to_run(config: RLTrainerConfig, engines: Engines) -> int:
    """The step after the last finished one, or that one again if an output of it was damaged since
    (the next step starts from its fingerprint and, if it wrote one, its checkpoint)."""
    done = engines.layout.completed_steps()
    if done and not config.auto_resume:
        raise UserError(
            f"work_dir {config.work_dir} already holds a run (steps up to {done[-1]}); set auto_resume: true "
            "to continue it or choose another work_dir"
        )
    if not done:
        return 1
    last = engines.layout.step(done[-1])
    return done[-1] + 1 if all(damaged_output(name, last) is None for name in ITERATION) else done[-1]


def steps_to_run(layout: RunLayout, start: int, total: int) -> tuple[list[int], set[int]]:
    """The steps to run and, of them, those made again: a finished step whose folder was deleted (the
    steps after it are kept: a step is deterministic in its inputs, so it comes back as it was, which
    :func:`check_made_again` verifies) and then, if the run had finished, its last step, recorded
    again: DVC's record points at the end of the run, with what params.yaml says now)."""
    done = layout.completed_steps()
    missing = [n for n in range(1, done[-1]) if n not in set(done)] if done else []
    if missing:
        log.warning("%s: step %s missing; making it again", layout.work_dir, ", ".join(map(str, missing)))
    again = [*missing, *([done[-1]] if done and start > total else [])]
    return [*again, *range(start, total + 1)], set(again)


def check_made_again(layout: RunLayout, step: int) -> None:
    """A step made again must equal the one the next step was made from (its lineage has the hash)."""
    if not layout.step(step + 1).lock.is_file():
        return
    fingerprint = layout.step(step).weights_fingerprint
    expected = layout.step(step + 1).recorded_md5(fingerprint)
    if expected and expected != hashlib.md5(fingerprint.read_bytes()).hexdigest():
        raise UserError(
            f"step {step} was made again but differs from the step {step + 1} was made from (its {fingerprint.name}); "
            "the run is not deterministic here (see README: Lineage); start it again in a new work_dir"
        )


def prune_checkpoints(config: RLTrainerConfig, layout: RunLayout, step: int) -> None:
    """Once ``step`` is done: of the checkpoints up to it, keep checkpoint 0 (the base model, the root of
    any replay) and the newest ``checkpoint_maxkeep`` others; drop the older ones' weights. Under
    ``checkpoint_no_save_optimizer`` every one but the newest also loses its optimizer state (only the
    newest can resume the run). Later checkpoints, maybe still being written, are left alone."""
    done = layout.checkpoints(upto=step)
    later = [k for k in done if k > 0]
    keep = config.checkpoint_maxkeep
    for number in later[: max(0, len(later) - keep)] if keep > 0 else []:
        shutil.rmtree(layout.step(number).policy, ignore_errors=True)
        shutil.rmtree(layout.step(number).trainer_state, ignore_errors=True)
    if config.checkpoint_no_save_optimizer:
        for number in later[:-1]:
            shutil.rmtree(layout.step(number).trainer_state / DEEPSPEED_TAG, ignore_errors=True)


class BackgroundCheckpoints:
    """Writes a step's checkpoint in a thread of its own while the next steps run: the trainer's state
    is first copied to host memory (``PolicyTrainer.snapshot``, a memory copy), so even the next update
    need not wait for the disk. One write at a time: a checkpoint due while the previous one is still
    being written waits for it (so at most two copies are held). DVC's record of a step is queued (in
    another thread, in step order) behind its checkpoint, so a step is recorded (and done) only once
    its checkpoint is, and a long record never holds a checkpoint back."""

    def __init__(self, config: RLTrainerConfig, engines: Engines):
        self.config, self.engines = config, engines
        self.saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlx-checkpoint")
        self.records = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlx-record")
        self.pending: Future | None = None

    def start(self, step: int) -> dict[str, float]:
        """Copy step ``step``'s trainer state and start writing it; the seconds waited for the previous
        write and those the copy took."""
        waited = self.wait()
        started = time.perf_counter()
        self.engines.snapshots[step] = self.engines.trainer(step).snapshot(self.engines.tokenizer)
        copied = time.perf_counter() - started
        self.pending = self.saver.submit(run_stage, "checkpoint", self.config, step, self.engines)
        return {"time/checkpoint_wait": waited, "time/checkpoint_snapshot": copied}

    def wait(self) -> float:
        """Block until the pending checkpoint is on disk (its error, if any, raised here); the seconds waited."""
        started = time.perf_counter()
        if self.pending is not None:
            self.pending.result()
        return time.perf_counter() - started

    def record_after(self, record) -> Future:
        """Run ``record`` (a callable returning the record's Future) once the pending checkpoint is written."""
        written = self.pending

        def when_written():
            if written is not None:
                written.result()  # a failed checkpoint is not recorded; its error stops the run at wait()
            return record().result()

        return self.records.submit(when_written)

    def close(self) -> None:
        self.saver.shutdown(wait=True)
        self.records.shutdown(wait=True)


def run_step(config: RLTrainerConfig, step: int, engines: Engines, checkpoints: BackgroundCheckpoints) -> dict:
    """Every stage of one step from the first one not complete on (a due checkpoint in the background);
    returns the step's merged metrics, the checkpoint's still to come."""
    metrics, rerun = {"time/checkpoint_wait": 0.0, "time/checkpoint_snapshot": 0.0}, False
    engines.replay_seconds = 0.0
    for name in ITERATION:
        rerun = rerun or not is_complete(name, step, engines)
        if not rerun:
            refresh_curves(name, config, step, engines)
            metrics.update(read_json(engines.layout.step(step).metrics(name)))
        elif name == "checkpoint" and config.resources.num_workers == 1 and is_due(config, step, engines.total_steps):
            metrics.update(checkpoints.start(step))
        else:
            metrics.update(run_stage(name, config, step, engines))
    metrics["time/replay"] = engines.replay_seconds
    return metrics


def newest_checkpoint(config: RLTrainerConfig, layout: RunLayout, step: int, total: int) -> int:
    """The checkpoint a step's DVC record points at: its own if due, else the newest before it."""
    return step if is_due(config, step, total) else max([0, *layout.checkpoints(upto=step)])


def debug_rollout(config: RLTrainerConfig, params: Path, step: int, engines: Engines, console: Console) -> dict:
    """``debug_rollout``: prepare, roll out and judge one step, then stop, to check sampling and rewards."""
    point_at_step(params, step, newest_checkpoint(config, engines.layout, step - 1, engines.total_steps))
    run_base(config, engines)
    metrics = {
        k: v for name in ("prepare", "rollout", "judge") for k, v in run_stage(name, config, step, engines).items()
    }
    console.print_json(data=metrics)
    return metrics


def run_base(config: RLTrainerConfig, engines: Engines) -> None:
    """Step 0: the base model's fingerprint and evaluation, then checkpoint 0 (unless already done)."""
    for name in ("base", "checkpoint"):
        if not is_complete(name, 0, engines):
            run_stage(name, config, 0, engines)


def fit(params: Path, overrides: list[str], console: Console | None = None) -> list[dict]:
    """Run (or resume) the run described by ``params``; returns each step's metrics.

    Paths in params.yaml are relative to its folder (as for `dvc repro`), so the run happens there.
    Everything is checked before anything is written (rlx.run.preflight); a run refused while it sets up
    leaves params.yaml as it was and removes the work_dir it created.
    """
    params = Path(params).resolve()
    config = load(params, overrides)
    console = console or Console()
    with preflight.entered(params, config) as existed:
        with undone_if_refused(params, config.work_dir, existed):
            config, engines, start = set_up(params, overrides)
        history = run_steps(config, params, engines, start, console)
        if not config.debug_rollout:
            save_as_experiment(params.parent, config.work_dir, console)
        return history


def save_as_experiment(project: Path, work_dir: Path, console: Console) -> None:
    """The finished run as a DVC experiment named after its folder (rlx.lineage.experiment), or why it is not one."""
    name = Path(work_dir).name
    try:
        commit = experiment.save(project, name)
    except ValueError as reason:
        log.warning("the run is not saved as a DVC experiment: %s", reason)
        return
    console.print(f"saved as DVC experiment {name} ({commit[:7]}): see `dvc exp show` and `dvc exp diff`")


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


def set_up(params: Path, overrides: list[str]) -> tuple[RLTrainerConfig, Engines, int]:
    """params.yaml edited, the pipeline's inputs brought up to date, the step to start from found."""
    if overrides:
        edit_params(params, overrides)
    config = load(params)
    if (params.parent / "dvc.yaml").is_file():
        dvcdeps.sync(params.parent / "dvc.yaml", config)  # e.g. a dataset added to a dataset_cfg list
    repair_dvc_files(params.parent, RunLayout(config.work_dir))
    ensure_inputs(config)
    if reason := clip_cannot_act(config):
        log.warning(reason)
    engines = Engines(config, replay)
    return config, engines, first_step_to_run(config, engines)


def run_steps(config: RLTrainerConfig, params: Path, engines: Engines, start: int, console: Console) -> list[dict]:
    layout, total = engines.layout, engines.total_steps
    if config.debug_rollout:
        return [debug_rollout(config, params, start, engines, console)]
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    preflight.record_configuration(config)
    tracker = Tracker(config, first_step=0 if start == 1 else start)
    try:
        if start == 1:
            point_at_step(params, 1, 0)
            run_base(config, engines)
            tracker.log(0, read_json(layout.step(0).metrics("base")))
        with progress_bar(console) as progress:
            steps, again = steps_to_run(layout, start, total)
            task = progress.add_task("", total=total, completed=start - 1)
            finish = Finisher(config, layout, params.parent, tracker, again, progress, task)
            # DVC records step N in the background while the next steps run (behind N's checkpoint, if it
            # writes one; a checkpoint's hash can outlast a step); a step counts as done (done.json) only
            # once recorded, so a run killed before that re-records it on resume.
            checkpoints = BackgroundCheckpoints(config, engines)
            try:
                with recorder() as dvc:
                    unrecorded: deque = deque()  # (step, metrics, its record), oldest first
                    for step in steps:
                        started = time.perf_counter()
                        metrics = run_step(config, step, engines, checkpoints)
                        metrics["time/step"] = time.perf_counter() - started
                        while unrecorded and (unrecorded[0][2].done() or len(unrecorded) >= MAX_UNRECORDED):
                            finish(*unrecorded.popleft())
                        newest = newest_checkpoint(config, layout, step, total)
                        record = partial(dvc.submit, record_step, params, layout, step, newest)
                        unrecorded.append((step, metrics, checkpoints.record_after(record)))
                    while unrecorded:
                        finish(*unrecorded.popleft())
            finally:
                checkpoints.close()
    finally:
        tracker.close()
    return finish.history


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


@dataclass
class Finisher:
    """Ends each step once DVC recorded it: logs it (or checks a step made again), marks it done, prunes."""

    config: RLTrainerConfig
    layout: RunLayout
    project: Path
    tracker: Tracker
    again: set[int]  # steps made again: already logged, checked against their lineage instead
    progress: Progress
    task: int
    history: list[dict] = field(default_factory=list)

    def __call__(self, step: int, metrics: dict, recorded: Future) -> None:
        waited = time.perf_counter()
        try:
            metrics.update(recorded.result())  # time/dvc_commit, time/dvc_commit_cpu
        except BrokenProcessPool as error:
            raise RuntimeError(f"the process recording step {step} in DVC died; rerun to resume") from error
        metrics["time/dvc"] = time.perf_counter() - waited  # what the step waited for DVC
        metrics["time/step"] += metrics["time/dvc"]
        metrics.update(read_json(self.layout.step(step).metrics("checkpoint")))
        if step in self.again:
            check_made_again(self.layout, step)
        else:
            self.tracker.log(step, metrics)
        staged = self.layout.stage_metrics(step)  # done.json keeps the rest: each metric is kept once
        driver = {key: value for key, value in metrics.items() if key not in staged or staged[key] != value}
        write_json(driver, self.layout.step(step).done, indent=None)
        experiment.write_summary(self.project, self.layout, step)
        faults.point("step.prune")
        prune_checkpoints(self.config, self.layout, step)
        self.history.append(metrics)
        self.progress.update(self.task, advance=0 if step in self.again else 1, description=describe(metrics))


def describe(metrics: dict) -> str:
    text = f"reward {metrics['response/rewards/mean']:.3f}  step {metrics['time/step']:.1f}s"
    if metrics.get("eval/evaluated"):
        text += f"  eval acc {metrics['eval/accuracy']:.3f}"
    return text
