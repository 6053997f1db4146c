"""The rollout backends: the transformers sampler, and the LMDeploy backend's conversions (on CPU).

LMDeploy itself needs a GPU (scripts/gpu_check.sh runs it there); what a CPU can check is that rlx
asks it for the right things and turns its answers into the same artifact as the CPU backend.
"""

from __future__ import annotations

import pytest

from rlx.config import RolloutConfig, SampleParams
from rlx.data import prompt_ids
from rlx.engines import load_policy
from rlx.rollout import TransformersSampler
from rlx.rollout.lmdeploy_backend import generation_options, to_generation


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model):
    from transformers import AutoTokenizer

    cfg, _ = tiny_model
    folder = cfg.tiny_model.output_dir
    return folder, load_policy(folder), AutoTokenizer.from_pretrained(folder, padding_side="left")


def prompts(tokenizer, count=4):
    return [prompt_ids(tokenizer, [{"role": "user", "content": f"What is {i} + 2?"}]) for i in range(count)]


def test_transformers_sampler_is_reproducible_and_complete(model_and_tokenizer):
    _, model, tokenizer = model_and_tokenizer
    sampler = TransformersSampler(model, tokenizer, RolloutConfig(rollout_max_batch_size=3))
    params = SampleParams(max_tokens=12, temperature=1.0)
    ids = prompts(tokenizer)
    first, again = sampler.generate(ids, params, seed=5), sampler.generate(ids, params, seed=5)
    assert first == again
    for prompt, out in zip(ids, first, strict=True):
        assert out.prompt_ids == prompt
        assert len(out.logprobs) == len(out.response_ids) <= 12
        assert all(lp <= 0 for lp in out.logprobs)
        assert out.finish_reason in {"stop", "length"}


def test_lmdeploy_request_mirrors_the_transformers_sampling(model_and_tokenizer):
    _, _, tokenizer = model_and_tokenizer
    params = SampleParams(max_tokens=20, min_tokens=2, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=[7])
    options = generation_options(tokenizer, params, seed=11)
    assert options["stop_token_ids"] == [tokenizer.eos_token_id, 7]
    assert options["include_stop_str_in_output"] and options["logprobs"] == 1
    assert (options["max_new_tokens"], options["min_new_tokens"], options["random_seed"]) == (20, 2, 11)
    assert (options["temperature"], options["top_p"], options["top_k"], options["do_sample"]) == (0.7, 0.9, 5, True)
    greedy = generation_options(tokenizer, SampleParams(temperature=0), seed=0)
    assert (greedy["do_sample"], greedy["top_k"], greedy["temperature"]) == (False, 1, 1.0)


def test_lmdeploy_output_becomes_the_same_artifact(model_and_tokenizer):
    """LMDeploy's per-token ``{token: logprob}`` maps (top-k plus the sampled token) become the
    sampled token's log-prob; text is decoded by rlx; stop strings cut the text, not the ids."""
    _, _, tokenizer = model_and_tokenizer
    response = tokenizer.encode("12 then more", add_special_tokens=False) + [tokenizer.eos_token_id]
    logprobs = [{token: -0.5 * (i + 1), 99999: -9.0} for i, token in enumerate(response)]
    params = SampleParams(stops=[" then"])
    out = to_generation([1, 2, 3], response, logprobs, "stop", tokenizer, params)
    assert out.response_ids == response and out.prompt_ids == [1, 2, 3]
    assert out.logprobs == [-0.5 * (i + 1) for i in range(len(response))]
    assert out.text == "12" and out.finish_reason == "stop"
    assert to_generation([1], response, logprobs, "length", tokenizer, SampleParams()).finish_reason == "length"
    with pytest.raises(RuntimeError, match="lack the sampled token"):
        to_generation([1], response, [{0: -1.0}] * len(response), "stop", tokenizer, params)
    with pytest.raises(RuntimeError, match="tokens but"):
        to_generation([1], response, logprobs[:-1], "stop", tokenizer, params)
