"""What the benchmarks share: the demo's settings and batch, child-process workloads, the results file.

Each benchmark stores its raw measurements with :func:`record`; the session's results are rewritten
to ``tests/benchmarks/results.json`` (figures and ratios, see :mod:`report`) after each one, so an
interrupted session still leaves what it measured. (Not a conftest.py: the suite's root conftest is
imported by name, and a second conftest would shadow it.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conftest import PARAMS, child_env

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402

from rlx.config import load  # noqa: E402

MEASURED: dict = {}
DEMO = load(PARAMS)
FLOW, WORKER = DEMO.dataflow_config, DEMO.train_worker_cfg


def demo_overrides(steps: int) -> list[str]:
    """The repo's demo settings (make_project shrinks them for tests), evaluation off, ``steps`` long."""
    return [
        "run.step=1",
        "run.prev=0",
        "run.rollout_policy=0",
        "run.checkpoint=0",
        f"rollout_steps={steps}",
        f"dataflow_config.global_batch_size={FLOW.global_batch_size}",
        f"dataflow_config.prompt_repeat_k={FLOW.prompt_repeat_k}",
        f"dataflow_config.sample_params.max_tokens={FLOW.sample_params.max_tokens}",
        f"checkpoint_interval={DEMO.checkpoint_interval}",
        f"checkpoint_maxkeep={DEMO.checkpoint_maxkeep}",
        f"hf_interval={DEMO.hf_interval}",
        "evaluator_config.enable_evaluate=false",
        "evaluator_config.enable_initial_evaluate=false",
    ]


# Model-size runs (test_model_size, test_lora_cost): random-init Qwen3 models with the demo tokenizer,
# the tiny batch (2 prompts x 2 responses x 8 tokens), a checkpoint every 5 steps, 6 steps: checkpoints
# at 0, 5 and 6, so steps 2-4 are steady steps without one.
STEPS, INTERVAL = 6, 5
MODEL_SHAPES = {"1M": (160, 4), "25M": (512, 8), "200M": (1024, 16)}  # (hidden size, layers)
TINY_BATCH = [
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


def random_model(project: Path, size: str, scratch: Path) -> tuple[Path, int]:
    """A random-init Qwen3 of ``size`` (a :data:`MODEL_SHAPES` name) in the project's data: its folder
    and parameter count."""
    hidden, layers = MODEL_SHAPES[size]
    folder = project / "data" / f"qwen3-{size}"
    built = run_workload(
        "random_model", scratch, tokenizer_dir=project / "data/tiny-qwen3", out_dir=folder, hidden=hidden, layers=layers
    )
    return folder, built["parameters"]


def step_bytes(step_dir: Path) -> int:
    return sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())


def kept_bytes(run_dir: Path) -> dict[str, int]:
    """What each step of a model-size run keeps on disk, by step number."""
    return {str(step): step_bytes(run_dir / f"step-{step}") for step in range(1, STEPS + 1)}


def record(name: str, value) -> None:
    """Keep one raw measurement of this session and rewrite the results file with all of them."""
    MEASURED[name] = value
    report.write_results(MEASURED, " ".join(["pytest", *sys.argv[1:]]))


@dataclass
class Rounds:
    """Each side's seconds per round, and what each side returned in the last round."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    last: dict = field(default_factory=dict)


def alternate(benchmark, sides: dict[str, Callable], rounds: int) -> Rounds:
    """Run the sides one after the other, ``rounds`` times after one warm-up round, timing each call;
    pytest-benchmark times each whole round. Alternating keeps a comparison fair on a machine whose
    speed drifts: two blocks of rounds minutes apart can differ more than the sides do."""
    for side in sides.values():  # warm-up round, not timed
        side()
    measured = Rounds({name: [] for name in sides})

    def one_round() -> None:
        for name, side in sides.items():
            started = time.perf_counter()
            measured.last[name] = side()
            measured.seconds[name].append(time.perf_counter() - started)

    benchmark.pedantic(one_round, rounds=rounds, iterations=1)
    return measured


def run_workload(kind: str, scratch: Path, /, **arguments) -> dict:
    """Run one workload of ``workloads.py`` in a fresh interpreter and return what it measured
    (written to a file in ``scratch``)."""
    out = scratch / f"{kind}-{len(list(scratch.glob(f'{kind}-*.json')))}.json"
    command = [sys.executable, str(HERE / "workloads.py"), kind, json.dumps(arguments, default=str), str(out)]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{kind} workload failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def timed_fit(benchmark, scratch: Path, project: Path, overrides: list[str], work_dir: str) -> dict:
    """One `rlx fit` workload in a fresh interpreter, timed once by pytest-benchmark; what it measured."""
    arguments = {"project": str(project), "overrides": overrides, "work_dir": work_dir}
    return benchmark.pedantic(run_workload, args=("fit", scratch), kwargs=arguments, rounds=1, iterations=1)


def demo_prompts(tiny_model, tokenizer, count: int) -> tuple[list[list[int]], list[str]]:
    """The first ``count`` demo training prompts, each repeated ``prompt_repeat_k`` times as a rollout
    repeats them, with their gold answers."""
    from rlx.tasks.data import load_rows
    from rlx.tokens import prompt_ids

    cfg, _ = tiny_model
    k = FLOW.prompt_repeat_k
    rows = load_rows(cfg.synthetic_task.output_dir / "train.parquet")[:count]
    prompts = [prompt_ids(tokenizer, row["prompt"]) for row in rows for _ in range(k)]
    golds = [str(row["reward_model"]["ground_truth"]) for row in rows for _ in range(k)]
    return prompts, golds


def demo_tokenizer(tiny_model):
    """The demo model's tokenizer set up as rlx's engines set it up (left padding for generation)."""
    from transformers import AutoTokenizer

    cfg, _ = tiny_model
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
