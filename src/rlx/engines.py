"""The models and data a step needs, loaded on first use and kept while they stay current.

`rlx stage NAME` makes a fresh ``Engines`` per process, so everything comes from disk (cold).
`rlx fit` keeps one for the whole run (warm): the policy the train stage leaves in memory at step N
is the very module step N+1 samples from, with no reload. Both paths run the same stage code.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.layout import RunLayout
from rlx.rollout import Sampler, TransformersSampler
from rlx.trainer import PolicyTrainer


def load_policy(path):
    """A HF model folder for inference (on the GPU when there is one), with a clear error when it is missing or not one.
    Weights load from safetensors only: a pickled ``*.bin`` checkpoint could run code when read."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a model folder (no config.json)")
    if not any(path.glob("*.safetensors")):
        found = ", ".join(sorted(p.name for p in path.glob("*.bin"))) or "none"
        raise UserError(
            f"{path}: no *.safetensors weights (found *.bin: {found}); rlx loads safetensors only: "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load the model ({first_line(exc)})") from None
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def check_vocabulary(tokenizer, tokenizer_path: Path, model_path: Path) -> None:
    """Refuse a tokenizer with ids the model has no embedding for: they would fail deep inside a
    forward pass (on CPU) or read other memory (on GPU), long after the cause could be named."""
    if not (Path(model_path) / "config.json").is_file():
        raise UserError(f"load_from {model_path}: not a model folder (no config.json)")
    vocab_size = AutoConfig.from_pretrained(model_path).get_text_config().vocab_size
    if len(tokenizer) > vocab_size:
        raise UserError(
            f"tokenizer_path {tokenizer_path}: the tokenizer has {len(tokenizer)} tokens but the model in "
            f"load_from {model_path} embeds only {vocab_size} (vocab_size); use the tokenizer the model was "
            "trained with"
        )


class Engines:
    def __init__(self, config: RLTrainerConfig):
        self.config = config
        self.layout = RunLayout(config.work_dir)
        self._trainer: PolicyTrainer | None = None
        self._trainer_step: int | None = None
        self._policy = None
        self._policy_step: int | None = None
        self._lmdeploy = None  # the run's LMDeploy engine, once started
        self._lmdeploy_step: int | None = None

    @cached_property
    def tokenizer(self):
        path = self.config.tokenizer_path
        if not (path / "tokenizer_config.json").is_file():
            raise UserError(f"tokenizer_path {path}: no tokenizer there (build the demo model with `dvc repro`)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        except (OSError, ValueError) as exc:
            raise UserError(f"tokenizer_path {path}: cannot load the tokenizer ({first_line(exc)})") from None
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if not tokenizer.chat_template:
            raise UserError(
                f"tokenizer_path {path}: the tokenizer has no chat template (rlx renders prompts as chat "
                "messages; use an instruct model's tokenizer or set tokenizer.chat_template and save it)"
            )
        check_vocabulary(tokenizer, path, self.config.load_from)
        return tokenizer

    @cached_property
    def prompt_pool(self):
        from rlx.stages.prepare import PromptPool

        return PromptPool.load(self.config, self.tokenizer)

    @cached_property
    def total_steps(self) -> int:
        """The run's length: ``rollout_steps`` if set, else ``total_epochs`` x steps per epoch."""
        if self.config.rollout_steps:
            return self.config.rollout_steps
        return self.config.total_epochs * self.prompt_pool.steps_per_epoch(
            self.config.dataflow_config.global_batch_size
        )

    @cached_property
    def reference(self):
        """The frozen base model, loaded only when a KL term needs it."""
        model = load_policy(self.config.load_from)
        return model.requires_grad_(False)

    def policy(self, step: int):
        """The policy after ``step`` training steps (step 0: the base model), for generation."""
        if self._trainer_step == step:
            return self._trainer.module
        if self._policy_step != step:
            self._policy, self._policy_step = load_policy(self.layout.step(step).policy), step
        return self._policy

    def sampler(self, step: int) -> Sampler:
        """The rollout engine, holding the policy after ``step`` steps. LMDeploy's engine is started
        once and then given each new policy: from the trainer's memory when it holds that step
        (warm `rlx fit`), else from the step's folder."""
        config = self.config.rollout_config
        if config.backend == "transformers":
            return TransformersSampler(self.policy(step), self.tokenizer, config)
        from rlx.rollout.lmdeploy_backend import read_weights

        if self._lmdeploy is None:
            self._lmdeploy = self.sampler_at(self.layout.step(step).policy)
        elif self._lmdeploy_step != step:
            in_memory = self._trainer_step == step
            weights = self._trainer.module.state_dict() if in_memory else read_weights(self.layout.step(step).policy)
            self._lmdeploy.load_weights(weights)
        self._lmdeploy_step = step
        return self._lmdeploy

    def sampler_at(self, folder: Path) -> Sampler:
        """A new rollout engine for the model in ``folder`` (e.g. the model `rlx eval` scores)."""
        config = self.config.rollout_config
        if config.backend == "transformers":
            return TransformersSampler(load_policy(folder), self.tokenizer, config)
        from rlx.rollout.lmdeploy_backend import LMDeploySampler

        return LMDeploySampler(folder, self.tokenizer, config)

    def trainer(self, step: int) -> PolicyTrainer:
        """A trainer holding the policy after ``step`` steps, with its optimizer state (an LMDeploy
        engine sleeps meanwhile, so the two do not compete for GPU memory)."""
        if self._lmdeploy is not None:
            self._lmdeploy.sleep()
        if self._trainer_step != step:
            paths = self.layout.step(step)
            worker = self.config.train_worker_cfg
            total_updates = self.total_steps * worker.optimizer_steps
            self._trainer = PolicyTrainer(worker, paths.policy, paths.trainer_state, total_updates)
            self._trainer_step = step
        return self._trainer

    def trainer_advanced_to(self, step: int) -> None:
        """Record that the trainer's in-memory policy is now the one saved for ``step``."""
        self._trainer_step = step
        self._policy, self._policy_step = None, None
