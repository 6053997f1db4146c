"""A whole `rlx fit` step against a TRL ``GRPOTrainer`` step: same tiny model, data, batch, lengths,
sampling, loss and optimizer, both on CPU, each in a process of its own.

Only warm steps count: the first step of each (DeepSpeed's or accelerate's set-up, the first
generate) and everything before it (loading, `dvc repro` of the inputs, the base stage) are left
out. The runs alternate (rlx, TRL, rlx, ...); pytest-benchmark times each pair, and the figures
(median warm step, the ratio of each pair) go to results.json.
Evaluation is off in both (the demo evaluates every 5th step; TRL here never does).
"""

from __future__ import annotations

import pytest
from harness import DEMO, FLOW, WORKER, demo_overrides, record, run_workload
from report import fit_summary, trl_summary

from conftest import make_project

STEPS = 6  # step 1 is start-up; rlx: steps 2-5 are timed (see report.steady), TRL: steps 2-6
PAIRS = 3


@pytest.fixture(scope="module")
def bench_project(tmp_path_factory, tiny_model):
    """A fresh demo project (the repo's pipeline, the session's demo data and model) for `rlx fit` runs."""
    return make_project(tmp_path_factory.mktemp("bench"), tiny_model)


def trl_micro_batch(bench_project) -> int:
    """TRL's micro-batch (responses per forward/backward) closest to rlx's token-budget micro-batches
    on the demo's prompts, among the divisors of the step's responses."""
    from transformers import AutoTokenizer

    from rlx.tasks.data import load_rows
    from rlx.tokens import prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(bench_project / "data/tiny-qwen3")
    rows = load_rows(bench_project / "data/arith/train.parquet")[:256]
    longest = max(len(prompt_ids(tokenizer, row["prompt"])) for row in rows) + FLOW.sample_params.max_tokens
    per_micro = max(1, WORKER.pack_max_length // longest)
    responses = FLOW.global_batch_size * FLOW.prompt_repeat_k
    return min((d for d in range(1, responses + 1) if responses % d == 0), key=lambda d: abs(d - per_micro))


def trl_settings(project) -> dict:
    """The demo's batch, sampling, clipping and optimizer, for TRL's ``GRPOConfig``."""
    params, optim = FLOW.sample_params, WORKER.optim_cfg
    return {
        "prompts": FLOW.global_batch_size,
        "num_generations": FLOW.prompt_repeat_k,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "micro_batch": trl_micro_batch(project),
        "lr": optim.lr,
        "betas": list(optim.betas),
        "eps": optim.eps,
        "weight_decay": optim.weight_decay,
        "max_grad_norm": optim.max_grad_norm,
        "cliprange": WORKER.loss_cfg.policy_loss_cfg.cliprange_high,
        "seed": DEMO.seed,
    }


def run_trl(project, scratch, name: str, steps: int) -> dict:
    return run_workload(
        "trl",
        scratch,
        model_dir=str(project / "data/tiny-qwen3"),
        train_file=str(project / "data/arith/train.parquet"),
        out_dir=str(scratch / name),
        steps=steps,
        settings=trl_settings(project),
    )


def test_step_rlx_vs_trl(benchmark, bench_project, tmp_path):
    """Whole runs alternate, rlx then TRL, ``PAIRS`` times: a drift in the machine's speed over the
    minutes they take hits both alike, and each pair gives a ratio."""
    pytest.importorskip("trl", reason="TRL is the benchmark's reference: pip install -e '.[bench]' (make bench does)")
    runs = {"rlx": [], "trl": []}

    def pair() -> None:
        number = len(runs["rlx"])
        overrides = demo_overrides(STEPS)
        fit = run_workload(
            "fit", tmp_path, project=str(bench_project), overrides=overrides, work_dir=f"runs/bench-{number}"
        )
        runs["rlx"].append(fit)
        runs["trl"].append(run_trl(bench_project, tmp_path, f"trl-{number}", STEPS))

    benchmark.pedantic(pair, rounds=PAIRS, iterations=1)
    assert all(len(run["steps"]) == STEPS for name in runs for run in runs[name])
    record("step/rlx", [fit_summary(run, FLOW.global_batch_size * FLOW.prompt_repeat_k) for run in runs["rlx"]])
    record("step/trl", [{**trl_summary(run), "micro_batch": trl_micro_batch(bench_project)} for run in runs["trl"]])
