"""Stage ``judge``: every response scored by the judgers of its ``data_source``.

Output ``step-N/judged.parquet``, one row per response in rollout order: ``step, group, sample,
reward`` (the weighted total plus any overlong penalty), ``scores`` (each judger's, as JSON),
``extracted, correct, error, overlong_penalty``.
"""

from __future__ import annotations

import json

import torch

from rlx.algo.shaping import overlong_penalty
from rlx.artifacts import read_rows, write_rows
from rlx.config import RLTrainerConfig
from rlx.judgers import Panel

TOKEN_COLUMNS = ("prompt_ids", "response_ids", "rollout_logprobs")


def judge_rows(panel: Panel, rows: list[dict], text_key: str) -> list[dict]:
    """Judge each row's response; returns the judgment columns, in order. Judgers see the row's
    fields (without the token columns)."""
    items = [
        (
            row[text_key],
            row["data_source"],
            row["ground_truth"],
            {k: v for k, v in row.items() if k not in TOKEN_COLUMNS},
        )
        for row in rows
    ]
    return [
        {
            "reward": verdict.reward,
            "scores": json.dumps(verdict.scores),
            "extracted": verdict.extracted,
            "correct": verdict.correct,
            "error": verdict.error,
            "overlong_penalty": 0.0,
        }
        for verdict in panel.judge_many(items)
    ]


def run(config: RLTrainerConfig, step: int, engines) -> dict:
    paths = engines.layout.step(step)
    rollouts = read_rows(paths.rollouts)
    judged = judge_rows(Panel(config.judger_config), rollouts, "response_text")
    buffer = config.judger_config.overlong_buffer
    if buffer.enable:
        lengths = torch.tensor([row["response_len"] for row in rollouts])
        max_tokens = config.dataflow_config.sample_params.max_tokens
        penalties = overlong_penalty(lengths, max_tokens, buffer.len, buffer.penalty_factor).tolist()
        for row, penalty in zip(judged, penalties, strict=True):
            row["reward"] += penalty
            row["overlong_penalty"] = penalty
    rows = [
        {"step": step, "group": r["group"], "sample": r["sample"], **j} for r, j in zip(rollouts, judged, strict=True)
    ]
    write_rows(rows, paths.judged)
    rewards = torch.tensor([row["reward"] for row in rows])
    groups = rewards.view(-1, config.dataflow_config.prompt_repeat_k)
    errors = [row["error"] for row in rows if row["error"]]
    return {
        "response/rewards/mean": rewards.mean().item(),
        "response/rewards/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "response/rewards/max": rewards.max().item(),
        "response/rewards/min": rewards.min().item(),
        "response/correct/mean": sum(row["correct"] for row in rows) / len(rows),
        "response/zero_std_groups_frac": (groups.std(dim=1) == 0).float().mean().item(),
        "response/overlong_penalty/mean": sum(row["overlong_penalty"] for row in rows) / len(rows),
        "judge/errors": len(errors),
        "judge/first_error": errors[0] if errors else "",
    }


def outputs(paths) -> list:
    return [paths.judged]
