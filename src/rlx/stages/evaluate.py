"""Stage ``evaluate``: the new policy on the held-out sets, every ``evaluate_step`` steps and at the end.

Output ``step-N/eval_samples.parquet`` (one row per response: ``step, dataset, index, data_source,
ground_truth, response_text, response_len, finish_reason, reward, extracted, correct``; empty on a
step without evaluation) and ``curves/eval.csv``. Metrics: ``eval/accuracy`` (mean@1 over all sets),
``eval/<dataset>/accuracy`` and ``eval/response_len/mean``.
"""

from __future__ import annotations

import random

import pyarrow as pa

from rlx.artifacts import write_rows
from rlx.config import RLTrainerConfig
from rlx.data import load_rows, prompt_ids
from rlx.judgers import Panel
from rlx.rollout import generate
from rlx.stages.curves import write_curve
from rlx.stages.judge import judge_rows

SAMPLE_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("dataset", pa.string()),
        ("index", pa.int64()),
        ("data_source", pa.string()),
        ("ground_truth", pa.string()),
        ("response_text", pa.string()),
        ("response_len", pa.int64()),
        ("finish_reason", pa.string()),
        ("reward", pa.float64()),
        ("scores", pa.string()),
        ("extracted", pa.string()),
        ("correct", pa.bool_()),
        ("error", pa.string()),
        ("overlong_penalty", pa.float64()),
    ]
)


def is_due(config: RLTrainerConfig, step: int, total_steps: int) -> bool:
    evaluator = config.evaluator_config
    if not evaluator.enable_evaluate:
        return False
    if step == 0:
        return evaluator.enable_initial_evaluate
    return step % evaluator.evaluate_step == 0 or step == total_steps


def evaluate_policy(config: RLTrainerConfig, step: int, engines) -> tuple[list[dict], dict]:
    """Generate on every eval set with the policy after ``step`` steps and judge the answers."""
    evaluator = config.evaluator_config
    panel = Panel(config.judger_config)
    samples, metrics = [], {}
    for dataset in evaluator.dataset_cfg:
        rows = load_rows(dataset.anno_path)
        count = max(1, round(len(rows) * evaluator.eval_sample_ratio))
        indices = sorted(random.Random(config.seed).sample(range(len(rows)), count))
        n = evaluator.sample_params.n
        outputs = generate(
            config.rollout_config,
            engines.policy(step),
            engines.tokenizer,
            [prompt_ids(engines.tokenizer, rows[i]["prompt"]) for i in indices for _ in range(n)],
            evaluator.sample_params,
            seed=config.seed,
        )
        produced = []
        for position, out in enumerate(outputs):
            row = rows[indices[position // n]]
            produced.append(
                {
                    "step": step,
                    "dataset": dataset.name,
                    "index": indices[position // n],
                    "data_source": row["data_source"],
                    "ground_truth": str(row["reward_model"]["ground_truth"]),
                    "response_text": out.text,
                    "response_len": len(out.response_ids),
                    "finish_reason": out.finish_reason,
                }
            )
        judged = judge_rows(panel, produced, "response_text")
        produced = [{**p, **j} for p, j in zip(produced, judged, strict=True)]
        metrics[f"eval/{dataset.name}/accuracy"] = sum(p["correct"] for p in produced) / len(produced)
        samples.extend(produced)
    metrics["eval/accuracy"] = sum(s["correct"] for s in samples) / len(samples)
    metrics["eval/response_len/mean"] = sum(s["response_len"] for s in samples) / len(samples)
    return samples, metrics


def run(config: RLTrainerConfig, step: int, engines) -> dict:
    paths = engines.layout.step(step)
    samples, metrics = [], {"eval/evaluated": 0}
    if is_due(config, step, engines.total_steps):
        samples, metrics = evaluate_policy(config, step, engines)
        metrics["eval/evaluated"] = 1
    write_rows(samples, paths.eval_samples, schema=SAMPLE_SCHEMA)
    return metrics


def after_run(config: RLTrainerConfig, step: int, engines) -> None:
    """Rewrite the eval curve from every evaluated step so far (idempotent, so reruns are safe)."""
    stages = lambda number: ["base" if number == 0 else "evaluate"]  # noqa: E731 - step 0 is evaluated by `base`
    write_curve(engines.layout, "eval", stages, range(0, step + 1), only_if="eval/evaluated")


def outputs(paths) -> list:
    return [paths.eval_samples]
