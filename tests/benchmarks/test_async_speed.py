"""Asynchronous rollout (configs/async.yaml: max_staleness 1, one rollout worker, decoupled PPO) against
the synchronous step (max_staleness 0, everything in one process), the sides alternated: the demo's
steady step; by model size (random-init Qwen3 of 25 M and 200 M parameters, the tiny batch) the step and
what sending the policy to the rollout worker costs (``time/policy_send``); and the asynchronous demo
step against TRL's ``GRPOTrainer`` step on equal work (tests/benchmarks/test_step_vs_trl.py).

Each `rlx fit` runs in a fresh process; the asynchronous one starts its own Ray instance.
"""

from __future__ import annotations

import statistics

import pytest
from harness import FLOW, TINY_BATCH, alternate, demo_overrides, random_model, record, run_workload
from report import fit_summary, steady, trl_summary
from test_step_vs_trl import run_trl, trl_micro_batch

from conftest import ROOT, make_project
from rlx.config import preset_overrides

pytest.importorskip("ray")
STEPS = 6  # steps 2-5 are steady: step 1 starts Ray, the worker and DeepSpeed; step 6 ends the run
ASYNC = preset_overrides(ROOT / "configs/async.yaml")
PARTS = ("time/step", "time/rollout", "time/train", "time/rollout_wait", "time/policy_send")


@pytest.fixture(scope="module")
def bench_project(tmp_path_factory, tiny_model):
    return make_project(tmp_path_factory.mktemp("async"), tiny_model)


def median_parts(result: dict) -> dict[str, float]:
    """The steady steps' median of each part of a step (0 where a side has no such part)."""
    return {part: statistics.median(m.get(part, 0.0) for m in steady(result["history"])) for part in PARTS}


def sides(bench_project, tmp_path, base: list[str], name: str) -> tuple[dict, dict]:
    """The synchronous and asynchronous runs of ``base`` as the two sides of :func:`alternate`, and
    the median parts of each run they make, by side."""
    parts: dict[str, list[dict]] = {"synchronous": [], "asynchronous": []}
    runs = iter(range(100))

    def fit(side: str, *extra: str):
        def run() -> dict:
            overrides = [*base, "wandb.enabled=false", *extra]
            work_dir = f"runs/{name}-{next(runs)}"
            result = run_workload("fit", tmp_path, project=str(bench_project), overrides=overrides, work_dir=work_dir)
            parts[side].append(median_parts(result))
            return result

        return run

    return {"synchronous": fit("synchronous"), "asynchronous": fit("asynchronous", *ASYNC)}, parts


def compared(parts: dict[str, list[dict]]) -> dict:
    """Each timed round's ratio of the steady steps (the warm-up round left out) and the parts of both sides."""
    timed = {side: runs[1:] for side, runs in parts.items()}
    ratios = [a["time/step"] / s["time/step"] for s, a in zip(timed["synchronous"], timed["asynchronous"], strict=True)]
    return {"ratio_by_round": ratios, "parts": timed}


def test_demo_step_asynchronous_against_synchronous(benchmark, bench_project, tmp_path):
    runs, parts = sides(bench_project, tmp_path, demo_overrides(STEPS), "demo")
    measured = alternate(benchmark, runs, rounds=2)
    record("async/demo step", compared(parts))
    for side, staleness in (("synchronous", 0), ("asynchronous", 1)):  # each side ran what it says
        assert all(m["async/staleness/max"] == staleness for m in steady(measured.last[side]["history"]))


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_step_asynchronous_against_synchronous_by_model_size(benchmark, bench_project, tmp_path, size):
    model, parameters = random_model(bench_project, size, tmp_path)
    runs, parts = sides(bench_project, tmp_path, [*TINY_BATCH, f"load_from={model}"], f"size-{size}")
    alternate(benchmark, runs, rounds=1)
    record(f"async/{size}", {"parameters": parameters, **compared(parts)})


def test_asynchronous_step_vs_trl(benchmark, bench_project, tmp_path):
    """The asynchronous demo step against TRL's, pairs alternated as in test_step_vs_trl."""
    pytest.importorskip("trl", reason="TRL is the benchmark's reference: pip install -e '.[bench]' (make bench does)")
    runs = {"rlx": [], "trl": []}

    def pair() -> None:
        number = len(runs["rlx"])
        overrides = [*demo_overrides(STEPS), *ASYNC, "wandb.enabled=false"]
        work_dir = f"runs/trl-pair-{number}"
        runs["rlx"].append(
            run_workload("fit", tmp_path, project=str(bench_project), overrides=overrides, work_dir=work_dir)
        )
        runs["trl"].append(run_trl(bench_project, tmp_path, f"trl-{number}", STEPS))

    benchmark.pedantic(pair, rounds=2, iterations=1)
    responses = FLOW.global_batch_size * FLOW.prompt_repeat_k
    record("async_step/rlx", [fit_summary(run, responses) for run in runs["rlx"]])
    record(
        "async_step/trl", [{**trl_summary(run), "micro_batch": trl_micro_batch(bench_project)} for run in runs["trl"]]
    )
