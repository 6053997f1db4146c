"""Judging artifact rows: the judgment columns of each row, as ``judged.parquet`` and
``eval_samples.parquet`` hold them. Used by the judge stage, by the rollout stage's dynamic-sampling
filter (whose verdicts the judge stage then reuses) and by evaluation."""

from __future__ import annotations

import json

import torch

from rlx.agents.loop import FAILED
from rlx.algo.shaping import overlong_penalty
from rlx.config import RLTrainerConfig
from rlx.judgers import Panel, Verdict

TOKEN_COLUMNS = ("prompt_ids", "response_ids", "rollout_logprobs", "response_mask")
VERDICT = "judgment"  # rollouts.parquet's column of the filter's verdicts, when dynamic sampling judged them


def judge_rows(panel: Panel, rows: list[dict], text_key: str) -> list[dict]:
    """Judge each row's response; returns the judgment columns, in order. Judgers see the row's
    fields (without the token columns). An agent's rollout whose environment failed to start has no
    response to judge, nor one whose program failed: each scores 0, the failure kept as the judgment's error."""
    unstarted = [row.get("finish_reason") in FAILED for row in rows]
    items = [
        (row[text_key], row["data_source"], row["ground_truth"], {k: row[k] for k in row if k not in TOKEN_COLUMNS})
        for row, skipped in zip(rows, unstarted, strict=True)
        if not skipped
    ]
    judged = iter(panel.judge_many(items))
    verdicts = [
        Verdict(0.0, {}, None, False, f"{FAILED[row['finish_reason']]}: {row['environment_error']}")
        if skipped
        else next(judged)
        for row, skipped in zip(rows, unstarted, strict=True)
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
        for verdict in verdicts
    ]


def answer_column(rows: list[dict]) -> str:
    """What judgers score: an agent's last turn (``final_text``; the whole trajectory is in the row they
    also get), else the response."""
    return "final_text" if rows and "final_text" in rows[0] else "response_text"


def judge_rollouts(config: RLTrainerConfig, panel: Panel, rollouts: list[dict]) -> list[dict]:
    """The judgment columns of rollout rows, with DAPO's overlong penalty added to the reward when
    ``judger_config.overlong_buffer`` is on: the reward that training uses."""
    judged = judge_rows(panel, rollouts, answer_column(rollouts))
    buffer = config.judger_config.overlong_buffer
    if buffer.enable:
        lengths = torch.tensor([row["response_len"] for row in rollouts])
        max_tokens = config.dataflow_config.sample_params.max_tokens
        penalties = overlong_penalty(lengths, max_tokens, buffer.len, buffer.penalty_factor).tolist()
        for row, penalty in zip(judged, penalties, strict=True):
            row["reward"] += penalty
            row["overlong_penalty"] = penalty
    return judged


class PanelJudging:
    """Judging in this process: the run's judgers made for each call, as a cold `rlx stage judge` makes them
    (rlx.workers.judges.JudgePool deals the same work out to CPU actors)."""

    def __init__(self, config: RLTrainerConfig):
        self.config = config

    def judge(self, rollouts: list[dict]) -> list[dict]:
        """The judgment columns of ``rollouts``, in order."""
        return judge_rollouts(self.config, Panel(self.config.judger_config), rollouts)
