"""Stage ``evaluate``: the new policy on the held-out sets, every ``evaluate_step`` steps and at the end.

Output ``step-N/eval_samples.parquet`` (one row per response: ``step, dataset, index, data_source,
ground_truth, response_text, response_len, finish_reason, reward, extracted, correct``; empty on a
step without evaluation) and ``curves/eval.csv``. Metrics: ``eval/accuracy`` (mean@1 over all sets) and,
per set, ``eval/<dataset>/accuracy`` (mean@1), with ``n`` samples per prompt also ``mean@n``, ``pass@k``
(unbiased estimator) and ``maj@n``, plus response length, truncation rate and accuracy per data source.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pyarrow as pa

from rlx.agents.loop import reset_row, tool_use
from rlx.agents.programs import agent_loop
from rlx.config import JudgerItemConfig, RLTrainerConfig
from rlx.judgers import Panel
from rlx.judgers.rows import answer_column, judge_rows
from rlx.samplers import Sampler
from rlx.stages.curves import write_curve
from rlx.store.artifacts import write_rows
from rlx.store.layout import RunLayout, StepPaths
from rlx.tasks.data import load_rows, tool_schemas
from rlx.tokens import prompts_ids

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
AGENT_SAMPLE_SCHEMA = pa.schema(
    [
        *SAMPLE_SCHEMA,
        ("final_text", pa.string()),
        ("turns", pa.int64()),
        ("tool_calls", pa.string()),
        ("environment_reward", pa.float64()),
        ("environment_error", pa.string()),
    ]
)  # with an agent loop: as rollouts.parquet holds them (rlx.stages.rollout)


def is_due(config: RLTrainerConfig, step: int, total_steps: int) -> bool:
    evaluator = config.evaluator_config
    if not evaluator.enable_evaluate:
        return False
    if step == 0:
        return evaluator.enable_initial_evaluate
    return step % evaluator.evaluate_step == 0 or step == total_steps


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k estimator of Chen et al. (2021): ``1 - C(n - c, k) / C(n, k)``."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def majority_correct(samples: list[dict]) -> bool:
    """Whether the most frequent extracted answer (ties: the first seen) is a correct one (maj@k)."""
    answers = [s["extracted"] for s in samples if s["extracted"] is not None]
    if not answers:
        return False
    top = Counter(answers).most_common(1)[0][0]
    return next(s["correct"] for s in samples if s["extracted"] == top)


def dataset_metrics(prefix: str, samples: list[dict], n: int) -> dict[str, float]:
    """mean@1 (``accuracy``), mean@n, pass@k for k = 1, 2, 4, ... up to n, maj@n, lengths, truncation."""
    prompts = [samples[i : i + n] for i in range(0, len(samples), n)]
    metrics = {
        f"{prefix}/accuracy": sum(s["correct"] for s in samples) / len(samples),
        f"{prefix}/response_len/mean": sum(s["response_len"] for s in samples) / len(samples),
        f"{prefix}/truncated_frac": sum(s["finish_reason"] == "length" for s in samples) / len(samples),
    }
    if n > 1:
        metrics[f"{prefix}/mean@{n}"] = metrics[f"{prefix}/accuracy"]
        metrics[f"{prefix}/maj@{n}"] = sum(majority_correct(p) for p in prompts) / len(prompts)
        for k in (2**i for i in range(n.bit_length()) if 2**i <= n):
            metrics[f"{prefix}/pass@{k}"] = sum(pass_at_k(n, sum(s["correct"] for s in p), k) for p in prompts) / len(
                prompts
            )
    return metrics


def dataset_panel(config: RLTrainerConfig, dataset, rows: list[dict]) -> Panel:
    """The set's own judger for all its rows if it names one, else the run's judgers by data_source."""
    if dataset.judger_name is None:
        return Panel(config.judger_config)
    own = JudgerItemConfig(
        judger_name=dataset.judger_name,
        data_source=sorted({row["data_source"] for row in rows}),
        options=dataset.judger_options,
    )
    return Panel(config.judger_config.model_copy(update={"reward_judger_configs": [own]}))


def respond(config: RLTrainerConfig, sampler: Sampler, tokenizer, rows: list[dict], params, seed: int) -> list:
    """One response per dataset row: a reply, or with the run's agent loop its whole rollout (the policy is
    evaluated acting as it is trained to)."""
    agent, tools = config.dataflow_config.agent_loop_config, tool_schemas(config)
    ids = prompts_ids(tokenizer, [row["prompt"] for row in rows], tools)
    if agent is None:
        return sampler.generate(ids, params, seed=seed)
    loop = agent_loop(agent, tokenizer, params)
    resets = [reset_row(row["data_source"], row["prompt"], str(row["reward_model"]["ground_truth"])) for row in rows]
    return loop.run(sampler, loop.starts(resets, ids), seed)


def evaluate_policy(config: RLTrainerConfig, sampler: Sampler, tokenizer, step: int) -> tuple[list[dict], dict]:
    """Generate on every eval set with ``sampler`` and judge the answers; returns samples and metrics."""
    evaluator = config.evaluator_config
    samples, metrics = [], {}
    for dataset in evaluator.dataset_cfg:
        rows = load_rows(dataset.anno_path)
        count = max(1, round(len(rows) * dataset.sample_ratio * evaluator.eval_sample_ratio))
        indices = sorted(random.Random(config.seed).sample(range(len(rows)), count))
        params = dataset.sample_params or evaluator.sample_params
        seed = config.seed if params.seed is None else params.seed
        outputs = respond(config, sampler, tokenizer, [rows[i] for i in indices for _ in range(params.n)], params, seed)
        produced = []
        for position, out in enumerate(outputs):
            row = rows[indices[position // params.n]]
            produced.append(
                {
                    "step": step,
                    "dataset": dataset.name,
                    "index": indices[position // params.n],
                    "data_source": row["data_source"],
                    "ground_truth": str(row["reward_model"]["ground_truth"]),
                    "response_text": out.text,
                    "response_len": len(out.response_ids),
                    "finish_reason": out.finish_reason,
                    **(out.columns() if config.dataflow_config.agent_loop_config else {}),
                }
            )
        judged = judge_rows(dataset_panel(config, dataset, rows), produced, answer_column(produced))
        produced = [{**p, **j} for p, j in zip(produced, judged, strict=True)]
        metrics.update(dataset_metrics(f"eval/{dataset.name}", produced, params.n))
        for source in sorted({p["data_source"] for p in produced}):
            of_source = [p for p in produced if p["data_source"] == source]
            metrics[f"eval/source/{source}/accuracy"] = sum(p["correct"] for p in of_source) / len(of_source)
        samples.extend(produced)
    if config.dataflow_config.agent_loop_config:
        metrics.update(tool_use(samples, "eval/agent"))
    metrics["eval/accuracy"] = sum(s["correct"] for s in samples) / len(samples)
    metrics["eval/response_len/mean"] = sum(s["response_len"] for s in samples) / len(samples)
    return samples, metrics


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    samples, metrics = [], {"eval/evaluated": 0}
    if is_due(config, step, paths.recorded_length() if step else 0):  # base: before any prepare
        samples, metrics = evaluate_policy(config, engines.home.sampler(step), engines.tokenizer, step)
        metrics["eval/evaluated"] = 1
    agent = config.dataflow_config.agent_loop_config is not None
    write_rows(samples, paths.eval_samples, schema=AGENT_SAMPLE_SCHEMA if agent else SAMPLE_SCHEMA)
    return metrics


def after_run(config: RLTrainerConfig, layout: RunLayout, step: int) -> None:
    """Rewrite the eval curve from every evaluated step so far (idempotent, so reruns are safe)."""
    stages = lambda number: ["base" if number == 0 else "evaluate"]  # noqa: E731 - step 0 is evaluated by `base`
    write_curve(layout, "eval", stages, range(0, step + 1), only_if="eval/evaluated")


def outputs(paths) -> list:
    return [paths.eval_samples]
