"""Where the run executes and how rollouts are generated (XTuner ``resources``,
``rollout_config``, ``dataflow_config``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlx.config.agent import AgentLoopConfig
from rlx.config.fields import Section


class AcceleratorResourcesConfig(Section):
    """Where the run's workers run (XTuner ``AcceleratorResourcesConfig``): with ``num_workers`` above 1,
    one Ray placement group of ``num_workers`` bundles, one worker actor in each, kept for the whole run
    (rlx.workers)."""

    accelerator: Literal["CPU", "GPU"] = Field(
        "CPU",
        description="The device the run expects (rlx default CPU; XTuner: GPU). rlx uses a CUDA GPU whenever one "
        "is visible: GPU without one stops the run, CPU with one warns. With num_workers > 1, GPU reserves "
        "num_accelerators_per_worker GPUs for each worker.",
    )
    num_workers: int = Field(
        1,
        gt=0,
        description="Workers, each a DeepSpeed rank with its own rollout engine. 1: everything in the `rlx fit` "
        "process (no Ray); >1: Ray actors started once for the run.",
    )
    num_accelerators_per_worker: float = Field(
        1, gt=0, description="GPUs reserved per worker under accelerator GPU (XTuner's field); unused on CPU."
    )
    num_cpus_per_worker: float = Field(
        1, gt=0, description="CPUs reserved per worker in its Ray bundle (XTuner: 12); fractions share a core."
    )
    cpu_memory_per_worker: int = Field(
        2 * 1024**3,
        ge=0,
        description="Host memory in bytes reserved per worker in its Ray bundle (XTuner: 16 GiB); 0 reserves none.",
    )
    pg_pack_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK",
        description="How Ray places the workers' bundles on nodes (XTuner's field): PACK fills a node first, "
        "SPREAD spreads them, STRICT_* refuses to place otherwise.",
    )
    num_rollout_workers: int = Field(
        0,
        ge=0,
        description="rlx addition: rollout workers placed apart from the train workers (the disaggregated mode of "
        "verl, AReaL and XTuner), each a Ray actor with its own rollout engine (num_cpus_per_worker, "
        "num_accelerators_per_worker and cpu_memory_per_worker each), given the policy from the trainer every "
        "step. With dataflow_config.max_staleness >= 1 they generate while the policy trains. 0: each train "
        "worker generates (colocated).",
    )
    ray_address: str | None = Field(
        None,
        description="rlx addition: the Ray cluster the workers join ('auto': the one `ray start` made on this "
        "node, or HOST:PORT), also for one worker. null: with num_workers > 1 rlx starts a Ray instance on this "
        "machine for the run and stops it after; with 1, everything runs in the `rlx fit` process.",
    )

    @property
    def on_ray(self) -> bool:
        """Whether the run's workers are Ray actors (rlx.workers) rather than the `rlx fit` process itself."""
        return self.num_workers > 1 or self.ray_address is not None


class CPUResourcesConfig(Section):
    """CPU actors that judge the rollouts (XTuner ``CPUResourcesConfig``): the judge stage deals a step's
    responses out to ``num_workers`` Ray actors, for judgers too slow for one process (math-verify's
    symbolic checks, a code sandbox)."""

    num_workers: int = Field(1, gt=0, description="Judge actors, kept for the run.")
    num_cpus_per_worker: float = Field(1, gt=0, description="CPUs reserved per judge actor.")
    cpu_memory_per_worker: int = Field(0, ge=0, description="Host memory in bytes reserved per judge actor; 0: none.")
    pg_pack_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "SPREAD", description="How Ray places the judge actors' bundles on nodes."
    )


MAX_GROUP = 1024  # responses to one prompt: 16x the largest group in use (GRPO's 64)


class SampleParams(Section):
    """Sampling parameters of rollout and evaluation (XTuner ``SampleParams``)."""

    n: int = Field(
        1,
        gt=0,
        le=MAX_GROUP,
        description=f"Samples per prompt in evaluation (pass@k, maj@n; at most {MAX_GROUP}); rollouts use "
        "prompt_repeat_k.",
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

    @model_validator(mode="after")
    def _min_within_max(self) -> SampleParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens {self.min_tokens} is more than max_tokens {self.max_tokens}: no response could end "
                "before its budget"
            )
        return self


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
    weight_sync_timeout: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="rlx addition: seconds a rollout engine (LMDeploy, a bucket at a time; rollout workers) may take "
        "to take a new policy's weights; past it the run stops, naming the engine, instead of hanging.",
    )
    max_mismatch_kl: float | None = Field(
        0.1,
        gt=0,
        description="rlx addition: the most mismatch/k3_kl (the rollout engine's log-probs against the trainer's for "
        "the same tokens) a step may show; past it, or non-finite, the run stops before the step is recorded: the "
        "engine did not sample from the policy the step records (a weight sync that failed). Measured at 25 M and "
        "200 M (tests/benchmarks/test_mismatch_calibration.py): float32 0, a bf16 engine 1e-5 to 7e-5 (about 1e-3 "
        "at 7 B, Yao et al., 2025), a missed output head 0.2 to 0.5; with max_staleness the policy's lag adds to "
        "it (2e-3 a step in the demo). null: never stop.",
    )
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
        le=MAX_GROUP,
        description="Responses per prompt, the group of group estimators: DeepSeekMath's GRPO (arXiv 2402.03300) "
        f"samples 64, DAPO (arXiv 2503.14476) 16. At most {MAX_GROUP}: 16 times the largest group in use, past which "
        "a step's generation grows and its advantages do not improve.",
    )
    sample_params: SampleParams = Field(default_factory=SampleParams, description="Sampling of training rollouts.")
    enable_dynamic_sampling: bool = Field(
        False,
        description="rlx addition: DAPO's dynamic sampling (arXiv 2503.14476): drop groups whose rewards are all "
        "equal (no gradient) and refill the batch from reserve prompts. DAPO turns it on.",
    )
    max_retry_times: int = Field(3, ge=0, description="Extra prompt batches dynamic sampling may draw per step.")
    max_staleness: int = Field(
        0,
        ge=0,
        description="How many updates the policy that generates a step's rollouts may lag (XTuner's field): step "
        "N's rollouts come from the policy of step N-1-max_staleness, so with resources.num_rollout_workers the "
        "generation of step N+max_staleness overlaps the update of step N (AReaL's max_head_offpolicyness, "
        "arXiv 2505.24298; verl's staleness_threshold). 0: on-policy, generation then update. The schedule is "
        "fixed, so the run stays exact and resumable; train_worker_cfg.loss_cfg.rollout_correction corrects "
        "for the lag.",
    )
    allow_off_policy_sampling: bool = Field(
        False,
        description="rlx addition: accept training-rollout sampling the trainer cannot score, sample_params."
        "repetition_penalty other than 1 or min_tokens above 0 (transformers backend): rollouts are then off-policy "
        "by as much as mismatch/k3_kl says each step. top_k and top_p need no leave: rollouts and trainer score over "
        "the same support (rlx.algo.support).",
    )
    agent_loop_config: AgentLoopConfig | None = Field(
        None,
        description="Multi-turn, tool-using rollouts (XTuner's agent_loop_config): tools or an environment, "
        "max_turns, max_tool_response_tokens, tool_timeout. Evaluation runs the same loop. null: one reply per "
        "prompt.",
    )
