"""Stage ``rollout``: ``prompt_repeat_k`` responses per prompt group from the previous step's policy.

Output ``step-N/rollouts.parquet``, one row per response, ordered group by group: ``step, group,
sample, data_source, ground_truth, prompt_ids, response_ids, response_text, rollout_logprobs,
finish_reason, prompt_len, response_len``.
"""

from __future__ import annotations

import time

from rlx.artifacts import read_rows, write_rows
from rlx.config import RLTrainerConfig
from rlx.rollout import generate


def sampling_seed(config: RLTrainerConfig, step: int) -> int:
    """Each step samples with its own seed, fixed by the run's seed: a rerun draws the same responses."""
    params = config.dataflow_config.sample_params
    return (params.seed if params.seed is not None else config.seed) * 1_000_003 + step


def run(config: RLTrainerConfig, step: int, engines) -> dict:
    paths = engines.layout.step(step)
    groups = read_rows(paths.prompts)
    k = config.dataflow_config.prompt_repeat_k
    started = time.perf_counter()
    generations = generate(
        config.rollout_config,
        engines.policy(step - 1),
        engines.tokenizer,
        [group["prompt_ids"] for group in groups for _ in range(k)],
        config.dataflow_config.sample_params,
        seed=sampling_seed(config, step),
    )
    seconds = time.perf_counter() - started
    rows = []
    for position, out in enumerate(generations):
        group = groups[position // k]
        rows.append(
            {
                "step": step,
                "group": group["group"],
                "sample": position % k,
                "data_source": group["data_source"],
                "ground_truth": group["ground_truth"],
                "prompt_ids": out.prompt_ids,
                "response_ids": out.response_ids,
                "response_text": out.text,
                "rollout_logprobs": out.logprobs,
                "finish_reason": out.finish_reason,
                "prompt_len": len(out.prompt_ids),
                "response_len": len(out.response_ids),
            }
        )
    write_rows(rows, paths.rollouts)
    lengths = [row["response_len"] for row in rows]
    return {
        "response/response_len/mean": sum(lengths) / len(lengths),
        "response/response_len/max": max(lengths),
        "response/truncated_frac": sum(row["finish_reason"] == "length" for row in rows) / len(rows),
        "perf/rollout_tokens_per_s": sum(lengths) / seconds,
    }


def outputs(paths) -> list:
    return [paths.rollouts]
