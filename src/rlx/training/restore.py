"""A checkpoint read back, and trusted only once checked: its files against the hashes their writer
recorded, its weights against the fingerprint the step recorded. ``rlx.engines.Engines`` restores a
trainer from here and brings it forward by replay."""

from __future__ import annotations

import logging
from pathlib import Path

from rlx import seeds
from rlx.config import RLTrainerConfig, load
from rlx.errors import UserError
from rlx.lineage.fingerprint import fingerprint, first_difference, parameter_names
from rlx.store.artifacts import read_json
from rlx.store.integrity import first_changed
from rlx.store.layout import RunLayout
from rlx.training.trainer import DEEPSPEED_TAG, PolicyTrainer

log = logging.getLogger(__name__)


def config_to_read(work_dir: Path, replaying: bool, overrides: tuple[str, ...] = ()) -> RLTrainerConfig:
    """The configuration a run was made with, set to read or re-create its policies in this process (`rlx
    materialize`, a distillation teacher): without its judge actors or rollout workers, and, when only a
    checkpoint is read (not ``replaying``), without its workers; a replay keeps as many workers as the run
    trained on (summed over that many ranks, its updates replay bitwise only there)."""
    alone = [f"work_dir={work_dir}", "cpu_resources=null", "resources.num_rollout_workers=0"]
    alone.append("display_all_workers_log=false")  # a run whose only actors were those has none here
    if not replaying:
        alone += ["resources.num_workers=1", "resources.ray_address=null"]
    return load(RunLayout(work_dir).config, [*alone, *overrides])


def has_optimizer_state(paths) -> bool:
    """Whether a checkpoint can start a replay: step 0's optimizer state is the empty one."""
    return paths.dir.name == "step-0" or (paths.trainer_state / DEEPSPEED_TAG).is_dir()


def replay_root(layout: RunLayout, step: int) -> int:
    """The newest checkpoint at or before ``step`` that a replay can start from (it has the optimizer
    state; step 0's is the empty one)."""
    roots = [k for k in layout.checkpoints(upto=step) if has_optimizer_state(layout.step(k))]
    return roots[-1] if roots else 0  # the base model with a fresh optimizer, checkpoint 0 or not


def checkpointed_trainer(config: RLTrainerConfig, step: int, total_steps: int, base: Path) -> PolicyTrainer:
    """The trainer of a checkpoint, its weights (DeepSpeed's copy in ``trainer_state``, which it loads
    over the HF folder's) checked against the step's recorded fingerprint (step 0 without its
    checkpoint: ``base`` with a fresh optimizer); its LR schedule spans ``total_steps``."""
    layout = RunLayout(config.work_dir)
    paths = layout.step(step)
    if layout.holds_checkpoint(step):
        check_files(config, step)
    worker = config.train_worker_cfg
    trainer = PolicyTrainer(
        worker,
        paths.policy if step else base,
        paths.trainer_state,
        total_steps * worker.optimizer_steps,
        base_dir=base,
        seed=seeds.derive(config.seed, 0),  # a new LoRA adapter's initial A
        strict=config.strict_load,
    )
    if step:
        checked(layout, trainer.module, step, trainer.fingerprint, paths.trainer_state)
    return trainer


def check_files(config: RLTrainerConfig, step: int) -> None:
    """Stop with one line if a file of step ``step``'s checkpoint is not what its writer hashed: the
    fingerprint checks the weights, this the optimizer state too (a read that leaves the files in the
    page cache, where the load then finds them). ``skip_checkpoint_validation``: their sizes only."""
    paths, hashed = RunLayout(config.work_dir).step(step), not config.skip_checkpoint_validation
    if not hashed:
        log.warning(
            "checkpoint of step %d: its files' hashes are not checked (skip_checkpoint_validation), only their "
            "sizes; its weights are still checked against the step's fingerprint",
            step,
        )
    if problem := first_changed(paths.dir, read_json(paths.outputs("checkpoint")), hashed=hashed):
        raise UserError(
            f"checkpoint of step {step} is damaged ({problem}); remove its policy/ and trainer_state/ "
            "and rlx re-creates them by replay from the checkpoint before"
        )


def checked(layout: RunLayout, model, step: int, measure=None, source: Path | None = None):
    """``model``, once its weights match step ``step``'s recorded fingerprint (read in the recorded
    dtypes, or as ``measure()`` gives it); a damaged or foreign checkpoint stops with one line."""
    recorded = read_json(layout.step(step).weights_fingerprint)
    actual = measure() if measure else fingerprint(model, like=recorded)
    problem = first_difference(recorded, actual, parameter_names(model))
    if problem:
        source = source or layout.step(step).policy
        raise UserError(f"checkpoint {source} is not the policy step {step} recorded ({problem})")
    return model
