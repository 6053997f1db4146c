"""Stage ``judge``: every response scored by the judgers of its ``data_source``.

Output ``step-N/judged.parquet``, one row per response in rollout order: ``step, group, sample,
reward`` (the weighted total plus any overlong penalty), ``scores`` (each judger's, as JSON),
``extracted, correct, error, overlong_penalty``. With dynamic sampling the rollout stage has judged
the responses already (to filter groups) and kept its verdicts in ``rollouts.parquet``: they are
reused, so the filter and the update see the same rewards.
"""

from __future__ import annotations

import torch

from rlx.config import RLTrainerConfig
from rlx.judgers.rows import VERDICT
from rlx.store.artifacts import read_rows, write_rows
from rlx.store.layout import StepPaths


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    rollouts = read_rows(paths.checked(paths.rollouts))
    if VERDICT in rollouts[0]:  # judged already, by the filter that kept these groups
        judged = [row.pop(VERDICT) for row in rollouts]
    else:  # in this process, or with cpu_resources in CPU actors (rlx.workers.judges)
        judged = engines.judging.judge(rollouts)
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
