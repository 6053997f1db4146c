"""The whole run (XTuner ``RLTrainerConfig``): its top-level fields, the sections it is made of,
and the rules that span sections."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rlx.algo import registry
from rlx.config.data import ReplayBufferConfig
from rlx.config.evaluation import EvaluatorConfig
from rlx.config.fields import Section, unsupported
from rlx.config.judging import JudgerConfig
from rlx.config.project import SyntheticTaskConfig, TinyModelConfig
from rlx.config.rollout import AcceleratorResourcesConfig, CPUResourcesConfig, DataFlowConfig, RolloutConfig
from rlx.config.teacher import TeacherConfig
from rlx.config.training import AdvantageEstimatorConfig, WorkerConfig

LOAD_CHECKPOINT = "rlx resumes a run from its own work_dir (auto_resume) and starts from load_from; to start from "
LOAD_CHECKPOINT += "another run's policy, point load_from at its HF export"


class LoadCheckpointConfig(Section):
    """Resuming from an explicit checkpoint (XTuner ``LoadCheckpointConfig``): not supported, see its fields."""

    checkpoint_path: Path | None = unsupported(None, LOAD_CHECKPOINT)
    load_optimizer_states: bool = unsupported(True, LOAD_CHECKPOINT)
    load_optimizer_args: bool = unsupported(True, LOAD_CHECKPOINT)
    load_dataset: bool = unsupported(True, LOAD_CHECKPOINT)
    load_scheduler: bool = unsupported(True, LOAD_CHECKPOINT)


class WandbConfig(Section):
    """rlx addition: Weights & Biases logging of every step."""

    enabled: bool = Field(True, description="Log to W&B besides the local tracker.")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline by default; `online` needs WANDB_API_KEY or a `wandb login`."
    )
    project: str = Field("rlx", description="The W&B project.")
    entity: str | None = Field(None, description="The W&B team or user; None: the default of the login.")
    name: str | None = Field(None, description="Run name; defaults to the work_dir's name.")


class RunPointer(Section):
    """rlx addition: which iteration `dvc repro` runs. `rlx fit` advances it; DVC paths use it."""

    step: int = Field(1, ge=1, description="The rollout step the pipeline's stages produce.")
    prev: int = Field(0, ge=0, description="step - 1: whose policy the step starts from (DVC cannot subtract).")
    checkpoint: int = Field(0, ge=0, description="The newest checkpoint at or before step: the checkpoint stage's.")
    rollout_policy: int = Field(
        0,
        ge=0,
        description="Whose policy generates the step's rollouts: prev less dataflow_config.max_staleness, at "
        "least 0 (DVC cannot subtract).",
    )

    @model_validator(mode="after")
    def _prev_is_step_minus_one(self) -> RunPointer:
        if self.prev != self.step - 1:
            raise ValueError(f"run.prev must be run.step - 1 = {self.step - 1}, got {self.prev}")
        if self.checkpoint > self.step:
            raise ValueError(f"run.checkpoint must be at most run.step = {self.step}, got {self.checkpoint}")
        return self


def rollout_policy_step(step: int, max_staleness: int) -> int:
    """The step whose policy generates step ``step``'s rollouts: ``max_staleness`` updates behind the one the
    step trains (the policy of step ``step - 1``), never before the base model."""
    return max(0, step - 1 - max_staleness)


def staleness(row: dict) -> int:
    """How many updates a rollout row's policy lags the one its step trains: the inverse of
    :func:`rollout_policy_step` (a row written before the ``policy_step`` column: 0, on-policy)."""
    return row["step"] - 1 - row.get("policy_step", row["step"] - 1)


class RLTrainerConfig(Section):
    """The whole run. Mirrors XTuner v1's ``RLTrainerConfig``."""

    load_from: Path = Field(Path("data/tiny-qwen3"), description="Base model: a HF folder.")
    tokenizer_path: Path = Field(Path("data/tiny-qwen3"), description="A HF tokenizer folder with a chat template.")
    work_dir: Path = Field(Path("runs/demo"), description="Every artifact of the run lives under it.")
    log_dir: Path | None = Field(
        None,
        description="Where the tracker (tracker.jsonl or tensorboard/), W&B's files and, with Ray workers, the "
        "log files of the workers not shown in the console (workers/) go (XTuner's field); null: work_dir.",
    )
    total_epochs: int = Field(1, gt=0, description="Passes over the prompts (unless rollout_steps is set).")
    rollout_steps: int | None = Field(None, gt=0, description="If set, the run's length in steps (overrides epochs).")
    seed: int = Field(42, description="Seeds every stage (with the step), so a rerun repeats the run exactly.")
    auto_resume: bool = Field(True, description="rlx default on: a rerun continues where it stopped.")
    strict_load: bool = Field(
        True,
        description="Refuse a model folder (load_from, a checkpoint's policy) whose weights miss a layer of the "
        "model or hold one it lacks, naming them (XTuner's field). false: load it anyway, with a warning naming "
        "them; a missing weight then keeps a seeded random initialization, the same at every load.",
    )
    skip_checkpoint_validation: bool = Field(
        False,
        description="Load a checkpoint without hashing its files against the list its writer recorded (only their "
        "sizes are checked), with a warning: for checkpoints too large to read twice (XTuner's field). The "
        "weights are still checked against the step's fingerprint.",
    )
    checkpoint_interval: int = Field(
        10,
        description="Steps between checkpoints (full policy and optimizer state, written in the background); the "
        "last step is always one and -1 leaves only that. Other steps record a weights fingerprint, and their "
        "policy is re-created by replaying the updates after the newest checkpoint before them.",
    )
    checkpoint_maxkeep: int = Field(
        2, description="Checkpoints kept besides checkpoint 0 (the base model, the root of any replay); -1 keeps all."
    )
    checkpoint_no_save_optimizer: bool = Field(
        False,
        description="Drop the optimizer state of every checkpoint but the newest (resume needs that one): older "
        "ones keep their policy, and a step before the newest checkpoint is then replayed from step 0.",
    )
    hf_interval: int = Field(-1, description="Steps between HF exports (hf/step-N); -1 exports only the last step.")
    hf_max_keep: int = Field(1, description="HF exports kept, the newest; -1 keeps all.")
    exp_tracker: Literal["jsonl", "tensorboard"] = Field(
        "jsonl", description="Local tracker (XTuner default tensorboard)."
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    debug: bool = Field(
        False,
        description="rlx's info and debug log lines (with their time and module), and finer timings in each "
        "step's metrics: time/<stage>/cpu (the process's CPU seconds in each stage), time/train/forward and "
        "time/train/backward (on a GPU after waiting for its queued work) (XTuner's field).",
    )
    debug_rollout: bool = Field(
        False, description="`rlx fit` prepares, rolls out and judges the next step, prints its metrics and stops."
    )
    display_all_workers_log: bool = Field(
        False,
        description="With Ray actors (resources.num_workers > 1, num_rollout_workers, cpu_resources): every "
        "actor's log lines in the console, each prefixed by its name (worker 1, judge 0, ...). false: only train "
        "worker 0's; the others' go to log_dir/workers/NAME.log (XTuner's field).",
    )
    resources: AcceleratorResourcesConfig = Field(default_factory=AcceleratorResourcesConfig)
    cpu_resources: CPUResourcesConfig | None = Field(
        None, description="Judge the rollouts in Ray CPU actors (XTuner's field); null: in the `rlx fit` process."
    )
    rollout_config: RolloutConfig = Field(default_factory=RolloutConfig)
    dataflow_config: DataFlowConfig = Field(default_factory=DataFlowConfig)
    judger_config: JudgerConfig = Field(default_factory=JudgerConfig)
    replay_buffer_config: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    train_worker_cfg: WorkerConfig = Field(default_factory=WorkerConfig)
    evaluator_config: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    advantage_estimator_config: AdvantageEstimatorConfig = Field(default_factory=AdvantageEstimatorConfig)
    teacher_config: TeacherConfig | None = Field(
        None, description="rlx addition: on-policy distillation from teachers (null: learn from the reward only)."
    )
    load_checkpoint_cfg: LoadCheckpointConfig = Field(default_factory=LoadCheckpointConfig)
    synthetic_task: SyntheticTaskConfig = Field(default_factory=SyntheticTaskConfig)
    tiny_model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    run: RunPointer = Field(default_factory=RunPointer)

    @model_validator(mode="after")
    def _consistent(self) -> RLTrainerConfig:
        for name in ("checkpoint_interval", "checkpoint_maxkeep", "hf_interval", "hf_max_keep"):
            value = getattr(self, name)
            if value == 0 or value < -1:
                raise ValueError(f"{name} must be a positive number or -1, got {value}")
        if self.rollout_config.backend == "lmdeploy" and importlib.util.find_spec("lmdeploy") is None:
            raise ValueError(
                "rollout_config.backend 'lmdeploy' needs LMDeploy and a GPU: pip install 'rlx[gpu]' "
                "(or use backend 'transformers')"
            )
        sampling = self.dataflow_config.sample_params
        if sampling.n != 1:
            raise ValueError(
                f"dataflow_config.sample_params.n {sampling.n}: rollouts sample dataflow_config.prompt_repeat_k "
                "responses per prompt (n is read in evaluation only); set prompt_repeat_k instead"
            )
        if self.rollout_config.backend == "lmdeploy" and sampling.do_sample and sampling.temperature not in (0, 1):
            raise ValueError(
                f"dataflow_config.sample_params.temperature {sampling.temperature}: LMDeploy returns the log-probs "
                "of its untempered distribution, which the trainer's would not match; sample training rollouts "
                "at temperature 1.0 with backend 'lmdeploy' (or use backend 'transformers')"
            )
        estimator, group_size = self.advantage_estimator_config.type, self.dataflow_config.prompt_repeat_k
        if estimator in registry.names("advantage", groups=True) and group_size < 2:
            raise ValueError(
                f"advantage_estimator_config.type {estimator!r} compares responses within a group: "
                f"dataflow_config.prompt_repeat_k must be at least 2, got {group_size}"
            )
        if estimator == "pass_at_k" and self.advantage_estimator_config.k > group_size:
            raise ValueError(
                f"advantage_estimator_config.k ({self.advantage_estimator_config.k}) cannot exceed "
                f"dataflow_config.prompt_repeat_k ({group_size})"
            )
        return self

    @model_validator(mode="after")
    def _samples_what_the_trainer_scores(self) -> RLTrainerConfig:
        """Training rollouts sampled from a distribution the trainer scores too, or a leave to be off-policy
        (rlx.algo.support; TRL #6789: a top-p rollout scored over the whole vocabulary is biased by log S)."""
        flow = self.dataflow_config
        sampling, lmdeploy = flow.sample_params, self.rollout_config.backend == "lmdeploy"
        cut = [f for f, on in (("top_k", sampling.top_k), ("top_p", sampling.top_p < 1.0)) if on]
        biased = [f for f, on in (("repetition_penalty", sampling.repetition_penalty != 1.0),
                                  ("min_tokens", sampling.min_tokens > 0)) if on]  # fmt: skip
        named = ", ".join(f"dataflow_config.sample_params.{f} {getattr(sampling, f)}" for f in [*cut, *biased])
        if lmdeploy and (cut or biased):
            raise ValueError(
                f"{named}: LMDeploy returns each token's log-prob before these act, so neither the update nor "
                "mismatch/* could account for them; sample training rollouts without them with backend 'lmdeploy' "
                "(or use backend 'transformers')"
            )
        if biased and not flow.allow_off_policy_sampling:
            raise ValueError(
                f"{named}: training rollouts would sample from another distribution than the policy the trainer "
                "scores, so every update is off-policy; set dataflow_config.allow_off_policy_sampling: true to accept "
                "it (mismatch/k3_kl then says by how much, each step)"
            )
        if flow.allow_off_policy_sampling and not biased:
            raise ValueError(
                "dataflow_config.allow_off_policy_sampling true: no setting of dataflow_config.sample_params samples "
                "off the policy (repetition_penalty 1, min_tokens 0), so it cannot act; remove it"
            )
        return self

    @model_validator(mode="after")
    def _fits_a_step(self) -> RLTrainerConfig:
        """Settings that ask for more than a step holds: a response per mini-batch at least (fewer rows
        would give fewer optimizer steps than the schedule counts), and with LMDeploy a session long
        enough for the longest prompt and its response."""
        flow, steps = self.dataflow_config, self.train_worker_cfg.optimizer_steps
        responses = flow.global_batch_size * flow.prompt_repeat_k
        if steps > responses:
            raise ValueError(
                f"train_worker_cfg.optimizer_steps {steps}: a step holds {responses} responses "
                "(dataflow_config.global_batch_size x prompt_repeat_k), fewer than one per mini-batch"
            )
        needed = self.replay_buffer_config.max_prompt_length + flow.sample_params.max_tokens
        if self.rollout_config.backend == "lmdeploy" and self.rollout_config.context_length < needed:
            raise ValueError(
                f"rollout_config.context_length {self.rollout_config.context_length}: LMDeploy's sessions must hold "
                f"replay_buffer_config.max_prompt_length plus dataflow_config.sample_params.max_tokens ({needed})"
            )
        return self

    @property
    def log_folder(self) -> Path:
        """Where the run's logs go: ``log_dir``, or the work_dir."""
        return Path(self.log_dir if self.log_dir is not None else self.work_dir)

    @property
    def has_actors(self) -> bool:
        """Whether the run starts Ray actors: train workers, rollout workers or judge actors (rlx.workers)."""
        resources = self.resources
        return resources.on_ray or resources.num_rollout_workers > 0 or self.cpu_resources is not None

    @model_validator(mode="after")
    def _workers_to_show(self) -> RLTrainerConfig:
        if self.display_all_workers_log and not self.has_actors:
            raise ValueError(
                "display_all_workers_log true: the run has no Ray actors whose log lines it could show "
                "(resources.num_workers 1, no num_rollout_workers, no cpu_resources); every line is the `rlx fit` "
                "process's own"
            )
        return self

    @model_validator(mode="after")
    def _rollout_policy_follows_staleness(self) -> RLTrainerConfig:
        expected = rollout_policy_step(self.run.step, self.dataflow_config.max_staleness)
        if self.run.rollout_policy != expected:
            raise ValueError(
                f"run.rollout_policy must be run.prev less dataflow_config.max_staleness, at least 0: {expected}, "
                f"got {self.run.rollout_policy}"
            )
        return self
