"""Stage ``train``: one policy update from the step's judged rollouts (the update itself:
rlx.training.update).

Outputs are small whatever the model's size: ``step-N/update.parquet`` (per response, the numbers
the update used) and ``step-N/fingerprint.json`` (of the weights after it). The update is
deterministic in its inputs, the seed and the step, so ``replay`` re-creates any step's policy from
an earlier checkpoint, and the fingerprints prove it did.
"""

from __future__ import annotations

from rlx import clock
from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.lineage.fingerprint import first_difference, parameter_names
from rlx.phases import Phase
from rlx.stages.curves import write_curve
from rlx.store import faults
from rlx.store.artifacts import read_json, write_json, write_rows
from rlx.store.layout import RunLayout, StepPaths
from rlx.training import distributed
from rlx.training.trainer import nonfinite_parameter
from rlx.training.update import UPDATE_SCHEMA, update_policy

runs_where_the_policy_is = True  # run_stage sends it to the policy's home: with several workers, every rank


def clip_cannot_act(config: RLTrainerConfig) -> str | None:
    """Why the clip settings change nothing, if they cannot: with one update per rollout step the
    update is on-policy, its importance ratio exactly 1, so no bound is ever reached (a run warns once)."""
    if config.train_worker_cfg.optimizer_steps > 1:
        return None
    clip = config.train_worker_cfg.loss_cfg.policy_loss_cfg
    return (
        "train_worker_cfg.optimizer_steps is 1: every update is on-policy, its importance ratio exactly 1, so "
        f"policy_loss_cfg's clip bounds (cliprange_low {clip.cliprange_low}, cliprange_high {clip.cliprange_high}, "
        f"clip_ratio_c {clip.clip_ratio_c}) cannot act and train/clipfrac stays 0; with optimizer_steps above 1 "
        "the later mini-batches are off-policy and the bounds act"
    )


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    """Update the policy of step - 1 with the step's judged rollouts; record the update's numbers and
    the new weights' fingerprint (the weights themselves are the checkpoint stage's)."""
    missing = [p.name for p in inputs(config, paths) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{paths.dir}: no {' or '.join(missing)}")
    trainer = engines.trainer(step - 1)
    engines.make_room_for_training()
    metrics, numbers = update_policy(config, paths, engines, trainer)
    check_weights(config, step, trainer)
    check_mismatch(config, step, metrics["mismatch/k3_kl"])
    with clock.part("fingerprint") as watch:
        weights = trainer.fingerprint()
    metrics["time/fingerprint"] = watch.seconds
    metrics["train/rank_weight_spread"] = trainer.rank_weight_spread(weights)
    metrics["train/trainable_params"] = trainer.trainable_parameters  # LoRA: the adapter's, a fraction of the model
    metrics["train/optimizer_state_bytes"] = trainer.optimizer_state_bytes()
    engines.trainer_advanced_to(step)
    if distributed.is_main():
        write_rows(numbers, paths.update, schema=UPDATE_SCHEMA)
        write_json(weights, paths.weights_fingerprint, indent=None)
    return metrics


def inputs(config: RLTrainerConfig, paths: StepPaths) -> list:
    """The step's files an update reads: its rollouts, their rewards and, when distilling, the teachers' scores."""
    return [paths.rollouts, paths.judged, *([paths.teacher] if config.teacher_config else [])]


def replay(config: RLTrainerConfig, trainer, steps: range, engines) -> None:
    """Re-apply the recorded updates of ``steps`` to ``trainer`` (no generation: the judged rollouts are
    on disk), checking the weights against each step's recorded fingerprint."""
    from rlx.stages import reseed

    layout, phase = RunLayout(config.work_dir), Phase(f"replaying steps {steps[0]}-{steps[-1]}", len(steps))
    for step in steps:
        paths = layout.step(step)
        missing = [p.name for p in (*inputs(config, paths), paths.weights_fingerprint) if not p.is_file()]
        if missing:
            raise UserError(
                f"cannot re-create the policy of step {steps[-1]} of {layout.work_dir}: step {step}'s "
                f"{', '.join(missing)} missing (deleted?); replay needs every step after the checkpoint it starts from"
            )
        reseed(config, "train", step)
        update_policy(config, paths, engines, trainer)
        faults.point("replay.step")
        recorded = read_json(paths.weights_fingerprint)
        problem = first_difference(recorded, trainer.fingerprint(), parameter_names(trainer.module))
        if problem:
            raise UserError(
                f"replaying step {step} of {layout.work_dir} did not re-create its policy ({problem}): "
                "training was not deterministic (on a GPU: set CUBLAS_WORKSPACE_CONFIG=:4096:8 and use "
                "deterministic kernels), or the step's records or code changed since it ran"
            )
        phase.advance()


def check_weights(config: RLTrainerConfig, step: int, trainer) -> None:
    """Stop before a policy with non-finite weights is recorded: the next rollout could not sample from it."""
    bad = nonfinite_parameter(trainer.module)
    if bad:
        raise UserError(
            f"train: step {step}'s update left non-finite weights (parameter {bad}); nothing of step {step} was "
            f"recorded, step {step - 1} is the last good one. Lower train_worker_cfg.optim_cfg.lr "
            f"(now {config.train_worker_cfg.optim_cfg.lr}), then rerun"
        )


def check_mismatch(config: RLTrainerConfig, step: int, k3_kl: float) -> None:
    """Stop before a step is recorded whose rollouts the engine sampled from other weights than the trainer
    scored them with: the lineage would name a policy that did not generate them (verl #6967, miles #862)."""
    bound = config.rollout_config.max_mismatch_kl
    if bound is not None and not k3_kl <= bound:  # (a NaN is past every bound)
        raise UserError(
            f"train: step {step}'s rollouts are mismatch/k3_kl {k3_kl:.3g} from the trainer's log-probs, past "
            f"rollout_config.max_mismatch_kl {bound}: the rollout engine did not sample from the policy the run "
            f"records (a weight sync that failed?); nothing of step {step} was recorded. Rerun to resume from step "
            f"{step - 1}, or raise the bound if this mismatch is expected"
        )


def after_run(config: RLTrainerConfig, layout: RunLayout, step: int) -> None:
    """Rewrite the reward and training curve from every step so far (idempotent, so reruns are safe)."""
    write_curve(layout, "train", lambda _: ["judge", "train"], range(1, step + 1))


def outputs(paths) -> list:
    return [paths.update, paths.weights_fingerprint]
