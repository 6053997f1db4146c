"""Scaling: warm step time and peak memory of `rlx fit` as responses grow (32 -> 128 -> 512 tokens)
and as the batch grows (16 -> 32 -> 64 prompts x 8 responses); and the peak memory of one update
with and without the token budget of a micro-batch (``train_worker_cfg.pack_max_length``).

Responses are forced to full length (``min_tokens = max_tokens``): the tiny model often stops early.
Each configuration runs in a fresh process, so its RSS high-water mark is its own.
"""

from __future__ import annotations

import pytest
from harness import FLOW, demo_overrides, record, run_workload, timed_fit
from report import fit_summary

from conftest import PARAMS, make_project

STEPS = 3  # step 2 is timed: step 1 is start-up, step 3 has no next step to overlap its DVC record
CONFIGS = [(16, 32), (16, 512), (64, 32), (16, 128), (32, 32)]  # (prompts, tokens per response)
UNBOUNDED = 10**9  # one micro-batch holds the whole update
# (tokens per response, token budget); no unbounded 512: one 128 x 600-token micro-batch needs ~8 GB.
BUDGETS = [(512, 4096), (128, UNBOUNDED), (32, 4096), (128, 4096), (32, UNBOUNDED)]


@pytest.fixture(scope="module")
def bench_project(tmp_path_factory, tiny_model):
    """A fresh demo project (the repo's pipeline, the session's demo data and model) for `rlx fit` runs."""
    return make_project(tmp_path_factory.mktemp("bench"), tiny_model)


@pytest.mark.parametrize(("prompts", "tokens"), CONFIGS, ids=[f"{p}x{FLOW.prompt_repeat_k}x{t}" for p, t in CONFIGS])
def test_scaling_fit(benchmark, bench_project, tmp_path, prompts, tokens):
    overrides = [
        *demo_overrides(STEPS),
        f"dataflow_config.global_batch_size={prompts}",
        f"dataflow_config.sample_params.max_tokens={tokens}",
        f"dataflow_config.sample_params.min_tokens={tokens}",
        f"rollout_config.context_length={tokens + 256}",
    ]
    name = f"{prompts}x{FLOW.prompt_repeat_k}x{tokens}"
    result = timed_fit(benchmark, tmp_path, bench_project, overrides, f"runs/scale-{name}")
    summary = fit_summary(result, prompts * FLOW.prompt_repeat_k)
    assert all(step["response/response_len/mean"] == tokens for step in summary["phases"])
    record(f"scaling/{name} tokens", summary)


@pytest.mark.parametrize(
    ("tokens", "budget"), BUDGETS, ids=[f"{t}-{'unbounded' if b == UNBOUNDED else b}" for t, b in BUDGETS]
)
def test_train_memory_budget(benchmark, tiny_model, tmp_path, tokens, budget):
    cfg, _ = tiny_model
    result = benchmark.pedantic(
        run_workload,
        args=("train_memory", tmp_path),
        kwargs={
            "params": str(PARAMS),
            "overrides": [f"train_worker_cfg.pack_max_length={budget}"],
            "model_dir": str(cfg.tiny_model.output_dir),
            "train_file": str(cfg.synthetic_task.output_dir / "train.parquet"),
            "response_len": tokens,
        },
        rounds=1,
        iterations=1,
    )
    label = "unbounded" if budget == UNBOUNDED else f"budget {budget}"
    record(f"train_memory/{tokens} tokens, {label}", result)
