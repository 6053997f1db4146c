"""Stage ``base``: the run's starting point, step 0.

Copies the base model (``load_from``) with its tokenizer into ``step-0/policy`` so every step reads
its policy from the same place, writes an empty ``step-0/trainer_state``, and evaluates the base
policy when ``evaluator_config.enable_initial_evaluate`` is set.
"""

from __future__ import annotations

from rlx.artifacts import atomic_dir, write_json
from rlx.config import RLTrainerConfig
from rlx.engines import load_policy
from rlx.stages import evaluate


def run(config: RLTrainerConfig, step: int, engines) -> dict:
    paths = engines.layout.step(0)
    with atomic_dir(paths.policy) as tmp:
        load_policy(config.load_from).save_pretrained(tmp, safe_serialization=True)
        engines.tokenizer.save_pretrained(tmp)
    with atomic_dir(paths.trainer_state) as tmp:
        write_json({"global_steps": 0}, tmp / "state.json")
    return evaluate.run(config, 0, engines)


def after_run(config: RLTrainerConfig, step: int, engines) -> None:
    evaluate.after_run(config, 0, engines)


def outputs(paths) -> list:
    return [paths.policy, paths.trainer_state, paths.eval_samples]
