"""LoRA against full fine-tuning on CPU: `rlx fit` of random-init Qwen3 models of about 25 M and 200 M
parameters with the model-size benchmark's tiny batch and checkpoints, once training every weight and
once a rank-8 adapter on every linear layer (``configs/lora.yaml``'s). Per run: step time, peak RSS,
optimizer-state bytes, bytes kept per step and per checkpoint. The sides alternate (full then LoRA in
the first round, LoRA then full in the second), so each round's ratio compares them at the machine's
speed of the moment.
"""

from __future__ import annotations

import shutil

import pytest
from harness import TINY_BATCH, kept_bytes, random_model, record, run_workload

from conftest import make_project

ROUNDS = 2
# Each side sets the field: `rlx fit` writes its overrides into the project's params.yaml (DVC records what ran).
SIDES = {
    "full": ["train_worker_cfg.lora=null"],
    "lora": ["train_worker_cfg.lora={rank: 8, alpha: 16.0, target_modules: all-linear}"],
}


@pytest.fixture(scope="module")
def lora_project(tmp_path_factory, tiny_model):
    return make_project(tmp_path_factory.mktemp("lora-cost"), tiny_model)


def measured_fit(project, model, side: str, work_dir: str, scratch) -> dict:
    """One `rlx fit` of ``side``: its history, memory and the bytes of each step's folder; the run's
    folder is removed after (a 200 M full run keeps gigabytes of checkpoints)."""
    overrides = [*TINY_BATCH, f"load_from={model}", *SIDES[side]]
    result = run_workload("fit", scratch, project=str(project), overrides=overrides, work_dir=work_dir)
    run_dir = project / work_dir
    kept = kept_bytes(run_dir)
    shutil.rmtree(run_dir)
    return {"history": result["history"], "peak_rss_mb": [m["peak_rss_mb"] for m in result["steps"]], "kept": kept}


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_lora_against_full_fine_tuning(benchmark, lora_project, tmp_path, size):
    model, parameters = random_model(lora_project, size, tmp_path)
    runs: dict[str, list] = {side: [] for side in SIDES}

    def one_round() -> None:
        order = list(SIDES) if len(runs["full"]) % 2 == 0 else list(reversed(SIDES))
        for side in order:
            work_dir = f"runs/lora-cost-{size}-{side}-{len(runs[side])}"
            runs[side].append(measured_fit(lora_project, model, side, work_dir, tmp_path))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    record(f"lora/{size}", {"parameters": parameters, **runs})
    trained = {side: [m["train/trainable_params"] for run in runs[side] for m in run["history"]] for side in SIDES}
    assert all(0 < count < parameters / 20 for count in trained["lora"])
    assert set(trained["full"]) == {parameters}
