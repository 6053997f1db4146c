"""Several workers (rlx.workers): the demo's step on two Ray workers against the one-process step,
measured in alternation; and, on random-init Qwen3 models of 25 M and 200 M parameters, the bytes that
cross between the driver and the workers each step (they must not grow with the model: only prompt ids
and generations travel) and the driver's own share of a step (the step's time less the slowest
worker's time in its calls: prepare, judge, dealing out, gathering, the record's hand-over).

Each `rlx fit` runs in a fresh process; two workers start their own Ray instance (one CPU each).
"""

from __future__ import annotations

import statistics

import pytest
from harness import TINY_BATCH, alternate, demo_overrides, random_model, record, run_workload, timed_fit
from report import steady

from conftest import make_project

pytest.importorskip("ray")
STEPS = 5  # steps 2-4 are steady: step 1 starts the workers and DeepSpeed, step 5 ends the run
TWO_WORKERS = ["resources.num_workers=2", "resources.num_cpus_per_worker=1", "resources.cpu_memory_per_worker=0"]


@pytest.fixture(scope="module")
def bench_project(tmp_path_factory, tiny_model):
    return make_project(tmp_path_factory.mktemp("workers"), tiny_model)


def steady_steps(result: dict) -> list[dict]:
    """Not step 1 (it starts the workers and DeepSpeed) nor the last (its checkpoint, and a DVC record with
    no next step to overlap), as tests/benchmarks/report.steady."""
    return steady(result["history"])


def test_demo_step_on_two_workers_against_one_process(benchmark, bench_project, tmp_path):
    """Median steady step of each round, the sides alternated (warm-up round included in neither)."""
    steps: dict[str, list[float]] = {"one process": [], "two workers": []}
    runs = iter(range(100))

    def fit(side: str, *workers: str):
        def run() -> dict:
            overrides = [*demo_overrides(STEPS), "wandb.enabled=false", *workers]
            result = run_workload(
                "fit", tmp_path, project=str(bench_project), overrides=overrides, work_dir=f"runs/w-{next(runs)}"
            )
            steps[side].append(statistics.median(m["time/step"] for m in steady_steps(result)))
            return result

        return run

    measured = alternate(
        benchmark, {"one process": fit("one process"), "two workers": fit("two workers", *TWO_WORKERS)}, rounds=2
    )
    timed = {side: seconds[1:] for side, seconds in steps.items()}  # the warm-up round left out
    ratios = [two / one for one, two in zip(timed["one process"], timed["two workers"], strict=True)]
    record("workers/demo step", {"steady_step_s": timed, "ratio_by_round": ratios})
    for side, world_size in (("one process", 1), ("two workers", 2)):  # each side ran what it says
        assert all(m["train/world_size"] == world_size for m in steady_steps(measured.last[side]))


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_driver_worker_bytes_and_orchestration_by_model_size(benchmark, bench_project, tmp_path, size):
    model, parameters = random_model(bench_project, size, tmp_path)
    overrides = [*TINY_BATCH, f"rollout_steps={STEPS}", f"load_from={model}", *TWO_WORKERS]
    result = timed_fit(benchmark, tmp_path, bench_project, overrides, f"runs/bytes-{size}")
    steady = steady_steps(result)
    record(
        f"workers/{size}",
        {
            "parameters": parameters,
            "driver_worker_bytes": [m["perf/driver_worker_bytes"] for m in steady],
            "step_s": [m["time/step"] for m in steady],
            "orchestration_s": [m["time/step"] - m["time/workers"] for m in steady],
        },
    )
    assert all(m["perf/driver_worker_bytes"] < parameters for m in steady)  # the weights never cross
