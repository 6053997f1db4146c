"""Where a run picks up: params.yaml and DVC's files set for it, the pipeline's inputs brought up to
date through DVC, the first step to run (after the last finished one, or that one again if an output of
it was damaged since), and the steps made again, which must come back as they were.

A step is finished when ``step-N/done.json`` exists, a stage when its metrics file does and its
outputs are intact; a rerun skips both and redoes only what was interrupted (or found damaged, and
what follows it in its step).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from pathlib import Path

from rlx.config import RLTrainerConfig, load
from rlx.errors import UserError
from rlx.lineage import dvcdeps
from rlx.lineage.record import edit_params, fault_point_inside_dvc_writes, repair_dvc_files
from rlx.run.ahead import staleness_advice
from rlx.stages import damaged_output
from rlx.stages.rollout import off_policy_advice
from rlx.stages.train import clip_cannot_act
from rlx.store.layout import ITERATION, RunLayout

log = logging.getLogger(__name__)

INPUT_STAGES = ["convert_gsm8k", "convert_math500"]  # cheap: the public sets in rlx's row shape


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


def first_step_to_run(config: RLTrainerConfig, layout: RunLayout) -> int:
    """The step after the last finished one, or that one again if an output of it was damaged since
    (the next step starts from its fingerprint and, if it wrote one, its checkpoint)."""
    done = layout.completed_steps()
    if done and not config.auto_resume:
        raise UserError(
            f"work_dir {config.work_dir} already holds a run (steps up to {done[-1]}); set auto_resume: true "
            "to continue it or choose another work_dir"
        )
    if not done:
        return 1
    last = layout.step(done[-1])
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


def set_up(params: Path, overrides: list[str], overridden: RLTrainerConfig) -> tuple[RLTrainerConfig, int]:
    """params.yaml edited (to ``overridden``, the config the overrides make), DVC's files repaired, the
    pipeline's inputs brought up to date, the step to start from found."""
    if overrides:  # with the run pointer they move (rlx.config.loading.follow_the_run_pointer)
        edit_params(params, [*overrides, f"run.rollout_policy={overridden.run.rollout_policy}"])
    config = load(params)
    if (params.parent / "dvc.yaml").is_file():
        dvcdeps.sync(params.parent / "dvc.yaml", config)  # e.g. a dataset added to a dataset_cfg list
    repair_dvc_files(params.parent, RunLayout(config.work_dir))
    ensure_inputs(config)
    for advice in (clip_cannot_act(config), staleness_advice(config), off_policy_advice(config)):
        if advice:
            log.warning(advice)
    return config, first_step_to_run(config, RunLayout(config.work_dir))
