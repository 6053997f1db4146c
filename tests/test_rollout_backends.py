"""The rollout backends: the transformers sampler, and the LMDeploy backend's conversions (on CPU).

LMDeploy itself needs a GPU (scripts/gpu_check.sh runs it there); what a CPU can check is that rlx
asks it for the right things and turns its answers into the same artifact as the CPU backend.
"""

from __future__ import annotations

import re

import pytest
import torch

from rlx.config import RolloutConfig, SampleParams
from rlx.samplers import TransformersSampler
from rlx.samplers.lmdeploy_backend import generation_options, to_generation
from rlx.tokens import prompt_ids
from rlx.training.loading import load_policy


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


def test_a_response_depends_on_its_prompt_and_seed_not_on_the_rows_beside_it(model_and_tokenizer):
    """Row ``i`` samples from seed ``seed + i`` alone: dealing prompts to several engines, each given the
    seed of its first row, samples what one engine samples (rlx.workers.group.GroupSampler)."""
    _, model, tokenizer = model_and_tokenizer
    params = SampleParams(max_tokens=12, temperature=1.0)
    ids = [p for p in prompts(tokenizer, 3) for _ in range(3)]  # three groups of three
    whole = TransformersSampler(model, tokenizer, RolloutConfig(rollout_max_batch_size=9)).generate(ids, params, seed=5)
    small = TransformersSampler(model, tokenizer, RolloutConfig(rollout_max_batch_size=2))
    dealt = small.generate(ids[:4], params, seed=5) + small.generate(ids[4:], params, seed=5 + 4)
    assert [g.response_ids for g in dealt] == [g.response_ids for g in whole]
    assert len({tuple(g.response_ids) for g in whole}) > 3  # the samples of a group differ
    top_1 = SampleParams(max_tokens=12, temperature=1.0, top_k=1)  # the warpers act before the draw
    greedy = SampleParams(max_tokens=12, temperature=0.0)
    one, argmax = small.generate(ids, top_1, seed=1), small.generate(ids, greedy, seed=2)
    assert [g.response_ids for g in one] == [g.response_ids for g in argmax]
    assert {lp for g in one for lp in g.logprobs} == {0.0}  # a support of one token holds all the probability


def test_top_k_and_top_p_rollouts_are_scored_over_the_support_they_were_sampled_from(model_and_tokenizer):
    """The sampler's log-probs are those of the cut, renormalised distribution it drew from, and the trainer,
    told the same sampling, scores the tokens the same: the update is on-policy (mismatch 0), where scoring
    over the whole vocabulary would lower every log-prob by the support's log-mass. A repetition penalty,
    which the trainer cannot score, shows in the mismatch instead."""
    from rlx.algo.correction import mismatch_metrics
    from rlx.training.trainer import TokenBatch, token_logprobs

    _, model, tokenizer = model_and_tokenizer
    sampler, ids = TransformersSampler(model, tokenizer, RolloutConfig()), prompts(tokenizer, 6)

    def scored(params):
        generations = sampler.generate(ids, params, seed=3)
        batch = TokenBatch.from_ids(ids, [g.response_ids for g in generations], tokenizer.pad_token_id)
        rollout = torch.tensor([lp for g in generations for lp in g.logprobs])
        mask = batch.mask > 0
        return rollout, token_logprobs(model, batch, params)[0][mask], token_logprobs(model, batch)[0][mask]

    cut = SampleParams(max_tokens=12, temperature=0.8, top_k=40, top_p=0.7)
    rollout, trained, whole = scored(cut)
    assert torch.allclose(trained, rollout, atol=1e-5)
    assert (whole < trained - 1e-3).sum() > len(whole) // 4  # the support's mass under 1 at most positions
    penalised = SampleParams(max_tokens=12, repetition_penalty=1.5)
    rollout, trained, _ = scored(penalised)
    mask = torch.ones_like(trained)
    assert mismatch_metrics(trained, rollout, mask)["mismatch/k3_kl"] > 1e-3


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


# ---- the LMDeploy sampler, run against a stand-in with 0.18.0's API (tests/helpers/lmdeploy_stand_in.py)


@pytest.fixture
def stand_in(monkeypatch):
    import torch

    from helpers import lmdeploy_stand_in

    lmdeploy_stand_in.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    yield lmdeploy_stand_in
    for pipe in lmdeploy_stand_in.PIPELINES:
        pipe.close()


@pytest.fixture(scope="module")
def small(untrained_model):
    """A model folder and its tokenizer: the stand-in only reads the folder's name."""
    from transformers import AutoTokenizer

    folder = untrained_model[0].tiny_model.output_dir
    return folder, AutoTokenizer.from_pretrained(folder, padding_side="left")


def lmdeploy_sampler(folder, tokenizer, **fields):
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    return LMDeploySampler(folder, tokenizer, RolloutConfig(backend="lmdeploy", **fields))


def rule(previous: int, bias: int, stops: set[int], max_tokens: int) -> list[int]:
    """What the stand-in's rule-model generates after ``previous``."""
    tokens = []
    while len(tokens) < max_tokens and (not tokens or tokens[-1] not in stops):
        previous = (previous + 1 + bias) % 64
        tokens.append(previous)
    return tokens


def test_lmdeploy_sampler_sends_token_ids_and_gets_ids_logprobs_and_finish(stand_in, small):
    """Token ids go in through ``preprocess(input_ids=...)``; the pieces ``generate`` yields add up
    to the response with its stop token, one log-prob per token, and why it ended."""
    from rlx.samplers.transformers_backend import stop_ids

    folder, tokenizer = small
    sampler = lmdeploy_sampler(folder, tokenizer, dtype="bfloat16", rollout_max_batch_size=7)
    params = SampleParams(max_tokens=6, stop_token_ids=[9])
    stops = set(stop_ids(tokenizer, params))
    outputs = sampler.generate([[3, 5], [30]], params, seed=4)
    for previous, out in zip([5, 30], outputs, strict=True):
        response = rule(previous, 0, stops, 6)
        assert out.response_ids == response and out.prompt_ids[-1] == previous
        assert out.logprobs == [-0.25 * (i + 1) for i in range(len(response))]
        assert out.finish_reason == ("stop" if response[-1] in stops else "length")
    assert {out.finish_reason for out in outputs} == {"stop", "length"}
    engine_config = stand_in.PIPELINES[-1].async_engine.backend_config
    assert (engine_config.logprobs_mode, engine_config.dtype, engine_config.max_batch_size) == (
        "raw_logprobs",
        "bfloat16",
        7,
    )


def test_lmdeploy_weight_update_follows_lmdeploy_protocol(stand_in, small, monkeypatch):
    """sleep (level 2) and empty the prefix cache, wake the weights, update in buckets (the last one
    ``finished``), complete the update, wake the KV cache; the new weights are the ones sampled from afterwards."""
    import torch

    from rlx.samplers import lmdeploy_backend

    folder, tokenizer = small
    monkeypatch.setattr(lmdeploy_backend, "BUCKET_BYTES", 16, raising=False)
    sampler = lmdeploy_sampler(folder, tokenizer)
    stand_in.CALLS.clear()
    weights = {"bias": torch.tensor([2.0]), "model.norm.weight": torch.ones(5)}
    sampler.load_weights(iter(weights.items()))  # pairs, read as they are sent (merged LoRA weights are made so)
    assert stand_in.CALLS == [
        ("sleep", 2),
        ("evict", 16),  # every block the scheduler has (tests/test_lmdeploy_contract.py runs the real eviction)
        ("wakeup", ["weights"]),
        ("update_params", False),
        ("update_params", True),
        ("complete_weights_update",),
        ("wakeup", ["kv_cache"]),
    ]
    params = SampleParams(max_tokens=5, stop_token_ids=[])
    out = sampler.generate([[1]], params, seed=0)[0]
    assert out.response_ids == rule(1, 2, {tokenizer.eos_token_id}, 5)
    sampler.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        sampler.generate([[1]], params, seed=0)


def test_lmdeploy_without_a_gpu_is_one_clear_line(stand_in, small, monkeypatch):
    import torch

    from rlx.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    folder, tokenizer = small
    with pytest.raises(UserError, match=r"^rollout_config.backend 'lmdeploy' needs a CUDA GPU; this machine has none"):
        lmdeploy_sampler(folder, tokenizer)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dtype": "float32"}, "rollout_config.dtype 'float32': LMDeploy runs 'auto', 'bfloat16' or 'float16'"),
        ({"tensor_parallel_size": 2}, "rollout_config.tensor_parallel_size 2: rlx updates LMDeploy's weights"),
        ({"gpu_memory_utilization": 1.0}, "rollout_config.gpu_memory_utilization must be below 1 for LMDeploy"),
    ],
)
def test_lmdeploy_settings_it_cannot_run_are_refused(stand_in, fields, message):
    from rlx.errors import UserError
    from rlx.samplers.lmdeploy_backend import engine_config

    with pytest.raises(UserError, match="^" + re.escape(message)):
        engine_config(RolloutConfig(backend="lmdeploy", **fields))


def test_an_lmdeploy_session_shorter_than_a_prompt_and_its_response_is_refused(stand_in):
    from conftest import PARAMS
    from rlx.config import ConfigError, load

    lmdeploy = ["rollout_config.backend=lmdeploy", "replay_buffer_config.max_prompt_length=100"]
    load(PARAMS, [*lmdeploy, "rollout_config.context_length=132"])  # the demo's 32 new tokens fit
    with pytest.raises(ConfigError, match=re.escape(
        "rollout_config.context_length 131: LMDeploy's sessions must hold replay_buffer_config.max_prompt_length "
        "plus dataflow_config.sample_params.max_tokens (132)"
    )):  # fmt: skip
        load(PARAMS, [*lmdeploy, "rollout_config.context_length=131"])


def test_lmdeploy_agent_rollouts_go_on_each_by_itself_from_the_ids_so_far(stand_in, small):
    """Each rollout is its own chain of requests: the second turn's input is the first's ids, the model's
    reply and the tool's tokens, and a rollout waiting for a slow tool holds up no other's next turn. The
    engine caches prefixes, so the repeated conversation is not computed again."""
    from rlx.agents.format import tool_turn_ids
    from rlx.agents.loop import AgentLoop, reset_row
    from rlx.config import AgentLoopConfig
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    folder, tokenizer = small
    sampler = LMDeploySampler(folder, tokenizer, RolloutConfig(backend="lmdeploy"), agent=True)
    assert stand_in.PIPELINES[-1].async_engine.backend_config.enable_prefix_caching is True
    encode = lambda text: [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]  # noqa: E731
    rollouts = {  # prompt, call, result
        "slow": ([3, 5], '{"name": "sleepy", "arguments": {"seconds": 0.5}}', "awake"),
        "fast": ([30], '{"name": "add", "arguments": {"a": 1, "b": 2}}', "3"),
    }
    turns = {}
    for name, (prompt, call, result) in rollouts.items():
        turns[name] = (
            encode(f"<tool_call>{call}</tool_call>"),
            tool_turn_ids(tokenizer, [{"role": "tool", "content": result}]),
        )
        stand_in.LEARNT[tuple(prompt)] = turns[name][0]
        stand_in.LEARNT[tuple(prompt + turns[name][0] + turns[name][1])] = encode(f"#### {result}")
    config = AgentLoopConfig(tools=["helpers.agents:sleepy", "helpers.agents:add"], max_turns=3)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=200))
    starts = [loop.start(reset_row("s", [{"role": "user", "content": "?"}], "1"), p) for p, _, _ in rollouts.values()]
    slow, fast = loop.run(sampler, starts, seed=0)
    assert [(t.final_text, t.turns, t.finish_reason) for t in (slow, fast)] == [
        ("#### awake", 2, "stop"),
        ("#### 3", 2, "stop"),
    ]
    call, tool = turns["fast"]
    assert fast.response_mask == [1] * len(call) + [0] * len(tool) + [1] * len(encode("#### 3"))
    started = {tuple(ids): when for when, ids in stand_in.REQUESTS}
    second = {name: started[tuple(rollouts[name][0] + turns[name][0] + turns[name][1])] for name in rollouts}
    assert second["fast"] < second["slow"] - 0.3  # the fast rollout's next turn did not wait for the slow tool


def test_the_gpu_checks_lmdeploy_reference_is_its_own_batch_inference_of_the_same_requests(stand_in, small):
    """The GPU check's reference (tests/helpers/engine_pace): LMDeploy's ``Pipeline.infer`` on the engine rlx
    started, given each prompt as text, which it encodes back to the same ids, and rlx's config for each
    request: it generates what rlx's sampler generates."""
    from helpers import engine_pace

    folder, tokenizer = small
    sampler = lmdeploy_sampler(folder, tokenizer, **{k: v for k, v in engine_pace.BASE.items() if k != "backend"})
    report = engine_pace.pace(sampler, prompts(tokenizer, 5), SampleParams(max_tokens=6, min_tokens=6), seed=3)
    assert report["generated_tokens"] == {"rlx": 30, "lmdeploy": 30} and report["same_responses"] == 1.0
    assert report["prompt_tokens"]["lmdeploy"] == report["prompt_tokens"]["rlx"] > 0
    assert report["rlx_over_lmdeploy"] > 0 and report["lmdeploy_pipeline_without_logprobs_tokens_per_s"] > 0


@pytest.mark.parametrize("setting", ["eager_mode", "max_prefill_token_num_16384", "max_batch_size_512",
                                     "cache_max_entry_count_0.8"])  # fmt: skip
def test_each_lmdeploy_engine_setting_the_gpu_check_sweeps_reaches_the_engine_config(stand_in, setting):
    from helpers import engine_pace
    from rlx.samplers.lmdeploy_backend import engine_config

    fields = engine_pace.ENGINE_SWEEP[setting]
    made = engine_config(engine_pace.rollout_config(**fields))
    wanted = {**fields.get("extra_engine_args", {}), "session_len": engine_pace.BASE["context_length"]}
    wanted["max_batch_size"] = fields.get("rollout_max_batch_size", RolloutConfig().rollout_max_batch_size)
    wanted["cache_max_entry_count"] = fields.get("gpu_memory_utilization", engine_pace.BASE["gpu_memory_utilization"])
    assert {name: getattr(made, name) for name in wanted} == wanted
