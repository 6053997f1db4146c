"""Lineage cost against model size: `rlx fit` on random-init Qwen3 models of about 1 M, 25 M and 200 M
parameters (the demo tokenizer, 2 prompts x 2 responses x 8 tokens, a checkpoint every 5 steps), and
re-creating an unsaved step by replay. What a step costs beyond its compute must not grow with the
model: only checkpoints (every ``checkpoint_interval`` steps, in the background) write weights.
"""

from __future__ import annotations

import pytest
from harness import record, run_workload

from conftest import make_project

STEPS, INTERVAL = 6, 5  # checkpoints at 0, 5 and 6; steps 2-4 are steady non-checkpoint steps
SIZES = {"1M": (160, 4), "25M": (512, 8), "200M": (1024, 16)}  # (hidden size, layers)
RUN = [
    f"rollout_steps={STEPS}",
    f"checkpoint_interval={INTERVAL}",
    "checkpoint_maxkeep=-1",
    "hf_interval=-1",
    "dataflow_config.global_batch_size=2",
    "dataflow_config.prompt_repeat_k=2",
    "dataflow_config.sample_params.max_tokens=8",
    "dataflow_config.sample_params.min_tokens=8",
    "evaluator_config.enable_evaluate=false",
    "evaluator_config.enable_initial_evaluate=false",
    "wandb.enabled=false",
]


@pytest.fixture(scope="module")
def size_project(tmp_path_factory, tiny_model):
    return make_project(tmp_path_factory.mktemp("sizes"), tiny_model)


def step_bytes(step_dir) -> int:
    return sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())


@pytest.mark.parametrize("size", SIZES)
def test_lineage_cost_by_model_size(benchmark, size_project, tmp_path, size):
    hidden, layers = SIZES[size]
    model = size_project / "data" / f"qwen3-{size}"
    built = run_workload(
        "random_model",
        tmp_path,
        tokenizer_dir=size_project / "data/tiny-qwen3",
        out_dir=model,
        hidden=hidden,
        layers=layers,
    )
    work_dir = f"runs/size-{size}"
    overrides = [*RUN, f"load_from={model}"]
    result = benchmark.pedantic(
        run_workload,
        args=("fit", tmp_path),
        kwargs={"project": str(size_project), "overrides": overrides, "work_dir": work_dir},
        rounds=1,
        iterations=1,
    )
    replayed = run_workload(
        "materialize", tmp_path, project=size_project, work_dir=work_dir, step=INTERVAL - 1, out=tmp_path / "replayed"
    )
    run_dir = size_project / work_dir
    kept = {str(step): step_bytes(run_dir / f"step-{step}") for step in range(1, STEPS + 1)}
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
            "parameters": built["parameters"],
            "history": result["history"],
            "rss_mb": [mark["rss_mb"] for mark in result["steps"]],
            "bytes_kept": kept,
            "rollout_bytes": rollouts,
            "replay": {**replayed, "steps": INTERVAL - 1},
        },
    )
    assert all((run_dir / f"step-{step}/policy").is_dir() == (int(step) in (INTERVAL, STEPS)) for step in kept)
