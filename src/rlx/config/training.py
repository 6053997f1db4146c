"""The policy update: optimizer, schedule, loss, DeepSpeed, advantages and the KL in the reward
(XTuner ``train_worker_cfg`` and ``advantage_estimator_config``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from rlx.algo import registry
from rlx.config.fields import AdvantageName, CorrectionName, KLName, LossAggName, PolicyLossName, Section


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
    """rlx addition: importance weights for off-policy rollouts (off by default): the rollout engine's
    log-probs differ from the trainer's (Yao et al. (2025), "Your efficient RL framework secretly brings
    you off-policy RL training"), and asynchronous rollouts come from an older policy (AReaL, arXiv
    2505.24298)."""

    enabled: bool = Field(
        False,
        description="Weight the loss by pi_train / pi_rollout (mismatch/* is logged always, correction/* when on).",
    )
    level: Literal["token", "sequence"] = Field("token", description="One weight per token (TIS) or per sequence.")
    mode: CorrectionName = Field(
        "truncate",
        description="truncate: cap the weight at threshold_high (truncated IS, TIS); mask: drop tokens whose "
        "weight leaves [threshold_low, threshold_high]; decoupled: decoupled PPO (Hilton et al., arXiv 2110.00641), "
        "AReaL's objective (arXiv 2505.24298) for rollouts of a stale policy (dataflow_config.max_staleness >= 1): "
        "the clip acts on pi_theta / pi_train and each token's loss is weighted by pi_train / pi_rollout, dropped "
        "above threshold_high.",
    )
    threshold_high: float = Field(
        2.0,
        gt=1,
        description="The weight's cap (truncate), upper bound (mask) or the weight above which a token is dropped "
        "(decoupled: AReaL's behav_imp_weight_cap); Yao et al. cap at 2.",
    )
    threshold_low: float = Field(
        0.5, gt=0, lt=1, description="Lower bound of the mask mode; the other modes have none and refuse it."
    )

    @field_validator("threshold_low")
    @classmethod
    def _read_by_the_mode(cls, value: float, info: ValidationInfo) -> float:
        """A lower bound that the mode has no use for would be silently ignored: refused unless default."""
        mode, default = info.data.get("mode"), cls.model_fields["threshold_low"].default
        if value == default or mode is None:  # no mode: its own check already failed
            return value
        bounded = registry.names("correction", lower_bound=True)
        if mode not in bounded:
            raise ValueError(
                f"mode {mode!r} has no lower bound, so threshold_low would change nothing; leave it at "
                f"{default} or use mode {' or '.join(map(repr, bounded))}"
            )
        return value


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


class LoraConfig(Section):
    """rlx addition (XTuner trains full weights): train a low-rank adapter on a frozen base with peft's
    LoRA (Hu et al., arXiv 2106.09685). "LoRA Without Regret" (Thinking Machines, 2025) finds it matches
    full fine-tuning in RL even at small ranks, applied to every linear layer, at about 10x the full LR."""

    rank: int = Field(
        8, gt=0, description="The adapter's rank r (Hu et al., arXiv 2106.09685: 1-8 already work; RL needs little)."
    )
    alpha: float = Field(
        16.0,
        gt=0,
        description="Scaling: the update is alpha / r x B A (alpha / sqrt(r) with use_rslora); Hu et al. keep "
        "alpha fixed as r changes, commonly 2 r.",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input (Hu et al.: 0-0.1; RL: 0).")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        min_length=1,
        description="The linear modules that get an adapter, by name (q_proj, v_proj, ...; Hu et al. adapt the "
        "attention's q and v), or all-linear: every linear layer but the output head, which LoRA Without Regret "
        "recommends (the MLP matters most).",
    )
    init: Literal["kaiming", "gaussian"] = Field(
        "kaiming",
        description="How A starts (B starts at zero, so step 0's policy is the base exactly): kaiming-uniform as in "
        "Hu et al.'s reference code, or gaussian with std 1/r.",
    )
    use_rslora: bool = Field(
        False,
        description="Scale by alpha / sqrt(r) instead of alpha / r (rsLoRA, Kalajdzievski, arXiv 2312.03732): "
        "higher ranks then learn as fast as low ones.",
    )
    export_adapter: bool = Field(
        False,
        description="The HF export (hf/step-N) and a materialized step, each a merged full model, also hold the "
        "adapter alone in adapter/.",
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value):
        """``target_modules: q_proj`` means the one module (peft would read a lone string as a regex)."""
        return [value] if isinstance(value, str) and value != "all-linear" else value


class WorkerConfig(Section):
    """The training engine (XTuner ``WorkerConfig``)."""

    optim_cfg: AdamWConfig = Field(default_factory=AdamWConfig, description="The optimizer.")
    lr_cfg: LRConfig = Field(default_factory=LRConfig, description="The learning-rate schedule.")
    loss_cfg: LossConfig = Field(default_factory=LossConfig, description="The RL loss.")
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig, description="DeepSpeed's settings.")
    lora: LoraConfig | None = Field(
        None, description="rlx addition: train a LoRA adapter on the frozen base instead of every weight; None: off."
    )
    optimizer_steps: int = Field(1, gt=0, description="Optimizer steps (mini-batches) per rollout step.")
    pack_max_length: int = Field(4096, gt=0, description="Token budget of one micro-batch.")
    max_consecutive_nonfinite: int = Field(
        3,
        gt=0,
        description="rlx addition: an optimizer step whose loss or gradient norm is NaN/inf is skipped and counted "
        "(train/skipped_updates); this many skipped in a row stop the run, the last good checkpoint kept.",
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
