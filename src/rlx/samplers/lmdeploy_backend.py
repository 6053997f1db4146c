"""Rollout with LMDeploy 0.18 (``rollout_config.backend: lmdeploy``, the ``gpu`` extra): one engine for the run.

Token in, token out, like the transformers backend: prompt ids go in through
``AsyncEngine.preprocess(input_ids=..., do_preprocess=False)``; ``generate`` then yields the
response in pieces (its stop token last, alone), each with the log-prob of every sampled token.
The engine is started once and kept: before the trainer uses the GPU it sleeps (level 2: weights
and KV cache freed); a new policy goes in by LMDeploy's own protocol, read from 0.18.0's source:
wake the weights, ``update_params`` (the last bucket ``finished``), ``complete_weights_update``,
wake the KV cache. No restart per step. The sleep also empties the prefix cache (:func:`drop_prefix_cache`),
which 0.18.0 keeps across it over a KV cache woken as zeros.

Two facts of 0.18.0 shape the update. The single-GPU executor (``UniExecutor``) has no
``update_params`` (only the Ray one does), so requests go to its model agent, which runs in this
process. And ``lmdeploy.utils.serialize_state_dict`` sends tensors as CUDA IPC handles, which the
process that made them cannot open; so each tensor travels as a key into a table in this process,
rebuilt by a function called the way the agent calls torch's ``rebuild_cuda_tensor``.

Log-probs come back only with ``logprobs_mode='raw_logprobs'``, taken before temperature: the
config refuses LMDeploy training rollouts at a temperature other than 1. ``make lmdeploy-contract``
checks every LMDeploy name, signature and field used here against the release.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch

from rlx.config import RolloutConfig, SampleParams
from rlx.errors import UserError
from rlx.samplers.transformers_backend import is_greedy, stop_ids
from rlx.samplers.types import Generation, row_seeds
from rlx.tokens import decode
from rlx.training.distributed import buckets

BUCKET_BYTES = 1 << 30  # weights per update request: bounds the engine's transient copy
LMDEPLOY_DTYPES = ("auto", "bfloat16", "float16")


def generation_options(tokenizer, params: SampleParams, seed: int) -> dict:
    """``lmdeploy.GenerationConfig`` fields for one request, mirroring the transformers backend:
    the tokenizer's EOS plus configured stop ids end a response and stay in it, and the sampled
    token's log-prob is returned (``logprobs=1``)."""
    greedy = is_greedy(params)
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
    if finish_reason not in ("stop", "length"):
        raise RuntimeError(f"LMDeploy ended a request with finish reason {finish_reason!r}")
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
        text=decode(tokenizer, list(token_ids), params.skip_special_tokens),
        logprobs=picked,
        finish_reason=finish_reason,
    )
    return generation.cut_at_stop_strings(params.stops) if params.stops else generation


def unsupported(config: RolloutConfig) -> str | None:
    """Why LMDeploy 0.18 cannot run these settings in rlx, if it cannot."""
    if config.dtype not in LMDEPLOY_DTYPES:
        return f"rollout_config.dtype {config.dtype!r}: LMDeploy runs 'auto', 'bfloat16' or 'float16'"
    if config.tensor_parallel_size != 1:
        return (
            f"rollout_config.tensor_parallel_size {config.tensor_parallel_size}: rlx updates LMDeploy's weights "
            "in its single-GPU engine only (use 1)"
        )
    if config.gpu_memory_utilization >= 1:
        return "rollout_config.gpu_memory_utilization must be below 1 for LMDeploy (its KV cache's share)"
    return None


def engine_config(config: RolloutConfig, agent: bool = False):
    """LMDeploy's engine config from rlx's fields; ``extra_engine_args`` pass through unchanged,
    except that the PyTorch engine always returns raw log-probs (without them, it returns none). For an
    agent loop, prefix caching is on unless ``extra_engine_args`` says otherwise: each turn's request
    repeats the conversation so far, whose KV blocks the cache then keeps."""
    import lmdeploy

    problem = unsupported(config)
    if problem:
        raise UserError(problem)
    options = {
        "tp": config.tensor_parallel_size,
        "session_len": config.context_length,
        "cache_max_entry_count": config.gpu_memory_utilization,
        "max_batch_size": config.rollout_max_batch_size,
        **({"enable_prefix_caching": True} if agent else {}),
        **config.extra_engine_args,
    }
    if config.dtype != "auto":
        options.setdefault("dtype", config.dtype)
    if config.lmdeploy_backend == "turbomind":
        return lmdeploy.TurbomindEngineConfig(**options)
    return lmdeploy.PytorchEngineConfig(**{**options, "logprobs_mode": "raw_logprobs"})


_IN_PROCESS: dict[int, torch.Tensor] = {}  # tensors on their way to the engine, by key
_KEYS = itertools.count()


def _from_table(key: int, *_unused) -> torch.Tensor:
    """Called as ``func(*args)`` with ``args[6]`` set to the device, where torch's
    ``rebuild_cuda_tensor`` would be: the tensor, taken from this process's table."""
    return _IN_PROCESS.pop(key)


def in_process_payload(bucket: Mapping[str, torch.Tensor]) -> str:
    """``serialized_named_tensors`` for a model agent in this process: LMDeploy's format (base64 of
    a ``ForkingPickler`` list of ``(name, (func, args))``), each tensor left where it is."""
    items = []
    for name, tensor in bucket.items():
        key = next(_KEYS)
        _IN_PROCESS[key] = tensor.detach()
        items.append((name, (_from_table, (key, None, None, None, None, None, None))))
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(items)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def drop_prefix_cache(scheduler) -> int:
    """Free every block of a sleeping engine's prefix cache; how many. 0.18.0's sleep frees the KV cache and
    wakes it as zeros, but its scheduler's trie of cached prefixes stays: after a weight update, a prompt whose
    first full block matches one cached before would reuse that block, now zeros, and generate wrongly without
    an error (LMDeploy #4917; its fix, #4918, was closed unmerged). Its own eviction, asked for every block,
    frees them all: the sleep has ended every session, so the trie is their only holder."""
    return scheduler.block_trie.evict(scheduler.block_manager.num_gpu_blocks)


class LMDeploySampler:
    """An LMDeploy pipeline kept for the whole run; :meth:`load_weights` moves it to a new policy."""

    continuous_batching = True

    def __init__(self, policy_dir: Path, tokenizer, config: RolloutConfig, agent: bool = False):
        if not torch.cuda.is_available():
            raise UserError(
                "rollout_config.backend 'lmdeploy' needs a CUDA GPU; this machine has none "
                "(use backend 'transformers' here)"
            )
        import lmdeploy

        self.tokenizer = tokenizer
        self.backend, self.sync_timeout = config.lmdeploy_backend, config.weight_sync_timeout
        self.pipe = lmdeploy.pipeline(str(policy_dir), backend_config=engine_config(config, agent), log_level="ERROR")
        self.engine = self.pipe.async_engine

    def _run(self, coroutine, timeout: float | None = None):
        """Run a coroutine on the pipeline's own event loop (its engine is bound to that loop)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.pipe.internal_thread.loop).result(timeout)

    def _call(self, function, *args, timeout: float | None = None):
        """Call one of the engine's plain methods on that loop too, between its own steps."""

        async def call():
            return function(*args)

        return self._run(call(), timeout)

    async def _request(self, ids: Sequence[int], options: dict) -> tuple[list[int], list, str | None]:
        import lmdeploy

        request = await self.engine.preprocess(
            None,
            self.engine.session_mgr.get(),
            gen_config=lmdeploy.GenerationConfig(**options),
            do_preprocess=False,
            input_ids=list(ids),
        )
        token_ids, logprobs, finish = [], [], None
        async for piece in self.engine.generate(request, stream_response=False):
            token_ids += piece.token_ids or []
            logprobs += piece.logprobs or []
            finish = piece.finish_reason or finish
        return token_ids, logprobs, finish

    def awake(self) -> None:
        if self.engine.is_sleeping:
            raise RuntimeError("the LMDeploy engine is asleep; give it the policy with load_weights first")

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> list[Generation]:
        return self.submit(prompt_ids, params, seed=seed).result()

    def submit(
        self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]
    ) -> Future[list[Generation]]:
        """The requests sent to the engine's event loop at once, each with its row's seed; their responses
        to come, so an agent's rollout waiting for its tools holds up no other's generation."""
        self.awake()

        async def every():
            requests = [
                self._request(ids, generation_options(self.tokenizer, params, row_seed))
                for ids, row_seed in zip(prompt_ids, row_seeds(seed, len(prompt_ids)), strict=True)
            ]
            outputs = await asyncio.gather(*requests)
            return [
                to_generation(ids, tokens, logprobs, finish, self.tokenizer, params)
                for ids, (tokens, logprobs, finish) in zip(prompt_ids, outputs, strict=True)
            ]

        return asyncio.run_coroutine_threadsafe(every(), self.pipe.internal_thread.loop)

    def sleep(self) -> None:
        """Free the weights and the KV cache (level 2) while the trainer uses the GPU, and every prefix the
        cache held: they belong to the policy before the update."""
        if not self.engine.is_sleeping:
            self._run(self.engine.sleep(level=2))
            self._call(drop_prefix_cache, self.engine.engine.scheduler)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Put a new policy, ``(name, tensor)`` pairs by the HF model's names, into the running engine by
        LMDeploy's protocol (see the module's docstring): every weight, since the engine's level-2 sleep
        dropped them. One bucket is in flight at a time; the last one says ``finished``."""
        if self.backend != "pytorch":
            raise UserError("rlx updates LMDeploy's weights in its PyTorch engine only: set lmdeploy_backend 'pytorch'")
        from lmdeploy.serve.openai.protocol import UpdateParamsRequest

        agent = self.engine.engine.executor.model_agent
        self.sleep()
        self._call(self.engine.wakeup, ["weights"])
        groups = buckets(weights, BUCKET_BYTES)
        bucket = next(groups, None)
        try:
            while bucket is not None:
                following = next(groups, None)
                payload = in_process_payload(bucket)
                request = UpdateParamsRequest(serialized_named_tensors=payload, finished=following is None)
                self._call(agent.update_params, request, timeout=self.sync_timeout)
                bucket = following
        except FutureTimeout:
            raise UserError(
                f"LMDeploy did not take a bucket of the new policy's weights within {self.sync_timeout} s "
                "(rollout_config.weight_sync_timeout); rerun `rlx fit` to resume from the last complete step"
            ) from None
        finally:
            _IN_PROCESS.clear()
        self._call(self.engine.complete_weights_update)
        self._call(self.engine.wakeup, ["kv_cache"])
