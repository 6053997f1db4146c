"""Stage ``base``: the run's starting point, step 0.

Records the fingerprint of the base model (``load_from``) as step 0's, so the next step's stages
depend on it as they depend on any step's policy, and evaluates the base policy when
``evaluator_config.enable_initial_evaluate`` is set. Its copy as checkpoint 0, the root of every
replay, is the checkpoint stage's.
"""

from __future__ import annotations

from rlx.config import RLTrainerConfig
from rlx.stages import evaluate
from rlx.store.artifacts import write_json
from rlx.store.layout import RunLayout, StepPaths


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    write_json(engines.home.base_fingerprint(), paths.weights_fingerprint, indent=None)
    return evaluate.run(config, 0, paths, engines)


def after_run(config: RLTrainerConfig, layout: RunLayout, step: int) -> None:
    evaluate.after_run(config, layout, 0)


def outputs(paths) -> list:
    return [paths.weights_fingerprint, paths.eval_samples]
