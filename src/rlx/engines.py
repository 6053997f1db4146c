"""What stays warm between steps: the policy, its trainer, the rollout engine, the reference model, and
the tokenizer and prompt pool they read with, each loaded on first use and kept while it stays current.

`rlx stage NAME` makes a fresh ``Engines`` per process, so everything comes from disk (cold).
`rlx fit` keeps one for the whole run (warm): the policy the train stage leaves in memory at step N
is the very module step N+1 samples from, with no reload. Both paths run the same stage code.

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

from rlx import clock, seeds
from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.lineage.fingerprint import fingerprint, first_difference, parameter_names
from rlx.samplers import Sampler, TransformersSampler
from rlx.store.artifacts import read_json
from rlx.store.integrity import first_changed
from rlx.store.layout import RunLayout
from rlx.tasks.data import PromptPool
from rlx.training import lora
from rlx.training.loading import load_policy, load_tokenizer, save_policy
from rlx.training.trainer import DEEPSPEED_TAG, PolicyTrainer

log = logging.getLogger(__name__)


def has_optimizer_state(paths) -> bool:
    """Whether a checkpoint can start a replay: step 0's optimizer state is the empty one."""
    return paths.dir.name == "step-0" or (paths.trainer_state / DEEPSPEED_TAG).is_dir()


class Engines:
    def __init__(
        self, config: RLTrainerConfig, replay: Callable | None = None, workers=None, judges=None, rollout_workers=None
    ):
        self.config = config
        self.replay = replay  # (config, trainer, steps, engines): the train stage's replay of recorded updates
        self.workers = workers  # a rlx.workers.group.WorkerGroup: several workers, which hold the policy
        self.judges = judges  # a rlx.workers.judges.JudgePool: with cpu_resources, they judge
        self.rollout_workers = rollout_workers  # a rlx.workers.group.RolloutPool: they generate training rollouts
        self.layout = RunLayout(config.work_dir)
        self._trainer: PolicyTrainer | None = None
        self._trainer_step: int | None = None
        self._policy = None
        self._policy_step: int | None = None
        self._whole, self._whole_step = None, None  # under ZeRO-3: the trainer's policy gathered whole, to sample from
        self._lmdeploy = None  # the run's LMDeploy engine, once started
        self._lmdeploy_step: int | None = None
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

    @property
    def base(self) -> Path:
        """The model a LoRA adapter loads onto: checkpoint 0's copy of it (in the run's folder, found from any
        working directory) or, before that is written, ``load_from``."""
        return self.layout.step(0).policy if self.layout.holds_checkpoint(0) else self.config.load_from

    def load(self, folder: Path, dtype: str = "float32", base: Path | None = None):
        """A model folder loaded for inference as the run loads them (``strict_load``; rlx.training.loading)."""
        return load_policy(folder, dtype, base, strict=self.config.strict_load)

    def base_fingerprint(self) -> dict:
        """Step 0's record: the fingerprint of ``load_from`` as the run loads it; with several workers worker 0
        reads it, so that the driver loads no model (on a GPU node it would take a GPU of the workers')."""
        if self.workers is not None:
            return self.workers.on_first("base_fingerprint")
        return fingerprint(self.load(self.config.load_from))

    def policy(self, step: int):
        """The policy after ``step`` training steps (step 0: the base model), for generation: the
        trainer's module when it holds that step, else the step's checkpoint, else replayed."""
        if self._trainer_step == step:
            return self.trainers_policy()
        if self._policy_step != step:
            if step in self.layout.checkpoints():
                folder = self.layout.step(step).policy
                self._policy = self.checked(self.load(folder, base=self.base), step)
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

    def rollout_sampler(self, step: int) -> Sampler:
        """The engine that generates training rollouts from the policy after ``step`` steps: the rollout
        workers, given that policy first if they do not hold it, or else :meth:`sampler`'s."""
        if self.rollout_workers is None:
            return self.sampler(step)
        if self.rollout_workers.held != step:
            with clock.part("weight_sync"):
                self.rollout_workers.hold(step, self.policy_to_send(step))
        return self.rollout_workers.sampler(step)

    def policy_to_send(self, step: int):
        """The policy after ``step`` steps for another process, as the plain model's weights by name (a LoRA
        policy merged, as LMDeploy gets it): from here, or an object-store reference to train rank 0's."""
        if self.workers is not None:
            return self.workers.policy_ref(step)
        return dict(lora.full_weights(self.policy(step)))

    def take_policy(self, step: int, weights: dict) -> None:
        """Hold ``weights`` as the policy after ``step`` steps: what a rollout worker is given by the trainer,
        loaded into a model of the base's shape made on first use."""
        if self._policy is None:
            self._policy = self.blank_policy()
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
        if self.workers is not None:
            return self.workers.sampler(step)
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
        root = self.replay_root(step)
        self.make_room_for_training()
        if self._trainer is not None and self._policy is self._trainer.module:
            # the trainer moves: the policy it lent is no longer that step's
            self._policy, self._policy_step = None, None
        if self._trainer_step is None or not root <= self._trainer_step < step:
            self._trainer = self.load_checkpoint(root, self.layout.step(max(1, step)).recorded_length())
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

    def snapshot(self, step: int):
        """The trainer's state after ``step`` steps copied to host memory, to be written while training goes
        on (rlx.stages.checkpoint); with several workers each rank copies its own and starts writing it
        itself (rlx.workers.worker.Worker.start_checkpoint), and there is nothing to hand over."""
        if self.workers is not None:
            return self.workers.start_checkpoint(step)
        return self.trainer(step).snapshot(self.tokenizer)

    def replay_root(self, step: int) -> int:
        """The newest checkpoint at or before ``step`` that a replay can start from (it has the optimizer
        state; step 0's is the empty one)."""
        roots = [k for k in self.layout.checkpoints(upto=step) if has_optimizer_state(self.layout.step(k))]
        return roots[-1] if roots else 0  # the base model with a fresh optimizer, checkpoint 0 or not

    def load_checkpoint(self, step: int, total_steps: int) -> PolicyTrainer:
        """The trainer of a checkpoint, its weights (DeepSpeed's copy in ``trainer_state``, which it loads
        over the HF folder's) checked against the step's recorded fingerprint (step 0 without its
        checkpoint: ``load_from`` with a fresh optimizer); its LR schedule spans ``total_steps``."""
        paths = self.layout.step(step)
        if self.layout.holds_checkpoint(step):
            self.check_files(step)
        policy = paths.policy if step else self.base
        worker = self.config.train_worker_cfg
        trainer = PolicyTrainer(
            worker,
            policy,
            paths.trainer_state,
            total_steps * worker.optimizer_steps,
            base_dir=self.base,
            seed=seeds.derive(self.config.seed, 0),  # a new LoRA adapter's initial A
            strict=self.config.strict_load,
        )
        if step:
            self.checked(trainer.module, step, trainer.fingerprint, paths.trainer_state)
        return trainer

    def check_files(self, step: int) -> None:
        """Stop with one line if a file of step ``step``'s checkpoint is not what its writer hashed: the
        fingerprint checks the weights, this the optimizer state too (a read that leaves the files in the
        page cache, where the load then finds them). ``skip_checkpoint_validation``: their sizes only."""
        paths, hashed = self.layout.step(step), not self.config.skip_checkpoint_validation
        if not hashed:
            log.warning(
                "checkpoint of step %d: its files' hashes are not checked (skip_checkpoint_validation), only their "
                "sizes; its weights are still checked against the step's fingerprint",
                step,
            )
        if problem := first_changed(paths.dir, read_json(paths.outputs("checkpoint")), hashed=hashed):
            raise UserError(
                f"checkpoint of step {step} is damaged ({problem}); remove its policy/ and trainer_state/ "
                "and rlx re-creates them by replay from the checkpoint before"
            )

    def checked(self, model, step: int, measure=None, source: Path | None = None):
        """``model``, once its weights match step ``step``'s recorded fingerprint (read in the recorded
        dtypes, or as ``measure()`` gives it); a damaged or foreign checkpoint stops with one line."""
        recorded = read_json(self.layout.step(step).weights_fingerprint)
        actual = measure() if measure else fingerprint(model, like=recorded)
        problem = first_difference(recorded, actual, parameter_names(model))
        if problem:
            source = source or self.layout.step(step).policy
            raise UserError(f"checkpoint {source} is not the policy step {step} recorded ({problem})")
        return model

    def make_room_for_training(self) -> None:
        """An LMDeploy engine sleeps while the trainer works, so the two do not compete for GPU memory."""
        if self._lmdeploy is not None:
            with clock.part("weight_sync"):  # the first half of LMDeploy's weight update
                self._lmdeploy.sleep()

    def write_policy(self, step: int, folder: Path, mark: dict | None = None) -> Path:
        """Step ``step``'s policy as a HF folder (rlx.training.loading.save_policy), written where it is held."""
        if self.workers is not None:
            return self.workers.write_policy(step, folder, mark)
        adapter = self.config.train_worker_cfg.lora
        keep_adapter = adapter is not None and adapter.export_adapter
        return save_policy(self.policy(step), self.tokenizer, folder, self.base, keep_adapter, mark)

    def trainer_advanced_to(self, step: int) -> None:
        """Record that the trainer's in-memory policy is now the one saved for ``step``."""
        self._trainer_step = step
        self._policy, self._policy_step = None, None
