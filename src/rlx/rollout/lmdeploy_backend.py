"""Rollout with LMDeploy (``rollout_config.backend: lmdeploy``, the ``gpu`` extra): one engine for the run.

Token in, token out, like the transformers backend: prompts go in as ids (``do_preprocess`` off),
every response comes back with its ids (stop token included), the log-prob of each sampled token
and why it ended. The engine is started once from the first policy folder and kept: after each
update it sleeps (weights and KV cache released, so DeepSpeed has the GPU to itself), then takes
the new weights through LMDeploy's weight-update API and wakes, with no restart per step.

LMDeploy is imported only here, so a CPU install never loads it. The conversions of its outputs
(``generation_options``, ``to_generation``) are plain functions, tested on CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from rlx.config import RolloutConfig, SampleParams
from rlx.rollout.transformers_backend import stop_ids
from rlx.rollout.types import Generation


def generation_options(tokenizer, params: SampleParams, seed: int) -> dict:
    """``lmdeploy.GenerationConfig`` fields for one request, mirroring the transformers backend:
    the tokenizer's EOS plus configured stop ids end a response and stay in it, and the sampled
    token's log-prob is returned (``logprobs=1``)."""
    greedy = not params.do_sample or params.temperature == 0
    return {
        "n": 1,
        "max_new_tokens": params.max_tokens,
        "min_new_tokens": params.min_tokens,
        "do_sample": not greedy,
        "temperature": 1.0 if greedy else params.temperature,
        "top_p": params.top_p,
        "top_k": 1 if greedy else params.top_k,
        "repetition_penalty": params.repetition_penalty,
        "stop_token_ids": stop_ids(tokenizer, params),
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,  # rlx decodes the ids itself, as for the other backend
        "random_seed": seed,
        "logprobs": 1,
    }


def to_generation(
    prompt_ids: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[Mapping[int, float]],
    finish_reason: str | None,
    tokenizer,
    params: SampleParams,
) -> Generation:
    """A :class:`Generation` from LMDeploy's output: ``logprobs`` holds, per generated token, a
    ``{token_id: logprob}`` map that includes the sampled token."""
    if len(logprobs) != len(token_ids):
        raise RuntimeError(f"LMDeploy returned {len(token_ids)} tokens but {len(logprobs)} log-probs")
    picked = []
    for position, (token, candidates) in enumerate(zip(token_ids, logprobs, strict=True)):
        if token not in candidates:
            raise RuntimeError(f"LMDeploy's log-probs at position {position} lack the sampled token {token}")
        picked.append(float(candidates[token]))
    generation = Generation(
        prompt_ids=list(prompt_ids),
        response_ids=list(token_ids),
        text=tokenizer.decode(list(token_ids), skip_special_tokens=params.skip_special_tokens),
        logprobs=picked,
        finish_reason="length" if finish_reason == "length" else "stop",
    )
    return generation.cut_at_stop_strings(params.stops) if params.stops else generation


def engine_config(config: RolloutConfig):
    """LMDeploy's engine config from rlx's fields; ``extra_engine_args`` pass through unchanged."""
    import lmdeploy

    options = {
        "tp": config.tensor_parallel_size,
        "session_len": config.context_length,
        "cache_max_entry_count": config.gpu_memory_utilization,
        "max_batch_size": config.rollout_max_batch_size,
        **config.extra_engine_args,
    }
    if config.lmdeploy_backend == "turbomind":
        return lmdeploy.TurbomindEngineConfig(**options)
    if config.dtype != "auto":
        options.setdefault("dtype", config.dtype)
    return lmdeploy.PytorchEngineConfig(**options)


class LMDeploySampler:
    """An LMDeploy pipeline kept for the whole run; :meth:`load_weights` moves it to a new policy."""

    def __init__(self, policy_dir: Path, tokenizer, config: RolloutConfig):
        import lmdeploy

        self.tokenizer = tokenizer
        self.pipe = lmdeploy.pipeline(str(policy_dir), backend_config=engine_config(config), log_level="ERROR")
        self.engine = self.pipe.async_engine
        self.asleep = False

    def _run(self, coroutine):
        """Run a coroutine on the pipeline's own event loop (its engine is bound to that loop)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.pipe.internal_thread.loop).result()

    async def _request(self, ids: Sequence[int], options: dict) -> tuple[list[int], list, str | None]:
        import lmdeploy

        session = self.engine.session_mgr.get()
        token_ids, logprobs, finish = [], [], None
        async for out in self.engine.generate(
            None,
            session,
            gen_config=lmdeploy.GenerationConfig(**options),
            input_ids=list(ids),
            stream_response=False,
            do_preprocess=False,
        ):
            token_ids += out.token_ids or []
            logprobs += out.logprobs or []
            finish = out.finish_reason or finish
        return token_ids, logprobs, finish

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int) -> list[Generation]:
        if self.asleep:
            raise RuntimeError("the LMDeploy engine is asleep; give it the policy with load_weights first")

        async def every():
            requests = [
                self._request(ids, generation_options(self.tokenizer, params, seed + index))
                for index, ids in enumerate(prompt_ids)
            ]
            return await asyncio.gather(*requests)

        outputs = self._run(every())
        return [
            to_generation(ids, tokens, logprobs, finish, self.tokenizer, params)
            for ids, (tokens, logprobs, finish) in zip(prompt_ids, outputs, strict=True)
        ]

    def sleep(self) -> None:
        """Release the weights and the KV cache (level 2) while the trainer uses the GPU."""
        if not self.asleep:
            self._run(self.engine.sleep(level=2))
            self.asleep = True

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Put a new policy into the running engine: weights memory back, update, then the KV cache
        (LMDeploy refuses updates while a KV cache built with the old weights exists)."""
        from lmdeploy.serve.openai.protocol import UpdateParamsRequest
        from lmdeploy.utils import serialize_state_dict

        self.sleep()
        self.engine.wakeup(["weights"])
        request = UpdateParamsRequest(serialized_named_tensors=serialize_state_dict(dict(weights)), finished=True)
        self.engine.engine.update_params(request)
        self.engine.wakeup(["kv_cache"])
        self.asleep = False
