"""Judging in CPU actors (``cpu_resources``, XTuner's ``CPUResourcesConfig``): the judge stage deals a
step's responses out to ``cpu_resources.num_workers`` Ray actors in contiguous shares and gathers their
verdicts in order, for judgers too slow for one process. Each actor builds its judgers once, as the
driver would, so a verdict is the one the driver would give (a judger's time limit included)."""

from __future__ import annotations

from pathlib import Path

from rlx.config import RLTrainerConfig
from rlx.judgers import Panel
from rlx.judgers.rows import judge_rollouts
from rlx.workers.actors import Actor, ActorGroup
from rlx.workers.cluster import judge_bundle


class Judge(Actor):
    def __init__(self, label: str, shown: bool, config: RLTrainerConfig, project: str):
        super().__init__(label, shown, config, project)
        self.config, self.panel = config, Panel(config.judger_config)

    def judge(self, rollouts: list[dict]) -> list[dict]:
        return judge_rollouts(self.config, self.panel, rollouts)


class JudgePool(ActorGroup):
    def __init__(self, ray, config: RLTrainerConfig):
        judges = config.cpu_resources
        count, strategy = judges.num_workers, judges.pg_pack_strategy
        arguments = lambda _: (config, str(Path.cwd()))  # noqa: E731
        super().__init__(ray, Judge, "judge", judge_bundle(config), count, strategy, arguments)

    def judge(self, rollouts: list[dict]) -> list[dict]:
        """The judgment columns of ``rollouts``, in order, as rlx.judgers.rows.judge_rollouts gives them."""
        count = len(self.actors)
        cuts = [len(rollouts) * part // count for part in range(count + 1)]
        shares = [(rollouts[start:end],) for start, end in zip(cuts[:-1], cuts[1:], strict=True)]
        return [verdict for part in self.call_each("judge", shares, what="judging") for verdict in part]
