"""What every process keeps warm between steps: the tokenizer and prompt pool, the policy and its
trainer, the rollout engine and the reference model, each loaded on first use and kept while it
stays current.

`rlx stage NAME` makes a fresh ``Engines`` per process, so everything comes from disk (cold).
`rlx fit` keeps one for the whole run (warm): the policy the train stage leaves in memory at step N
is the very module step N+1 samples from, with no reload. Both paths run the same stage code.

Where the run's policy lives (this process, or a group of Ray workers that each keep an ``Engines``
of their own) is the ``home`` the run gives it (rlx.workers.home); which engines generate the training
rollouts is its ``rollouts``; who judges is its ``judging``. Stages ask those, never which they are.

Re-creating a policy that has no checkpoint replays recorded updates with the train stage's code,
which the maker passes in (``replay``): engines are below the stages and do not import them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path

import torch

from rlx import clock
from rlx.config import RLTrainerConfig
from rlx.samplers import Sampler, TransformersSampler
from rlx.store.layout import RunLayout
from rlx.tasks.data import PromptPool
from rlx.training import lora
from rlx.training.loading import load_policy, load_tokenizer
from rlx.training.restore import checked, checkpointed_trainer, replay_root
from rlx.training.teachers import Teacher, load_teacher
from rlx.training.trainer import PolicyTrainer

log = logging.getLogger(__name__)


class Engines:
    def __init__(self, config: RLTrainerConfig, replay: Callable | None = None, judging=None):
        self.config = config
        self.replay = replay  # (config, trainer, steps, engines): the train stage's replay of recorded updates
        self.home = None  # where the policy lives: set by rlx.workers.home.place_policy
        self.rollouts = None  # what generates the training rollouts: the home, or rollout workers apart from it
        self.judging = judging  # who judges: rlx.judgers.rows.PanelJudging, or CPU actors (cpu_resources)
        self.layout = RunLayout(config.work_dir)
        self._trainer: PolicyTrainer | None = None
        self._trainer_step: int | None = None
        self._policy = None
        self._policy_step: int | None = None
        self._whole, self._whole_step = None, None  # under ZeRO-3: the trainer's policy gathered whole, to sample from
        self._lmdeploy = None  # the run's LMDeploy engine, once started
        self._lmdeploy_step: int | None = None
        self._teachers = {}  # on-policy distillation's teacher models, by name
        self.replay_seconds = 0.0  # spent re-creating policies from checkpoints (`rlx fit` logs it as time/replay)

    @cached_property
    def tokenizer(self):
        return load_tokenizer(self.config.tokenizer_path, self.config.load_from)

    @property
    def prompt_pool(self) -> PromptPool:
        """The run's prompts, tokenized: PromptPool.load keeps them for the process while their files stay."""
        return PromptPool.load(self.config, self.tokenizer)

    @cached_property
    def reference(self):
        """The frozen base model, loaded only when a KL term needs it (not under LoRA: the trainer's
        base with its adapter switched off is the reference)."""
        return self.load(self.config.load_from, self.config.rollout_config.dtype).requires_grad_(False)

    def teacher(self, teacher: Teacher, check: Callable[[], None]):
        """A teacher's model (rlx.training.teachers), loaded on first use, after ``check`` (its fingerprint), and
        kept: one copy in the process, however many steps it scores; a run's step re-created through that
        run's own engines."""
        if teacher.name not in self._teachers:
            check()
            self._teachers[teacher.name] = load_teacher(teacher, self.config, lambda run: Engines(run, self.replay))
        return self._teachers[teacher.name]

    @property
    def base(self) -> Path:
        """The model a LoRA adapter loads onto: checkpoint 0's copy of it (in the run's folder, found from any
        working directory) or, before that is written, ``load_from``."""
        return self.layout.step(0).policy if self.layout.holds_checkpoint(0) else self.config.load_from

    def load(self, folder: Path, dtype: str = "float32", base: Path | None = None):
        """A model folder loaded for inference as the run loads them (``strict_load``; rlx.training.loading)."""
        return load_policy(folder, dtype, base, strict=self.config.strict_load)

    def policy(self, step: int):
        """The policy after ``step`` training steps (step 0: the base model), for generation: the
        trainer's module when it holds that step, else the step's checkpoint, else replayed."""
        if self._trainer_step == step:
            return self.trainers_policy()
        if self._policy_step != step:
            if step in self.layout.checkpoints():
                folder = self.layout.step(step).policy
                self._policy = checked(self.layout, self.load(folder, base=self.base), step)
            elif step == 0:  # before checkpoint 0 is written (a cold `dvc repro` may run it later)
                self._policy = self.load(self.config.load_from)
            else:
                self.trainer(step)
                return self.trainers_policy()
            self._policy_step = step
        return self._policy

    def trainers_policy(self):
        """The policy the trainer holds: its module, or under ZeRO-3 a whole copy gathered from its pieces
        (once per step, on every rank together), since generation runs a different number of forwards on
        each rank, which ZeRO-3's per-layer gathers cannot follow."""
        if not self._trainer.partitioned:
            return self._trainer.module
        if self._whole_step != self._trainer_step:
            if self._whole is None:
                self._whole = self.blank_policy()
            targets = self._whole.state_dict(keep_vars=True)
            with torch.no_grad():
                for name, tensor in self._trainer.gathered_weights():
                    targets[name].copy_(tensor)
            self._whole_step = self._trainer_step
        return self._whole

    def policy_weights(self, step: int) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy after ``step`` steps as the plain model's weights by name (a LoRA policy merged), read as
        they are sent: under ZeRO-3 gathered straight from the trainer (every rank must read them)."""
        if self._trainer_step == step and self._trainer.partitioned:
            return self._trainer.gathered_weights()
        return lora.full_weights(self.policy(step))

    def take_policy(self, step: int, weights: dict) -> None:
        """Hold ``weights`` as the policy after ``step`` steps: what a rollout worker is given by the trainer,
        loaded into a model of the base's shape made on first use, its parameters NaN until then, so that a
        tensor the sync missed cannot pass for the base's (miles' check-weight-update-equal)."""
        if self._policy is None:
            self._policy = self.blank_policy()
            with torch.no_grad():
                for parameter in self._policy.parameters():
                    parameter.fill_(float("nan"))
        self._policy.load_state_dict(weights)
        self._policy_step = step

    def blank_policy(self):
        """A model of the base's shape and rollout dtype, for a copy of a policy given to it weight by weight."""
        return self.load(self.config.load_from, self.config.rollout_config.dtype).requires_grad_(False)

    def sampler(self, step: int) -> Sampler:
        """The rollout engine, holding the policy after ``step`` steps. LMDeploy's engine is started
        once, from the newest checkpoint folder at or before ``step``, and then given each new policy
        from memory: the trainer's when it holds that step (warm `rlx fit`), else loaded or replayed; a
        LoRA policy as merged weights (LMDeploy 0.18 takes adapters only when it starts)."""
        config = self.config.rollout_config
        if config.backend == "transformers":
            return TransformersSampler(self.policy(step), self.tokenizer, config)
        if self._lmdeploy is None:
            # a LoRA checkpoint is an adapter, which LMDeploy cannot take for weights it updates: start from the base
            saved = [] if self.config.train_worker_cfg.lora else self.layout.checkpoints(upto=step)
            folder = self.layout.step(saved[-1]).policy if saved else self.base
            self._lmdeploy, self._lmdeploy_step = self.sampler_at(folder), saved[-1] if saved else 0
        if self._lmdeploy_step != step:
            with clock.part("weight_sync"):
                self._lmdeploy.load_weights(self.policy_weights(step))
        self._lmdeploy_step = step
        return self._lmdeploy

    def sampler_at(self, folder: Path) -> Sampler:
        """A new rollout engine for the model in ``folder`` (e.g. the model `rlx eval` scores)."""
        config = self.config.rollout_config
        if config.backend == "transformers":
            return TransformersSampler(self.load(folder, config.dtype), self.tokenizer, config)
        from rlx.samplers.lmdeploy_backend import LMDeploySampler

        agent = self.config.dataflow_config.agent_loop_config is not None
        return LMDeploySampler(folder, self.tokenizer, config, agent)

    def trainer(self, step: int) -> PolicyTrainer:
        """A trainer holding the policy after ``step`` steps, with its optimizer state: the one in memory,
        or loaded from the newest checkpoint at or before ``step`` that has an optimizer state, then
        brought forward by replaying the recorded updates after it (checked by their fingerprints)."""
        if self._trainer_step == step:
            return self._trainer
        root = replay_root(self.layout, step)
        self.make_room_for_training()
        if self._trainer is not None and self._policy is self._trainer.module:
            # the trainer moves: the policy it lent is no longer that step's
            self._policy, self._policy_step = None, None
        if self._trainer_step is None or not root <= self._trainer_step < step:
            total = self.layout.step(max(1, step)).recorded_length()
            self._trainer = checkpointed_trainer(self.config, root, total, self.base)
            self._trainer_step = root
        if self._trainer_step < step:
            if self.replay is None:
                raise RuntimeError(f"re-creating the policy of step {step} needs a replay; make Engines with one")
            started = time.perf_counter()
            self.replay(self.config, self._trainer, range(self._trainer_step + 1, step + 1), self)
            self.replay_seconds += time.perf_counter() - started
            log.info("replayed steps %d-%d in %.1f s", self._trainer_step + 1, step, time.perf_counter() - started)
            self._trainer_step = step
        return self._trainer

    def make_room_for_training(self) -> None:
        """An LMDeploy engine sleeps while the trainer works, so the two do not compete for GPU memory."""
        if self._lmdeploy is not None:
            with clock.part("weight_sync"):  # the first half of LMDeploy's weight update
                self._lmdeploy.sleep()

    def trainer_advanced_to(self, step: int) -> None:
        """Record that the trainer's in-memory policy is now the one saved for ``step``."""
        self._trainer_step = step
        self._policy, self._policy_step = None, None
