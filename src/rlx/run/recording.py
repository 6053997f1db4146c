"""What becomes of a step once its stages ran: its checkpoint is written in a background thread, DVC
records it in a background process (behind that checkpoint), and once recorded the step is logged,
marked done (``done.json``) and older checkpoints are pruned. A step counts as done only once DVC has
recorded it, so a run killed before that records it again on resume.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rich.progress import Progress

from rlx.config import RLTrainerConfig
from rlx.engines import Engines
from rlx.lineage import experiment
from rlx.lineage.record import record_step, recorder
from rlx.run.resume import check_made_again
from rlx.run.tracking import Tracker
from rlx.stages import run_stage
from rlx.stages.checkpoint import is_due
from rlx.store import faults
from rlx.store.artifacts import read_json, write_json
from rlx.store.background import BackgroundWriter
from rlx.store.layout import RunLayout
from rlx.training.trainer import DEEPSPEED_TAG

MAX_UNRECORDED = 2  # steps run ahead of DVC's record before the run waits for it


@contextlib.contextmanager
def recording(config: RLTrainerConfig, params: Path, engines: Engines, total: int, finish: Finisher) -> Iterator:
    """The :class:`StepRecords` of a run's loop: its background checkpoints and DVC recorder, stopped
    when the loop ends; every step handed over is finished unless the loop failed."""
    checkpoints = BackgroundCheckpoints(config, engines)
    try:
        with recorder() as dvc:
            records = StepRecords(config, params, RunLayout(config.work_dir), total, checkpoints, dvc, finish)
            yield records
            records.finish_all()
    finally:
        checkpoints.close()


@dataclass
class StepRecords:
    """Hands each step to DVC's recorder, behind its checkpoint, and finishes the recorded ones in
    step order; at most ``MAX_UNRECORDED`` steps run ahead of the record."""

    config: RLTrainerConfig
    params: Path
    layout: RunLayout
    total: int
    checkpoints: BackgroundCheckpoints
    dvc: ProcessPoolExecutor  # the recorder process (rlx.lineage.record.recorder)
    finish: Finisher
    unrecorded: deque = field(default_factory=deque)  # (step, metrics, its record), oldest first

    def hand_over(self, step: int, metrics: dict) -> None:
        while self.unrecorded and (self.unrecorded[0][2].done() or len(self.unrecorded) >= MAX_UNRECORDED):
            self.finish(*self.unrecorded.popleft())
        newest = newest_checkpoint(self.config, self.layout, step, self.total)
        staleness = self.config.dataflow_config.max_staleness
        record = partial(self.dvc.submit, record_step, self.params, self.layout, step, newest, staleness)
        self.unrecorded.append((step, metrics, self.checkpoints.record_after(record)))

    def finish_all(self) -> None:
        while self.unrecorded:
            self.finish(*self.unrecorded.popleft())


def newest_checkpoint(config: RLTrainerConfig, layout: RunLayout, step: int, total: int) -> int:
    """The checkpoint a step's DVC record points at: its own if due, else the newest before it."""
    return step if is_due(config, step, total) else max([0, *layout.checkpoints(upto=step)])


class BackgroundCheckpoints:
    """Writes a step's checkpoint in a thread of its own while the next steps run: the trainer's state
    is first copied to host memory (``Engines.snapshot``, a memory copy; with several workers each rank
    copies its own and writes it itself), so even the next update need not wait for the disk. One write
    at a time: a checkpoint due while the previous one is still being written waits for it (so at most
    two copies are held). DVC's record of a step is queued (in another thread, in step order) behind its
    checkpoint, so a step is recorded (and done) only once its checkpoint is, and a long record never
    holds a checkpoint back."""

    def __init__(self, config: RLTrainerConfig, engines: Engines):
        self.config, self.engines = config, engines
        self.writer = BackgroundWriter("rlx-checkpoint")
        self.records = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlx-record")

    def start(self, step: int) -> dict[str, float]:
        """Copy step ``step``'s trainer state and start writing it; the seconds waited for the previous
        write and those the copy took."""
        waited = self.wait()
        started = time.perf_counter()
        snapshot = self.engines.home.start_checkpoint(step)
        copied = time.perf_counter() - started
        self.writer.start(run_stage, "checkpoint", self.config, step, self.engines, snapshot=snapshot)
        return {"time/checkpoint_wait": waited, "time/checkpoint_snapshot": copied}

    def wait(self) -> float:
        """Block until the pending checkpoint is on disk (its error, if any, raised here); the seconds waited."""
        return self.writer.wait()

    def record_after(self, record) -> Future:
        """Run ``record`` (a callable returning the record's Future) once the pending checkpoint is written."""
        written = self.writer.pending

        def when_written():
            if written is not None:
                written.result()  # a failed checkpoint is not recorded; its error stops the run at wait()
            return record().result()

        return self.records.submit(when_written)

    def close(self) -> None:
        self.writer.close()
        self.records.shutdown(wait=True)


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
        metrics["time/step/record"] = metrics.get("time/step/record", 0.0) + metrics["time/dvc"]
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
        self.announce(step, metrics)

    def announce(self, step: int, metrics: dict) -> None:
        """A line per finished step where the bar cannot redraw itself (a log file, CI, a notebook), as
        TRL and verl print theirs; a terminal has the bar."""
        console = self.progress.console
        if not console.is_terminal:
            total = next(task.total for task in self.progress.tasks if task.id == self.task)
            console.print(f"rlx fit: step {step}/{total:g}  {describe(metrics)}", highlight=False)


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


def describe(metrics: dict) -> str:
    """The progress bar's words for a finished step."""
    text = f"reward {metrics['response/rewards/mean']:.3f}  step {metrics['time/step']:.1f}s"
    if metrics.get("eval/evaluated"):
        text += f"  eval acc {metrics['eval/accuracy']:.3f}"
    return text
