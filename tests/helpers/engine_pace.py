"""rlx's rollout against LMDeploy's own pace, for the GPU check's part (a) and its engine-settings sweep.

The reference is LMDeploy's batch inference, ``Pipeline.infer``, on the very engine rlx's sampler
started (``sampler.pipe``), so the engine config is the same by construction, and with the
``GenerationConfig`` rlx makes for each request (``generation_options``, its seed included). rlx
sends token ids; ``infer`` takes text, so it gets each prompt's ids decoded and tokenizes them itself
with no chat template (``do_preprocess=False``): the report gives both sides' prompt tokens, and with
the same seeds the responses themselves can be compared. The CPU tests run all of this against the
stand-in (tests/helpers/lmdeploy_stand_in.py), whose names and signatures ``make lmdeploy-contract``
holds to 0.18.0's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rlx.config import RolloutConfig, SampleParams
from rlx.samplers.lmdeploy_backend import generation_options
from rlx.samplers.types import row_seeds

# The engine the check's rollouts run on; 512 requests x 256 new tokens in flight at once.
BASE = {"backend": "lmdeploy", "gpu_memory_utilization": 0.4, "context_length": 1024}
PROMPTS, NEW_TOKENS = 512, 256
# Each setting is a fresh engine (LMDeploy reads its config once, at start), rlx's fields over BASE.
ENGINE_SWEEP = {
    "eager_mode": {"extra_engine_args": {"eager_mode": True}},  # no CUDA graphs
    "max_prefill_token_num_16384": {"extra_engine_args": {"max_prefill_token_num": 16384}},  # default 8192
    "max_batch_size_512": {"rollout_max_batch_size": 512},  # rlx's default 1024, LMDeploy's on H100/H200 too
    "cache_max_entry_count_0.8": {"gpu_memory_utilization": 0.8},  # the KV cache's share of free memory
}


def rollout_config(**fields) -> RolloutConfig:
    return RolloutConfig(**{**BASE, **fields})


def sampling() -> SampleParams:
    """Every response runs to ``NEW_TOKENS``, sampled at temperature 1, as rlx's LMDeploy rollouts are."""
    return SampleParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=1.0)


def timed(run: Callable):
    """``run()``'s result and its wall seconds, the device's queued work included."""
    synced = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
    synced()
    started = time.perf_counter()
    result = run()
    synced()
    return result, time.perf_counter() - started


def lmdeploy_own(sampler, prompt_ids: list[list[int]], params: SampleParams, seed: int, logprobs: bool = True):
    """LMDeploy's ``Pipeline.infer`` of the prompts on ``sampler``'s engine, each request with the config rlx
    gives it (without the per-token log-prob when not ``logprobs``): its ``Response`` list."""
    import lmdeploy

    options = [generation_options(sampler.tokenizer, params, row) for row in row_seeds(seed, len(prompt_ids))]
    configs = [lmdeploy.GenerationConfig(**(o if logprobs else {**o, "logprobs": None})) for o in options]
    texts = [sampler.tokenizer.decode(ids) for ids in prompt_ids]
    return sampler.pipe.infer(texts, gen_config=configs, do_preprocess=False)


def pace(sampler, prompt_ids: list[list[int]], params: SampleParams, seed: int) -> dict:
    """rlx's rollout against LMDeploy's own batch inference, same engine, prompts, settings and seeds:
    the generated tokens/s of each, rlx's as a share of LMDeploy's, and LMDeploy's without log-probs."""
    ours, rlx_s = timed(lambda: sampler.generate(prompt_ids, params, seed=seed))
    own, own_s = timed(lambda: lmdeploy_own(sampler, prompt_ids, params, seed))
    bare, bare_s = timed(lambda: lmdeploy_own(sampler, prompt_ids, params, seed, logprobs=False))
    tokens = sum(len(out.response_ids) for out in ours)
    own_tokens = sum(len(out.token_ids) for out in own)
    return {
        "prompts": len(prompt_ids),
        "rlx_tokens_per_s": tokens / rlx_s,
        "lmdeploy_pipeline_tokens_per_s": own_tokens / own_s,
        "rlx_over_lmdeploy": (tokens / rlx_s) / (own_tokens / own_s),
        "lmdeploy_pipeline_without_logprobs_tokens_per_s": sum(len(out.token_ids) for out in bare) / bare_s,
        "generated_tokens": {"rlx": tokens, "lmdeploy": own_tokens},
        "prompt_tokens": {"rlx": sum(map(len, prompt_ids)), "lmdeploy": sum(out.input_token_len for out in own)},
        "same_responses": sum(a.response_ids == b.token_ids for a, b in zip(ours, own, strict=True)) / len(own),
    }
