"""Lineage cost against model size: `rlx fit` on random-init Qwen3 models of about 1 M, 25 M and 200 M
parameters (the demo tokenizer, 2 prompts x 2 responses x 8 tokens, a checkpoint every 5 steps), and
re-creating an unsaved step by replay. What a step costs beyond its compute must not grow with the
model: only checkpoints (every ``checkpoint_interval`` steps, in the background) write weights.
"""

from __future__ import annotations

import pytest
from harness import INTERVAL, MODEL_SHAPES, STEPS, TINY_BATCH, kept_bytes, random_model, record, run_workload, timed_fit

from conftest import make_project


@pytest.fixture(scope="module")
def size_project(tmp_path_factory, tiny_model):
    return make_project(tmp_path_factory.mktemp("sizes"), tiny_model)


@pytest.mark.parametrize("size", MODEL_SHAPES)
def test_lineage_cost_by_model_size(benchmark, size_project, tmp_path, size):
    model, parameters = random_model(size_project, size, tmp_path)
    work_dir = f"runs/size-{size}"
    overrides = [*TINY_BATCH, f"load_from={model}"]
    result = timed_fit(benchmark, tmp_path, size_project, overrides, work_dir)
    replayed = run_workload(
        "materialize", tmp_path, project=size_project, work_dir=work_dir, step=INTERVAL - 1, out=tmp_path / "replayed"
    )
    run_dir = size_project / work_dir
    kept = kept_bytes(run_dir)
    rollouts = {
        step: sum(
            (run_dir / f"step-{step}" / name).stat().st_size
            for name in ("prompts.parquet", "rollouts.parquet", "judged.parquet")
        )
        for step in kept
    }
    record(
        f"model_size/{size}",
        {
            "parameters": parameters,
            "history": result["history"],
            "rss_mb": [mark["rss_mb"] for mark in result["steps"]],
            "bytes_kept": kept,
            "rollout_bytes": rollouts,
            "replay": {**replayed, "steps": INTERVAL - 1},
        },
    )
    assert all((run_dir / f"step-{step}/policy").is_dir() == (int(step) in (INTERVAL, STEPS)) for step in kept)
