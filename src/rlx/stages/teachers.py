"""Stage ``teachers``: who teaches the run (on-policy distillation, ``teacher_config``), by fingerprint.

Output ``step-0/teachers.json``: per teacher, its source (a HF folder, or a run's work_dir and step) and
the fingerprint of its weights (rlx.training.teachers); ``{}`` without teachers. Each step's teacher
stage depends on it and refuses a teacher whose fingerprint has changed since, so a step's record names
the weights that scored it. (DVC takes no list of paths as a stage's deps, so the teachers' own files
are not this stage's: the fingerprint check stands in for them, and a changed teacher is refused
rather than silently scored again.)
"""

from __future__ import annotations

from rlx.config import RLTrainerConfig
from rlx.store.artifacts import write_json
from rlx.store.layout import StepPaths
from rlx.training.teachers import located

draws_random_numbers = False


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    records = {teacher.name: teacher.record() for teacher in located(config)}
    write_json(records, paths.teachers)
    return {"teacher/count": len(records)}


def outputs(paths) -> list:
    return [paths.teachers]
