"""Judging 1,024 responses against generating them, on the tiny demo model (pytest-benchmark).

Run with `make bench`; compare the `judge` rows with the `rollout` row of the same run.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from conftest import DATA
from rlx.config import JudgerConfig, SampleParams
from rlx.judgers import Panel
from rlx.judgers.rows import judge_rows
from rlx.samplers.transformers_backend import generate
from rlx.tasks.data import load_rows
from rlx.tokens import prompt_ids
from rlx.training.loading import load_policy

RESPONSES = 1024


@pytest.fixture(scope="module")
def demo(tiny_model):
    cfg, _ = tiny_model
    model = load_policy(cfg.tiny_model.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir)
    rows = load_rows(cfg.synthetic_task.output_dir / "test.parquet")[: RESPONSES // 8]
    prompts = [prompt_ids(tokenizer, row["prompt"]) for row in rows for _ in range(8)]
    return model, tokenizer, rows, prompts


def test_rollout_1024(benchmark, demo):
    model, tokenizer, _, prompts = demo
    params = SampleParams(max_tokens=32)
    benchmark.pedantic(lambda: generate(model, tokenizer, prompts, params, seed=0), rounds=3, iterations=1)


def test_judge_arith_1024(benchmark, demo):
    model, tokenizer, rows, prompts = demo
    outputs = generate(model, tokenizer, prompts, SampleParams(max_tokens=32), seed=0)
    judged = [
        {
            "response_text": o.text,
            "data_source": "rlx/arith",
            "ground_truth": rows[i // 8]["reward_model"]["ground_truth"],
        }
        for i, o in enumerate(outputs)
    ]
    panel = Panel(JudgerConfig())
    benchmark.pedantic(lambda: judge_rows(panel, judged, "response_text"), rounds=5, iterations=1)


def test_judge_math_1024(benchmark):
    """The math judger (math-verify, in worker processes) on MATH-500 reference solutions."""
    records = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").read_text().splitlines()]
    judged = [
        {"response_text": r["solution"], "data_source": "m", "ground_truth": r["answer"]}
        for r in (records * 3)[:RESPONSES]
    ]
    panel = Panel(JudgerConfig(reward_judger_configs=[{"judger_name": "math", "data_source": ["m"]}], timeout=10))
    judge_rows(panel, judged[:8], "response_text")  # start the workers outside the timing
    benchmark.pedantic(lambda: judge_rows(panel, judged, "response_text"), rounds=2, iterations=1)
