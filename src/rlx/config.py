"""The run's configuration: one typed tree, loaded from ``params.yaml``.

Field and section names follow XTuner v1's ``RLTrainerConfig`` (``load_from``, ``dataflow_config``,
``train_worker_cfg``, ...) so a user can carry a config over. Where rlx adds or differs, the field's
description says so. Every model forbids unknown keys: a typo is an error, never a silent default.

``load(path, overrides)`` is the single entry point; it raises :class:`ConfigError` whose message
names the field path, the bad value and what was expected.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rlx.algo import registry
from rlx.errors import UserError


class ConfigError(UserError):
    """The configuration file or an override is invalid."""


UNSUPPORTED = "kept for XTuner compatibility, not supported"


def unsupported(default: Any, reason: str) -> Any:
    """A field XTuner has and rlx cannot act on: its default is accepted (so a carried-over config loads),
    any other value is refused with ``reason`` rather than silently ignored."""
    return Field(
        default,
        description=f"{UNSUPPORTED[0].upper()}{UNSUPPORTED[1:]}: {reason}",
        json_schema_extra={"unsupported": reason},
    )


def _registered(kind: str, name: str) -> str:
    known = registry.names(kind)  # the first call imports the algorithm modules (and torch)
    if name not in known:
        quoted = [repr(option) for option in known]
        listed = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise ValueError(f"Input should be a registered {registry.KINDS[kind]}: {listed}")
    return name


def _list_registered(kind: str, schema: dict[str, Any]) -> None:
    schema["enum"] = registry.names(kind)


def registered(kind: str) -> Any:
    """The type of a field that names an algorithm of ``kind`` in :mod:`rlx.algo.registry`: the names
    are spelled once, where their functions are registered, and the schema lists them."""
    return Annotated[
        str, AfterValidator(partial(_registered, kind)), Field(json_schema_extra=partial(_list_registered, kind))
    ]


AdvantageName = registered("advantage")
PolicyLossName = registered("policy_loss")
KLName = registered("kl")
LossAggName = registered("loss_agg")


def unsupported_reason(field) -> str | None:
    """Why a field is refused unless left at its default (see :func:`unsupported`), or None."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}  # or a schema hook
    return extra.get("unsupported")


class Section(BaseModel):
    """Base of every config section: unknown keys are rejected, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _fits_in_64_bits(cls, value: Any) -> Any:
        """Python ints are unbounded, the tensors, seeds and counters they end up in are not."""
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ValueError("must fit in 64 bits (below 2^63 in size)")
        return value

    @field_validator("*")
    @classmethod
    def _supported(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields[info.field_name]
        reason = unsupported_reason(field)
        if reason and value != field.default:
            raise ValueError(f"{UNSUPPORTED}: {reason}")
        return value


# --------------------------------------------------------------------------------------------
# rlx additions: the synthetic task and the tiny base model (made, not downloaded)
# --------------------------------------------------------------------------------------------


class SyntheticTaskConfig(Section):
    """rlx addition: the arithmetic word-problem task the CPU demo trains on."""

    output_dir: Path = Field(Path("data/arith"), description="Where train/test parquet files are written.")
    train_size: int = Field(20000, gt=0, description="Number of training problems.")
    test_size: int = Field(200, gt=0, description="Number of held-out problems (never seen in training).")
    num_operands: int = Field(2, ge=2, le=4, description="Operands per problem: the main difficulty knob.")
    max_operand: int = Field(10, ge=2, description="Operands are drawn from 1..max_operand.")
    operations: list[Literal["+", "-", "*"]] = Field(["+", "-"], min_length=1, description="Allowed operations.")
    holdout_by: Literal["question", "arithmetic"] = Field(
        "question", description="What no held-out problem shares with training: its question or its arithmetic."
    )
    seed: int = Field(0, description="Generation seed; train and test are disjoint for any seed.")


class TinyModelConfig(Section):
    """rlx addition: architecture and supervised warm start of the tiny Qwen3 base model."""

    output_dir: Path = Field(Path("data/tiny-qwen3"), description="HF model folder written by `rlx init-model`.")
    metrics_path: Path = Field(Path("data/warm_start.json"), description="Warm-start metrics (a DVC metric).")
    vocab_size: int = Field(384, ge=64, description="Target size of the locally trained BPE vocabulary.")
    hidden_size: int = Field(160, gt=0, description="Width of the tiny model.")
    intermediate_size: int = Field(480, gt=0, description="Width of its MLPs.")
    num_hidden_layers: int = Field(4, gt=0, description="Transformer layers.")
    num_attention_heads: int = Field(4, gt=0, description="Query heads; they divide hidden_size.")
    num_key_value_heads: int = Field(2, gt=0, description="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = Field(256, gt=0, description="Longest prompt plus response it can hold.")
    sft_steps: int = Field(200, ge=0, description="Supervised warm-start steps; few on purpose, so RL has room.")
    sft_batch_size: int = Field(64, gt=0, description="Solutions per warm-start step.")
    sft_lr: float = Field(3e-3, gt=0, description="Warm-start learning rate.")
    plain_answer_names: list[str] = Field(
        ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus"],
        description="Problems about these people get warm-start solutions that mostly ignore the '####' format.",
    )
    plain_answer_ratio: float = Field(
        0.8, ge=0, le=1, description="Share of those solutions ending 'The answer is N.' instead of '#### N'."
    )
    eval_max_tokens: int = Field(32, gt=0, description="Response budget when measuring held-out accuracy.")
    seed: int = Field(0, description="Seed of initialisation and warm start; same seed, same weights.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        return self


# --------------------------------------------------------------------------------------------
# XTuner RLTrainerConfig sections
# --------------------------------------------------------------------------------------------


class AcceleratorResourcesConfig(Section):
    """Where training runs (XTuner ``resources``)."""

    accelerator: Literal["CPU", "GPU"] = Field(
        "CPU",
        description="The device the run expects (rlx default CPU; XTuner: GPU). rlx uses a CUDA GPU whenever one "
        "is visible: GPU without one stops the run, CPU with one warns.",
    )
    num_workers: int = Field(1, gt=0, description="Training processes; >1 launches through DeepSpeed's launcher.")
    hostfile: Path | None = Field(
        None,
        description="rlx addition: a DeepSpeed hostfile (`HOST slots=N` per line) for multi-node training; "
        "its slots must add up to num_workers. Without it, num_workers processes run on this host.",
    )
    num_cpus_per_worker: int = unsupported(
        2, "rlx starts one process per worker and leaves CPU placement to the OS (XTuner reserves Ray CPUs)"
    )
    cpu_memory_per_worker: int = unsupported(
        8 * 1024**3, "rlx reserves no host memory per worker (XTuner reserves it in Ray)"
    )


class SampleParams(Section):
    """Sampling parameters of rollout and evaluation (XTuner ``SampleParams``)."""

    n: int = Field(
        1, gt=0, description="Samples per prompt in evaluation (pass@k, maj@n); rollouts use prompt_repeat_k."
    )
    temperature: float = Field(
        1.0,
        ge=0,
        description="0 means greedy. Training rollouts sample at 1.0, as DAPO (arXiv 2503.14476) does, so the "
        "sampled log-probs are the policy's own.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1.0 (off) keeps rollouts on-policy.")
    top_k: int = Field(0, ge=0, description="0 disables top-k.")
    repetition_penalty: float = Field(1.0, gt=0, description="1.0 is off; other values bias rollouts off-policy.")
    max_tokens: int = Field(
        64,
        gt=0,
        description="New tokens per response. DAPO (arXiv 2503.14476) allows 20480, the last 4096 of them its "
        "overlong buffer; DeepSeekMath's GRPO (arXiv 2402.03300) 1024.",
    )
    min_tokens: int = Field(0, ge=0, description="EOS and stop ids are suppressed before this many new tokens.")
    stops: list[str] = Field(default_factory=list, description="Stop strings (not included in the response).")
    stop_token_ids: list[int] = Field(default_factory=list, description="Stop ids besides the tokenizer's EOS.")
    skip_special_tokens: bool = Field(True, description="Leave special tokens out of the decoded response text.")
    do_sample: bool = Field(True, description="False decodes greedily, whatever the temperature.")
    seed: int | None = Field(
        None,
        description="rlx addition: sampling seed; None derives it from the run seed (and, in rollouts, the step).",
    )


class RolloutConfig(Section):
    """The rollout engine (XTuner ``RolloutConfig``). The LMDeploy-only fields are read by that backend
    alone; with ``transformers``, a value other than their default is warned about once."""

    backend: Literal["transformers", "lmdeploy"] = Field(
        "transformers",
        description="rlx addition: the engine as a field (XTuner picks it by environment variable). "
        "`lmdeploy` needs the `gpu` extra.",
    )
    lmdeploy_backend: Literal["pytorch", "turbomind"] = Field(
        "pytorch", description="LMDeploy only: its engine; weight updates need `pytorch`."
    )
    tensor_parallel_size: int = Field(1, gt=0, description="LMDeploy only: GPUs per engine; weight updates need 1.")
    gpu_memory_utilization: float = Field(
        0.7, gt=0, le=1, description="LMDeploy only: the KV cache's share of free GPU memory (below 1)."
    )
    context_length: int = Field(512, gt=0, description="LMDeploy only: prompt plus response tokens a session holds.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="On a GPU, the dtype of the copies only sampled or scored (auto: the checkpoint's own); "
        "on CPU always float32.",
    )
    rollout_max_batch_size: int = Field(1024, gt=0, description="Sequences generated together in one batch.")
    extra_engine_args: dict[str, Any] = Field(
        default_factory=dict, description="LMDeploy only: passed to its engine config as is."
    )


class DataFlowConfig(Section):
    """How many samples a rollout step makes (XTuner ``DataFlowConfig``)."""

    global_batch_size: int = Field(
        16, gt=0, description="Prompt groups per rollout step (DAPO, arXiv 2503.14476: 512; DeepSeekMath: 1024)."
    )
    prompt_repeat_k: int = Field(
        8,
        gt=0,
        description="Responses per prompt, the group of group estimators: DeepSeekMath's GRPO (arXiv 2402.03300) "
        "samples 64, DAPO (arXiv 2503.14476) 16.",
    )
    sample_params: SampleParams = Field(default_factory=SampleParams, description="Sampling of training rollouts.")
    enable_dynamic_sampling: bool = Field(
        False,
        description="rlx addition: DAPO's dynamic sampling (arXiv 2503.14476): drop groups whose rewards are all "
        "equal (no gradient) and refill the batch from reserve prompts. DAPO turns it on.",
    )
    max_retry_times: int = Field(3, ge=0, description="Extra prompt batches dynamic sampling may draw per step.")


class DatasetConfig(Section):
    """One prompt dataset: parquet or jsonl rows with ``data_source``, ``prompt`` and ``reward_model``."""

    name: str = Field(..., min_length=1, description="The set's name in metrics and artifacts.")
    anno_path: Path = Field(..., description="A .parquet or .jsonl file, or a folder of them.")
    sample_ratio: float = Field(1.0, gt=0, description="Fraction of rows used, a seeded subset (above 1 repeats rows).")


class ReplayBufferConfig(Section):
    """Where prompts come from (XTuner ``ReplayBufferConfig``)."""

    dataset_cfg: list[DatasetConfig] = Field(
        default_factory=lambda: [DatasetConfig(name="arith", anno_path=Path("data/arith/train.parquet"))],
        min_length=1,
        description="The training prompt sets, mixed.",
    )
    max_prompt_length: int = Field(128, gt=0, description="Longer prompts are dropped and counted.")
    shuffle: bool = Field(True, description="Seeded reshuffle of the prompts every epoch; false keeps file order.")


class JudgerItemConfig(Section):
    """One reward judger and the rows it scores."""

    judger_name: str = Field(..., min_length=1, description="A registered judger, e.g. `arith` or `gsm8k`.")
    data_source: list[str] = Field(default_factory=list, description="Rows it scores; empty means its own name.")
    weight: float = Field(
        1.0, ge=-1e6, le=1e6, description="Weight in the total reward (within +-1e6, so the total stays finite)."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Judger-specific options.")


class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment (arXiv 2503.14476), added to the reward of responses near max_tokens."""

    enable: bool = Field(False, description="DAPO turns it on.")
    len: int = Field(
        16,
        gt=0,
        description="The last this many tokens before max_tokens ramp the penalty to -factor (DAPO: 4096 of 20480).",
    )
    penalty_factor: float = Field(1.0, ge=0, le=1e6, description="The penalty at max_tokens, negated (DAPO: 1.0).")


class JudgerConfig(Section):
    """Verifiable rewards (XTuner ``JudgerConfig``)."""

    reward_judger_configs: list[JudgerItemConfig] = Field(
        default_factory=lambda: [JudgerItemConfig(judger_name="arith", data_source=["rlx/arith"])],
        min_length=1,
        description="The judgers; each row is scored by those of its data_source, their scores weighted and summed.",
    )
    timeout: float = Field(
        5.0, gt=0, description="Seconds per sample and judger before its score is 0 (counted in judge/errors)."
    )
    max_response_chars: int = Field(
        16000,
        gt=0,
        description="rlx addition: judgers see at most the last this many characters of a response (where the "
        "answer is), so no parser ever gets unbounded text.",
    )
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=lambda: OverlongBufferConfig(), description="DAPO's soft length penalty."
    )


class AdamWConfig(Section):
    """Optimizer (XTuner ``AdamWConfig``)."""

    lr: float = Field(
        1e-4,
        gt=0,
        description="Learning rate. DeepSeekMath's GRPO (arXiv 2402.03300) and DAPO (arXiv 2503.14476) train 7B+ "
        "models at 1e-6; the tiny demo model needs 1e-4.",
    )
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's moment decay rates.")
    eps: float = Field(1e-8, gt=0, description="AdamW's denominator epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (DAPO: 0.1).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm (DAPO: 1.0).")


class LRConfig(Section):
    """Learning-rate schedule (XTuner ``LRConfig``)."""

    lr_type: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Shape after warm-up; RL recipes (DAPO, DeepSeekMath) keep it constant."
    )
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of optimizer steps spent warming up.")
    lr_min: float = Field(0.0, ge=0, description="Where cosine and linear decay end.")


class PolicyLossConfig(Section):
    """The policy-gradient surrogate (XTuner ``policy_loss_cfg``)."""

    loss_type: PolicyLossName = Field(
        "vanilla",
        description="vanilla: PPO clip; gspo: one length-normalised ratio per sequence (GSPO, arXiv 2507.18071); "
        "cispo: clipped, detached IS weight on every token (CISPO, MiniMax-M1, arXiv 2506.13585).",
    )
    cliprange_low: float = Field(
        0.2,
        ge=0,
        description="Lower clip of the ratio, 1 - low. PPO and DAPO (arXiv 2503.14476) use 0.2; GSPO's sequence "
        "ratio (arXiv 2507.18071) 3e-4.",
    )
    cliprange_high: float = Field(
        0.2,
        ge=0,
        description="Upper clip, 1 + high; above cliprange_low it is DAPO's clip-higher (arXiv 2503.14476: 0.28). "
        "GSPO (arXiv 2507.18071) uses 4e-4.",
    )
    clip_ratio_c: float = Field(
        3.0, gt=1, description="Dual-clip bound for negative advantages (Ye et al., arXiv 1912.09729: 3)."
    )


class RolloutCorrectionConfig(Section):
    """rlx addition: importance weights for the rollout/train log-prob mismatch (off by default), after
    Yao et al. (2025), "Your efficient RL framework secretly brings you off-policy RL training"."""

    enabled: bool = Field(False, description="Weight the loss by pi_train / pi_rollout (mismatch/* is logged always).")
    level: Literal["token", "sequence"] = Field("token", description="One weight per token (TIS) or per sequence.")
    mode: Literal["truncate", "mask"] = Field(
        "truncate", description="truncate: cap the weight at threshold_high (truncated IS, TIS); mask: drop."
    )
    threshold_high: float = Field(
        2.0, gt=1, description="The weight's cap (truncate) or upper bound (mask); Yao et al. cap at 2."
    )
    threshold_low: float = Field(0.5, gt=0, lt=1, description="Lower bound of the mask mode.")


class LossConfig(Section):
    """The RL loss (XTuner ``GRPOLossConfig``)."""

    policy_loss_cfg: PolicyLossConfig = Field(default_factory=PolicyLossConfig, description="The surrogate.")
    loss_agg_mode: LossAggName = Field(
        "token-mean",
        description="How token losses become one: token-mean over the mini-batch is DAPO's (arXiv 2503.14476); "
        "seq-mean-token-mean the original GRPO's; seq-mean-token-sum-norm Dr. GRPO's (arXiv 2503.20783), "
        "without length bias.",
    )
    use_kl_loss: bool = Field(
        False,
        description="Add kl_loss_coef x KL(policy || reference) to the loss, as GRPO does (arXiv 2402.03300); "
        "DAPO and Dr. GRPO drop it.",
    )
    kl_loss_coef: float = Field(0.001, ge=0, description="The KL loss weight (DeepSeekMath's GRPO: 0.04).")
    kl_loss_type: KLName = Field(
        "k3", description="KL estimator (Schulman, 2020); GRPO uses k3, unbiased and always positive."
    )
    entropy_coef: float = Field(0.0, ge=0, description="rlx addition: entropy bonus (0 in GRPO and DAPO).")
    mask_truncated: bool = Field(
        False, description="Leave responses cut at max_tokens out of the loss (DAPO's overlong filtering)."
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Importance sampling against rollout mismatch."
    )


class DeepSpeedConfig(Section):
    """rlx addition (XTuner uses FSDP): how DeepSpeed trains the policy."""

    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="ZeRO stage: what is sharded across workers.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 mixed precision needs a GPU.")
    offload_optimizer: bool = Field(False, description="Keep the optimizer state in host memory (ZeRO offload).")
    activation_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")


class WorkerConfig(Section):
    """The training engine (XTuner ``WorkerConfig``)."""

    optim_cfg: AdamWConfig = Field(default_factory=AdamWConfig, description="The optimizer.")
    lr_cfg: LRConfig = Field(default_factory=LRConfig, description="The learning-rate schedule.")
    loss_cfg: LossConfig = Field(default_factory=LossConfig, description="The RL loss.")
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed's settings.")
    optimizer_steps: int = Field(1, gt=0, description="Optimizer steps (mini-batches) per rollout step.")
    pack_max_length: int = Field(4096, gt=0, description="Token budget of one micro-batch.")
    max_consecutive_nonfinite: int = Field(
        3,
        gt=0,
        description="rlx addition: an optimizer step whose loss or gradient norm is NaN/inf is skipped and counted "
        "(train/skipped_updates); this many skipped in a row stop the run, the last good checkpoint kept.",
    )


class EvalDatasetConfig(DatasetConfig):
    """An eval set; it may name its own judger and sampling (e.g. n samples for pass@k)."""

    sample_ratio: float = Field(
        1.0, gt=0, le=1, description="Fraction of the set's rows evaluated, a seeded subset (times eval_sample_ratio)."
    )
    judger_name: str | None = Field(None, description="Judger for this set; default: judger_config by data_source.")
    judger_options: dict[str, Any] = Field(default_factory=dict, description="Options of that judger.")
    sample_params: SampleParams | None = Field(None, description="Sampling for this set; default: the evaluator's.")


class EvaluatorConfig(Section):
    """Held-out evaluation (XTuner ``EvaluatorConfig``)."""

    enable_evaluate: bool = Field(True, description="Evaluate every evaluate_step steps and at the end.")
    enable_initial_evaluate: bool = Field(True, description="Evaluate the base policy as step 0 (rlx default on).")
    evaluate_step: int = Field(10, gt=0, description="Evaluate every this many rollout steps and at the end.")
    dataset_cfg: list[EvalDatasetConfig] = Field(
        default_factory=lambda: [EvalDatasetConfig(name="arith", anno_path=Path("data/arith/test.parquet"))],
        min_length=1,
        description="The held-out sets, each reported on its own.",
    )
    eval_sample_ratio: float = Field(
        1.0, gt=0, le=1, description="Fraction of every set's rows evaluated, the same seeded subset each time."
    )
    sample_params: SampleParams = Field(
        default_factory=lambda: SampleParams(temperature=0.0, do_sample=False),
        description="Sampling of the eval sets that set none (default greedy).",
    )


class KLControlConfig(Section):
    """The KL-in-reward coefficient: fixed, or adaptive towards a target KL (Ziegler et al., 2019)."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="adaptive: Ziegler et al., arXiv 1909.08593.")
    kl_coef: float = Field(0.001, ge=0, le=1e6, description="The coefficient (adaptive: its starting value).")
    target_kl: float = Field(0.1, gt=0, description="The KL per response the adaptive coefficient steers to.")
    horizon: int = Field(10000, gt=0, description="Samples over which the adaptive coefficient may move 20 %.")


class AdvantageEstimatorConfig(Section):
    """How rewards become advantages."""

    type: AdvantageName = Field(
        "grpo",
        description="grpo: group z-score (arXiv 2402.03300); dr_grpo: group mean only (arXiv 2503.20783); rloo: "
        "leave-one-out (arXiv 2402.14740); reinforce_plus_plus(_baseline): batch-whitened (arXiv 2501.03262); "
        "opo: length-weighted baseline; pass_at_k: pass@k training.",
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std before dividing (grpo, reinforce_plus_plus*).")
    k: int = Field(4, ge=1, description="The k of pass_at_k.")
    use_kl_in_reward: bool = Field(False, description="Subtract kl_ctrl.kl_coef x the response's KL from its reward.")
    kl_penalty: KLName = Field("k1", description="KL estimator in the reward.")
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig, description="The KL-in-reward coefficient.")


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

    @model_validator(mode="after")
    def _prev_is_step_minus_one(self) -> RunPointer:
        if self.prev != self.step - 1:
            raise ValueError(f"run.prev must be run.step - 1 = {self.step - 1}, got {self.prev}")
        if self.checkpoint > self.step:
            raise ValueError(f"run.checkpoint must be at most run.step = {self.step}, got {self.checkpoint}")
        return self


class RLTrainerConfig(Section):
    """The whole run. Mirrors XTuner v1's ``RLTrainerConfig``."""

    load_from: Path = Field(Path("data/tiny-qwen3"), description="Base model: a HF folder.")
    tokenizer_path: Path = Field(Path("data/tiny-qwen3"), description="A HF tokenizer folder with a chat template.")
    work_dir: Path = Field(Path("runs/demo"), description="Every artifact of the run lives under it.")
    total_epochs: int = Field(1, gt=0, description="Passes over the prompts (unless rollout_steps is set).")
    rollout_steps: int | None = Field(None, gt=0, description="If set, the run's length in steps (overrides epochs).")
    seed: int = Field(42, description="Seeds every stage (with the step), so a rerun repeats the run exactly.")
    auto_resume: bool = Field(True, description="rlx default on: a rerun continues where it stopped.")
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
    debug_rollout: bool = Field(
        False, description="`rlx fit` prepares, rolls out and judges the next step, prints its metrics and stops."
    )
    resources: AcceleratorResourcesConfig = Field(default_factory=AcceleratorResourcesConfig)
    rollout_config: RolloutConfig = Field(default_factory=RolloutConfig)
    dataflow_config: DataFlowConfig = Field(default_factory=DataFlowConfig)
    judger_config: JudgerConfig = Field(default_factory=JudgerConfig)
    replay_buffer_config: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    train_worker_cfg: WorkerConfig = Field(default_factory=WorkerConfig)
    evaluator_config: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    advantage_estimator_config: AdvantageEstimatorConfig = Field(default_factory=AdvantageEstimatorConfig)
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


# --------------------------------------------------------------------------------------------
# Loading, overrides, errors
# --------------------------------------------------------------------------------------------


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Set ``a.b.c=value`` in a nested dict; the value is parsed as YAML (``32``, ``true``, ``[1, 2]``)."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r}: expected KEY=VALUE, e.g. dataflow_config.global_batch_size=32")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({exc.problem})") from None
    *parents, leaf = key.strip().split(".")
    node: Any = tree
    for depth, part in enumerate(parents):
        path = ".".join(parents[: depth + 1])
        if isinstance(node, list):
            node = node[_list_index(node, part, path)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise ConfigError(f"override {override!r}: {path} is a {type(node).__name__}, not a section")
    if isinstance(node, list):
        node[_list_index(node, leaf, key)] = value
    elif isinstance(node, dict):
        node[leaf] = value
    else:
        raise ConfigError(f"override {override!r}: {'.'.join(parents)} is a {type(node).__name__}, not a section")


def preset_overrides(path: Path) -> list[str]:
    """A preset file (a partial params.yaml) as ``KEY=VALUE`` overrides, one per leaf."""
    overrides: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            overrides.append(
                f"{prefix}={yaml.safe_dump(node, default_flow_style=True).strip().removesuffix('...').strip()}"
            )

    walk("", read_yaml(Path(path)))
    return overrides


def _list_index(items: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"override path {path}: expected a list index below {len(items)}, got {part!r}")
    return int(part)


def format_validation_error(error: ValidationError, source: str) -> str:
    """One readable line per problem: the field path, the bad value and what was expected (a single
    problem is reported on the same line as the file)."""
    count = error.error_count()
    lines = [f"{source}: invalid configuration" + (f" ({count} problems)" if count > 1 else ":")]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        indent = "  " if count > 1 else " "
        prefix = f"{indent}{path}: " if path else indent
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"{prefix}unknown field (check the spelling; `rlx config schema` lists every field)")
        elif item["type"] == "missing":
            lines.append(f"{prefix}required field is missing")
        elif isinstance(item["input"], (dict, list)):  # a cross-field rule: its message names the fields
            lines.append(f"{prefix}{message}")
        else:
            lines.append(f"{prefix}{message}; got {item['input']!r}")
    return "\n".join(lines) if count > 1 else "".join(lines)


def not_utf8(exc: UnicodeDecodeError) -> str:
    """Where a decoding error is, as a person finds it in an editor: the byte, its line and column."""
    before = exc.object[: exc.start]
    line, column = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at line {line}, column {column})"


def duplicate_key(node: yaml.Node, path: str = "") -> str | None:
    """The first key a YAML mapping sets twice, as ``key.path at line N (already set at line M)``.
    PyYAML keeps the last of the two silently, so a params file could mean something it does not say."""
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = f"{path}.{key_node.value}" if path else str(key_node.value)
            if key in first_line:
                return f"{key} at line {key_node.start_mark.line + 1} (already set at line {first_line[key]})"
            first_line[key] = key_node.start_mark.line + 1
            children.append((key, value_node))
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{path}.{index}", item) for index, item in enumerate(node.value)]
    return next((found for key, child in children if (found := duplicate_key(child, key))), None)


MAX_PARAMS_BYTES = 1 << 20  # a params file is kilobytes; past this it is a mistake (or an attack)
MAX_YAML_NODES = 100_000  # values a file may stand for once its aliases are expanded (billion laughs)


def expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` stands for with every alias expanded, counted once per distinct node."""
    if id(node) not in sizes:
        sizes[id(node)] = 0  # a cycle counts as nothing more
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes[id(node)] = min(MAX_YAML_NODES + 1, 1 + sum(expanded_size(child, sizes) for child in children))
    return sizes[id(node)]


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, turning every way it can fail into a ConfigError."""
    try:
        if Path(path).stat().st_size > MAX_PARAMS_BYTES:
            raise ConfigError(f"{path}: {Path(path).stat().st_size:,} bytes, more than a params file can be (1 MiB)")
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {not_utf8(exc)}; save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and expanded_size(node, {}) > MAX_YAML_NODES:
            raise ConfigError(
                f"{path}: its aliases expand to more than {MAX_YAML_NODES:,} values; write the values out"
            )
        duplicate = duplicate_key(node) if node is not None else None
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', exc)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a params file") from None
    if duplicate:
        raise ConfigError(f"{path}: duplicate key {duplicate}; keep one of them")
    if tree is None:
        raise ConfigError(f"{path}: the file is empty; write the fields to set (see `rlx config show`)")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level, got a {type(tree).__name__}")
    return tree


def load(path: str | Path | None = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> RLTrainerConfig:
    """Read ``path`` (None: the defaults alone), apply ``KEY=VALUE`` overrides, and validate."""
    tree = read_yaml(Path(path)) if path is not None else {}
    for override in overrides:
        apply_override(tree, override)
    try:
        return RLTrainerConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "config"))) from None


def to_yaml(config: RLTrainerConfig) -> str:
    """The resolved config as YAML that :func:`load` reads back to an equal tree."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict[str, Any]:
    """JSON schema of params.yaml, for editors and for documentation."""
    return RLTrainerConfig.model_json_schema()
