"""Where the run's policy lives, chosen once when the run starts (:func:`place_policy`): in this
process, or in a group of Ray workers (rlx.workers.group.WorkerGroup). Both answer the same calls
(:class:`PolicyHome`), as verl's driver always talks to a worker group and OpenRLHF's to an actor
group; here the one-process run is a group of one, and each Ray worker is one such home itself
(rlx.workers.worker), so the stage code that trains, checkpoints and exports is the same code on both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rlx import clock
from rlx.config import RLTrainerConfig
from rlx.engines import Engines
from rlx.lineage.fingerprint import fingerprint
from rlx.samplers import Sampler
from rlx.stages import module
from rlx.store.artifacts import read_json
from rlx.store.layout import RunLayout
from rlx.training import lora
from rlx.training.loading import save_policy


class PolicyHome(Protocol):
    """What a step needs of the policy, wherever it lives."""

    runs_apart: bool  # whether its rollouts can overlap the training (rlx.run.ahead): only rollout workers'

    def run(self, name: str, step: int) -> dict:
        """Stage ``name`` of ``step`` (one that ``runs_where_the_policy_is``) where the policy is; its metrics."""

    def sampler(self, step: int) -> Sampler:
        """The engines that generate from the policy after ``step`` steps."""

    def base_fingerprint(self) -> dict:
        """Step 0's record: ``load_from``'s fingerprint as the run loads it."""

    def start_checkpoint(self, step: int):
        """Begin step ``step``'s checkpoint: the host copy to write in the background (or None where the
        policy's ranks write it themselves)."""

    def checkpoint(self, step: int, snapshot=None) -> None:
        """Step ``step``'s checkpoint on disk: ``snapshot`` written, or the write begun before waited for."""

    def write_policy(self, step: int, folder: Path, mark: dict | None = None) -> Path:
        """Step ``step``'s policy as a HF folder (rlx.training.loading.save_policy)."""

    def policy_to_send(self, step: int):
        """The policy after ``step`` steps for another process: the plain model's weights by name (a LoRA
        policy merged, as LMDeploy gets it), or an object-store reference to them."""

    def take_counters(self) -> dict[str, float]:
        """What it counted since last asked (time in actors, bytes through the driver)."""

    def engine_digest(self, step: int) -> str:
        """The digest of the weights its engines sampled the policy after ``step`` steps with ("" where they are
        not read back), which the rollout stage records beside the policy's."""


def own_module_digest(config: RLTrainerConfig, step: int) -> str:
    """The digest of an engine that samples from the policy's own module (no copy; a checkpoint loaded is
    checked as it loads, rlx.training.restore): the one the run recorded for the policy after ``step`` steps.
    LMDeploy holds a copy of its own, not read back here (its modules are not the HF model's): ""."""
    if config.rollout_config.backend != "transformers":
        return ""
    return read_json(RunLayout(config.work_dir).step(step).weights_fingerprint)["digest"]


class InProcess:
    """The policy held in this process, by its :class:`rlx.engines.Engines`."""

    runs_apart = False

    def __init__(self, engines: Engines):
        self.engines, self.config = engines, engines.config

    def run(self, name: str, step: int) -> dict:
        return module(name).run(self.config, step, self.engines.layout.step(step), self.engines)

    def sampler(self, step: int) -> Sampler:
        return self.engines.sampler(step)

    def base_fingerprint(self) -> dict:
        return fingerprint(self.engines.load(self.config.load_from))

    def start_checkpoint(self, step: int):
        """The trainer's state after ``step`` steps copied to host memory, to be written while training goes on."""
        return self.engines.trainer(step).snapshot(self.engines.tokenizer)

    def checkpoint(self, step: int, snapshot=None) -> None:
        snapshot = snapshot or self.start_checkpoint(step)
        module("checkpoint").write_snapshot(snapshot, self.engines.layout.step(step))

    def write_policy(self, step: int, folder: Path, mark: dict | None = None) -> Path:
        adapter = self.config.train_worker_cfg.lora
        keep_adapter = adapter is not None and adapter.export_adapter
        engines = self.engines
        return save_policy(engines.policy(step), engines.tokenizer, folder, engines.base, keep_adapter, mark)

    def policy_to_send(self, step: int) -> dict:
        return dict(lora.full_weights(self.engines.policy(step)))

    def take_counters(self) -> dict[str, float]:
        return {}

    def engine_digest(self, step: int) -> str:
        return own_module_digest(self.config, step)


class ApartRollouts:
    """Training rollouts from rollout workers placed apart from the policy's home (rlx.workers.group.RolloutPool),
    given each new policy by the home before they sample from it."""

    runs_apart = True

    def __init__(self, pool, home: PolicyHome):
        self.pool, self.home = pool, home

    def sampler(self, step: int) -> Sampler:
        if self.pool.held != step:
            with clock.part("weight_sync"):
                self.pool.hold(step, self.home.policy_to_send(step))
        return self.pool.sampler(step)

    def take_counters(self) -> dict[str, float]:
        return self.pool.take_counters()

    def engine_digest(self, step: int) -> str:
        """What the rollout workers proved they hold (rlx.workers.worker.proven_copy)."""
        return self.pool.digests[step]


def place_policy(engines: Engines, group: PolicyHome | None = None, apart=None) -> Engines:
    """``engines`` told where the run's policy lives (``group``: Ray workers; else this process) and what
    generates its training rollouts (``apart``: a rollout pool; else the policy's home)."""
    engines.home = group or InProcess(engines)
    engines.rollouts = ApartRollouts(apart, engines.home) if apart is not None else engines.home
    return engines


def take_counters(engines: Engines) -> dict[str, float]:
    """What the policy's home and the rollout engines counted since last asked, each asked once."""
    counters = {}
    for source in dict.fromkeys((engines.home, engines.rollouts)):
        counters.update(source.take_counters())
    return counters
