"""The reward an agent's environment gave its rollout (its ``reward()``, rlx.agents.tools) as a judger
like the others (weighted, chosen by ``data_source``, its failures counted): it reads the
``environment_reward`` the rollout recorded, so judging never calls the environment again."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvironmentJudger:
    correct_score: float = 1.0
    in_process = True

    def extract(self, response: str) -> str | None:
        return None

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        row = row or {}
        if "environment_reward" not in row:
            raise ValueError("no environment_reward: the row was not made by an agent_loop_config.environment")
        if row["environment_reward"] is None:
            raise ValueError(row.get("environment_error") or "the environment has no reward()")
        return row["environment_reward"]
