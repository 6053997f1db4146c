"""Teachers of on-policy distillation (``teacher_config``): where each one's weights and tokenizer are,
the fingerprint that names it in the run's record, the checks made before a run writes anything, and
its model, loaded once for scoring.

A teacher is a HF folder (its files' hashes are its fingerprint) or a step of an rlx run (that step's
recorded weights fingerprint is), re-created from the run's checkpoint or by replaying its recorded
updates, as `rlx materialize` does, without writing a copy.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlx.config import RLTrainerConfig, TeacherItemConfig
from rlx.errors import UserError
from rlx.store.integrity import file_hash, folder_records
from rlx.store.layout import RunLayout
from rlx.training.loading import load_policy, load_tokenizer
from rlx.training.restore import config_to_read


@dataclass(frozen=True)
class Teacher:
    """A teacher found on disk: its model (a HF folder, or a run's work_dir with ``step``) and tokenizer."""

    name: str
    path: Path
    step: int | None
    tokenizer_path: Path
    model_path: Path  # the HF folder whose config and vocabulary the tokenizer is checked against
    field: str  # teacher_config.teachers.N, for messages

    def fingerprint(self) -> str:
        """What names this teacher's weights: the run step's recorded fingerprint, or the folder's files."""
        if self.step is not None:
            return file_hash(RunLayout(self.path).step(self.step).weights_fingerprint)
        files = sorted(p for p in self.path.iterdir() if p.is_file() and not p.name.startswith("."))
        return hashlib.sha256(json.dumps(folder_records(files, self.path), sort_keys=True).encode()).hexdigest()

    def record(self) -> dict:
        return {"path": str(self.path), "step": self.step, "fingerprint": self.fingerprint()}


def located(config: RLTrainerConfig) -> list[Teacher]:
    """The run's teachers as found on disk (none without ``teacher_config``), each refused in one line
    when it is missing, not a model, a step its run lacks, or the student itself."""
    if config.teacher_config is None:
        return []
    items = enumerate(config.teacher_config.teachers)
    return [locate(item, f"teacher_config.teachers.{i}", config) for i, item in items]


def locate(item: TeacherItemConfig, field: str, config: RLTrainerConfig) -> Teacher:
    path = Path(item.path)
    if not path.is_dir():
        raise UserError(f"{field}.path {path}: no such folder (a HF model folder, or an rlx run's work_dir with step)")
    if item.step is None:
        if not (path / "config.json").is_file():
            hint = " (an rlx run's work_dir: give its step)" if RunLayout(path).config.is_file() else ""
            raise UserError(f"{field}.path {path}: not a HF model folder, no config.json{hint}")
        teacher = Teacher(item.name, path, None, path, path, field)
        if path.resolve() == Path(config.load_from).resolve() or same_weights(path, Path(config.load_from)):
            raise UserError(f"{field}.path {path}: is the student's own model (load_from); a teacher must differ")
        return teacher
    layout = RunLayout(path)
    if not layout.config.is_file():
        raise UserError(f"{field}.path {path}: not an rlx run's work_dir (no config.yaml); with step, give a run")
    if path.resolve() == Path(config.work_dir).resolve():
        raise UserError(f"{field}.path {path}: is this run's own work_dir; the student cannot teach itself")
    if not layout.step(item.step).weights_fingerprint.is_file():
        trained = layout.steps_with("fingerprint.json")
        raise UserError(f"{field}.step {item.step}: {path} has no such step (its steps: {trained or 'none'})")
    run = config_to_read(path, replaying=False)
    return Teacher(item.name, path, item.step, Path(run.tokenizer_path), Path(run.load_from), field)


def same_weights(a: Path, b: Path) -> bool:
    """Whether two model folders hold the same weight files (a copy of the student is no teacher); hashed
    only when their sizes agree."""
    sizes = [sorted((p.name, p.stat().st_size) for p in folder.glob("*.safetensors")) for folder in (a, b)]
    if not sizes[0] or sizes[0] != sizes[1]:
        return False
    return all(file_hash(a / name) == file_hash(b / name) for name, _ in sizes[0])


def check_tokenizer(teacher: Teacher, student, config: RLTrainerConfig) -> None:
    """The teacher scores the student's token ids, so it must read them as the same tokens: the same
    vocabulary and chat template (rlx does not map between tokenizers)."""
    theirs = load_tokenizer(teacher.tokenizer_path, teacher.model_path)
    differs = [
        what
        for what, same in (
            ("vocabulary", theirs.get_vocab() == student.get_vocab()),
            ("chat template", theirs.chat_template == student.chat_template),
        )
        if not same
    ]
    if differs:
        raise UserError(
            f"{teacher.field} ({teacher.name}): its tokenizer {teacher.tokenizer_path} has another "
            f"{' and '.join(differs)} than the student's tokenizer_path {config.tokenizer_path}; a teacher must "
            "share the student's tokenizer"
        )


def load_teacher(teacher: Teacher, config: RLTrainerConfig, engines_for: Callable):
    """The teacher's model for scoring, frozen: a HF folder loaded as the run loads models, or a run's
    step through that run's own engines (``engines_for(config)``): its checkpoint, or replayed after the
    newest one before it, each step checked against its recorded fingerprint."""
    if teacher.step is None:
        return load_policy(teacher.path, config.rollout_config.dtype, strict=config.strict_load).requires_grad_(False)
    checkpointed = teacher.step in RunLayout(teacher.path).checkpoints()
    run = config_to_read(teacher.path, replaying=not checkpointed)
    if run.resources.num_workers > 1 and not checkpointed:
        raise UserError(
            f"{teacher.field}: step {teacher.step} of {teacher.path} has no checkpoint and that run trained on "
            f"{run.resources.num_workers} workers, whose updates replay bitwise only on as many; write it once "
            f"(`rlx materialize {teacher.path} --step {teacher.step} --out models/NAME`) and teach from that folder"
        )
    return engines_for(run).policy(teacher.step).requires_grad_(False).eval()
