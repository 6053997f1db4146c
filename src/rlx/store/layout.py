"""Where a run's artifacts live. ``dvc.yaml`` spells the same paths with ``${work_dir}/step-${run.step}``.

```
<work_dir>/
  step-0/fingerprint.json         base: the base model's weights fingerprint (rlx.lineage.fingerprint)
  step-0/eval_samples.parquet     the base policy's evaluation (evaluator_config.enable_initial_evaluate)
  step-0/teachers.json            teachers: each teacher's source and fingerprint (teacher_config; {} without)
  step-0/policy/, trainer_state/  checkpoint 0: the base model and an empty optimizer state, the root of replay
  step-N/prompts.parquet          prepare: the step's prompt groups
  step-N/rollouts.parquet         rollout: token ids, text, log-probs, finish reason, lengths
  step-N/judged.parquet           judge: rewards per judger and in total, extracted answers, correctness
  step-N/teacher.parquet          teacher: per response, the teacher's log-prob of each token (no rows without)
  step-N/update.parquet           train: per response, the reward, KL, advantage and importance weights the update used
  step-N/fingerprint.json         train: the fingerprint of the policy after the update
  step-N/policy/                  checkpoint (every checkpoint_interval and at the end): the policy (HF folder)
  step-N/trainer_state/           checkpoint: DeepSpeed optimizer and scheduler state
  step-N/eval_samples.parquet     evaluate (every evaluate_step and at the end; empty otherwise)
  step-N/export.json              export: where the HF export went (every hf_interval and at the end)
  step-N/<stage>_metrics.json     what each stage measured, its wall time included (written last)
  step-N/<stage>_outputs.json     size and hash of each file the stage wrote, checked on resume
  step-N/dvc.lock.gz              the DVC lock of the step (gzip): its lineage, kept after the step
  step-N/done.json                written last: the step is complete (with what the driver measured)
  curves/train.csv, curves/eval.csv   one row per step, for `dvc plots show`
  hf/step-N/                      HF exports (hf_max_keep retention)
  tracker.jsonl                   one JSON object per step (exp_tracker: jsonl; in log_dir when it is set)
  config.yaml                     the resolved configuration of the run
  fit.lock                        held by the `rlx fit` running here (pid, host, start, command)
```
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlx.errors import UserError
from rlx.store.integrity import first_changed

REMAKE = (
    "rlx reads a run's files only as it wrote them: restore it, or delete {step} and rerun `rlx fit` to make it again"
)
ITERATION = ["prepare", "rollout", "judge", "teacher", "train", "checkpoint", "evaluate", "export"]  # every step's
STAGES = ["base", "teachers", *ITERATION]  # base, teachers: step 0, the starting policy and who teaches it
SETUP = ("base", "teachers")  # the stages of step 0 (besides its checkpoint)
POLICY_MARKS = ("config.json", "adapter_config.json")  # a policy folder: a full model, or a LoRA adapter


def read_record(path: Path) -> dict:
    """A run's small JSON record (metrics, outputs, marks), or one line saying it is unreadable."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: unreadable ({exc}); it was damaged after rlx wrote it") from None
    if not isinstance(record, dict):
        raise UserError(f"{path}: unreadable (not a JSON object); it was damaged after rlx wrote it")
    return record


def step_number(folder: Path) -> int:
    """The step a ``step-N`` folder (a step's, or an HF export's) belongs to."""
    return int(Path(folder).name.removeprefix("step-"))


def _file(name: str) -> property:
    return property(lambda self: self.dir / name, doc=f"``{name}`` in the step's folder")


@dataclass(frozen=True)
class StepPaths:
    dir: Path

    prompts = _file("prompts.parquet")
    run_length = _file("run_length.json")  # the run's length in steps, as prepare computed it
    rollouts = _file("rollouts.parquet")
    judged = _file("judged.parquet")
    teachers = _file("teachers.json")  # step 0's: who teaches the run
    teacher = _file("teacher.parquet")
    update = _file("update.parquet")
    weights_fingerprint = _file("fingerprint.json")
    policy = _file("policy")
    trainer_state = _file("trainer_state")
    eval_samples = _file("eval_samples.parquet")
    export_record = _file("export.json")
    lock = _file("dvc.lock.gz")
    done = _file("done.json")

    @property
    def number(self) -> int:
        """The step's number, from its folder's name (``step-N``)."""
        return step_number(self.dir)

    @property
    def run(self) -> RunLayout:
        """The run this step belongs to: its other steps, curves and exports."""
        return RunLayout(self.dir.parent)

    def recorded_length(self) -> int:
        """The run's length as this step's prepare recorded it: what the stages after it read, so that
        DVC sees it as their input."""
        return json.loads(self.run_length.read_text())["total_steps"]

    def metrics(self, stage: str) -> Path:
        """``<stage>_metrics.json``: what the stage measured, its own wall time included."""
        return self.dir / f"{stage}_metrics.json"

    def outputs(self, stage: str) -> Path:
        """``<stage>_outputs.json``: size and hash of each file the stage wrote (written just before its metrics)."""
        return self.dir / f"{stage}_outputs.json"

    def checked(self, path: Path) -> Path:
        """``path``, a file of this step, once it is what its stage recorded writing (size and hash,
        rlx.store.integrity): what rlx reads back from a run is what it wrote, or it is refused in one line."""
        relative = Path(path).relative_to(self.dir).as_posix()
        for stage in STAGES:
            records = read_record(self.outputs(stage)) if self.outputs(stage).is_file() else {}
            if relative in records:
                if problem := first_changed(self.dir, {relative: records[relative]}):
                    raise UserError(f"{problem}; {REMAKE.format(step=self.dir)}")
                return Path(path)
        raise UserError(f"{path}: no stage of {self.dir.name} recorded writing it; {REMAKE.format(step=self.dir)}")

    def recorded_md5(self, path: Path) -> str | None:
        """The md5 this step's DVC record (its lock copy) gives ``path``, a file of any step, or None."""
        lock = yaml.CSafeLoader(gzip.decompress(self.lock.read_bytes())).get_single_data() or {}
        wanted = Path(path).parts[-2:]  # the lock names paths from the project's folder: match step-N/NAME
        for stage in lock.get("stages", {}).values():
            for entry in [*stage.get("deps", []), *stage.get("outs", [])]:
                if Path(entry["path"]).parts[-2:] == wanted:
                    return entry.get("md5")
        return None

    def metrics_checked(self, stage: str) -> dict:
        """A stage's metrics, once they are what DVC recorded for the step (when it has recorded it)."""
        path = self.metrics(stage)
        record = read_record(path)
        if self.lock.is_file() and self.recorded_md5(path) not in (None, hashlib.md5(path.read_bytes()).hexdigest()):
            raise UserError(f"{path}: not what DVC recorded for the step (edited?); {REMAKE.format(step=self.dir)}")
        return record


@dataclass(frozen=True)
class RunLayout:
    work_dir: Path

    def step(self, number: int) -> StepPaths:
        return StepPaths(Path(self.work_dir) / f"step-{number}")

    def steps_with(self, filename: str) -> list[int]:
        """Steps whose folder holds ``filename``, in order."""
        found = [step_number(p.parent) for p in Path(self.work_dir).glob(f"step-*/{filename}")]
        return sorted(found)

    def stage_metrics(self, step: int) -> dict:
        """What the iteration's stages measured at ``step``: their metrics files merged in stage order."""
        merged = {}
        for name in ITERATION:
            merged.update(self.step(step).metrics_checked(name))
        return merged

    def step_metrics(self, step: int) -> dict:
        """All a completed step measured: its stages' metrics, then what its ``done.json`` adds (what the
        driver measured: the step's time, its waits, DVC's record)."""
        return {**self.stage_metrics(step), **read_record(self.step(step).done)}

    def completed_steps(self) -> list[int]:
        """Steps whose ``done.json`` exists, in order."""
        return self.steps_with("done.json")

    def checkpoints(self, upto: int | None = None) -> list[int]:
        """Steps holding a finished checkpoint (at or before ``upto``), in order: its stage's metrics
        (written last) say it saved, and every file it recorded is there at its size (retention prunes
        old ones; a damaged one is not a checkpoint until its stage has written it again)."""
        # only steps that wrote weights: a model's config.json, or a LoRA adapter's adapter_config.json
        folders = {path.parent for name in POLICY_MARKS for path in Path(self.work_dir).glob(f"step-*/policy/{name}")}
        steps = sorted(step_number(path.parent) for path in folders)
        return [step for step in steps if (upto is None or step <= upto) and self.holds_checkpoint(step)]

    def holds_checkpoint(self, step: int) -> bool:
        paths = self.step(step)
        try:
            saved = json.loads(paths.metrics("checkpoint").read_text()).get("checkpoint/saved")
            files = json.loads(paths.outputs("checkpoint").read_text())
        except (OSError, ValueError):
            return False
        return bool(saved) and first_changed(paths.dir, files, hashed=False) is None

    @property
    def curves(self) -> Path:
        return Path(self.work_dir) / "curves"

    @property
    def config(self) -> Path:
        """The resolved configuration `rlx fit` ran with (written at each start)."""
        return Path(self.work_dir) / "config.yaml"

    def hf_export(self, number: int) -> Path:
        return Path(self.work_dir) / "hf" / f"step-{number}"
