"""Rollout engines behind one interface. ``transformers`` runs anywhere; ``lmdeploy`` needs the ``gpu`` extra.

A sampler turns prompt token ids into :class:`rlx.samplers.types.Generation` objects (token ids,
text, per-token log-probs, finish reason); the rollout and evaluate stages call ``sampler.generate``,
the agent loop ``sampler.submit`` (rlx.agents.loop), which returns at once. A sampler that batches
continuously (LMDeploy) serves each request as it comes; one that generates in batches (transformers,
a worker group) is best sent many requests together. ``rlx.engines.Engines.sampler(step)`` hands out
the one for a step's policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from rlx.config import RolloutConfig, SampleParams
from rlx.samplers.types import Generation

LMDEPLOY_ONLY = (
    "lmdeploy_backend",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "context_length",
    "extra_engine_args",
)


def ignored_settings(config: RolloutConfig) -> list[str]:
    """The LMDeploy-only fields set away from their defaults while another backend runs: they cannot act."""
    if config.backend == "lmdeploy":
        return []
    fields = type(config).model_fields
    return [
        f"rollout_config.{name}"
        for name in LMDEPLOY_ONLY
        if getattr(config, name) != fields[name].get_default(call_default_factory=True)
    ]


class Sampler(Protocol):
    continuous_batching: bool  # requests sent apart are served together as they come (LMDeploy's engine)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> list[Generation]:
        """One response per prompt (repeat a prompt to sample a group), reproducible from ``seed``: row
        ``i`` samples from ``seed + i``, or from ``seed[i]`` (rlx.samplers.types.row_seeds)."""

    def submit(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> Future[list[Generation]]:
        """:meth:`generate`'s responses, to come: its caller goes on meanwhile where the sampler allows."""


class InBatches:
    """A sampler that generates a batch at a time: :meth:`submit` generates before it returns."""

    continuous_batching = False

    def submit(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> Future[list[Generation]]:
        done: Future[list[Generation]] = Future()
        try:
            done.set_result(self.generate(prompt_ids, params, seed=seed))
        except BaseException as error:  # noqa: BLE001  (the caller's await raises it)
            done.set_exception(error)
        return done


class TransformersSampler(InBatches):
    """Samples with a HF model in this process: the CPU backend, and the warm one (the trainer's
    own module, so a new policy needs no copy)."""

    def __init__(self, model, tokenizer, config: RolloutConfig):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, config.rollout_max_batch_size

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> list[Generation]:
        from rlx.samplers.transformers_backend import generate

        return generate(self.model, self.tokenizer, prompt_ids, params, seed=seed, batch_size=self.batch_size)
