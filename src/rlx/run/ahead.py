"""Rollouts generated ahead of training: ``dataflow_config.max_staleness`` k >= 1.

Step N's rollouts come from the policy of step N-1-k (rlx.config.rollout_policy_step). That policy
exists k steps before step N trains, so before step N's own stages the loop makes the rollouts of step
N+k, from the policy it holds now (step N-1); with rollout workers (``resources.num_rollout_workers``)
they are generated there while this process judges and trains step N. With k = 1::

    step:          1      2      3      4
    generate:     1,2     3      4      5      (rollouts of step 1 and 2 from policy 0, of 3 from 1, ...)
    train:         1      2      3      4      (policy 1, 2, 3, 4)

Which policy generates which step is fixed by k, not by timing, so a step's inputs are the same in any
run, and a step counts as done only once the rollouts it started are written: a resumed run finds every
rollout it cannot make from its current policy already on disk (the one exception, a rollout file lost
since, is made again from its policy re-created by replay).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from rlx.config import RLTrainerConfig, rollout_policy_step
from rlx.engines import Engines
from rlx.stages import is_complete, run_stage
from rlx.store.layout import RunLayout


def staleness_advice(config: RLTrainerConfig) -> str | None:
    """What a run with ``max_staleness`` should know before it starts, if anything: whether generation
    overlaps training here, and whether the update corrects for the lag."""
    resources, staleness = config.resources, config.dataflow_config.max_staleness
    if not staleness:
        return None
    advice = []
    if not resources.num_rollout_workers:
        advice.append(
            "generation and update run in turn in this process (set resources.num_rollout_workers: 1 to overlap them)"
        )
    if not config.train_worker_cfg.loss_cfg.rollout_correction.enabled:
        advice.append(
            "the update does not correct for the lag (train_worker_cfg.loss_cfg.rollout_correction.mode: decoupled "
            "is AReaL's objective for it)"
        )
    return f"dataflow_config.max_staleness {staleness}: {'; '.join(advice)}" if advice else None


class RolloutsAhead:
    """The rollouts a step makes for the steps after it, in the background when rollout workers generate."""

    def __init__(self, config: RLTrainerConfig, engines: Engines, total: int):
        self.config, self.engines, self.total = config, engines, total
        self.staleness = config.dataflow_config.max_staleness
        overlapped = self.staleness and engines.rollouts.runs_apart
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="rlx-rollout") if overlapped else None
        self.pending: Future | None = None

    def start(self, step: int) -> None:
        """Before step ``step``'s stages: the missing rollouts of steps ``step`` to ``step + k`` (usually only
        the last, which the policy held now generates); the last in the background if it can be."""
        if not self.staleness:
            return  # each step's rollout stage makes its own
        layout = RunLayout(self.config.work_dir)
        upto = min(step + self.staleness, self.total)
        missing = [n for n in range(step, upto + 1) if not is_complete("rollout", n, layout)]
        for number in missing:
            run_stage("prepare", self.config, number, self.engines)  # cheap; it reseeds the RNGs: not in a thread
            if self.thread is not None and number == missing[-1]:
                self.engines.rollouts.sampler(rollout_policy_step(number, self.staleness))  # the policy sent now
                self.pending = self.thread.submit(run_stage, "rollout", self.config, number, self.engines)
            else:
                run_stage("rollout", self.config, number, self.engines)

    def wait(self) -> dict[str, float]:
        """After step ``step``'s stages: wait for the rollouts it started (before the step may count as done)."""
        started = time.perf_counter()
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()
        return {"time/rollout_wait": time.perf_counter() - started} if self.staleness else {}

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(wait=True, cancel_futures=True)
