"""What the OpenAI-compatible endpoint adds to a call (issue 48; rlx.agents.endpoint): 64 programs at once,
each one call of 16 sampled tokens through the real ``openai`` client and the real server on localhost,
against the same 64 requests sent to the same sampler through the same batching directly
(rlx.agents.loop.TurnRequests, as the built-in loop sends them): the same contexts and seeds, so the same
tokens. The sides alternate, round after round. Two sizes: the untrained model (1 layer of 32; the
endpoint's share largest) and a random-init Qwen3 of 25 M parameters. Goals: at most 5 ms more per call,
tokens/s at least 0.95x the direct side's."""

from __future__ import annotations

import asyncio

import pytest
from harness import alternate, demo_tokenizer, random_model, record

from conftest import make_project
from rlx.agents.loop import TurnRequests, reset_row, run_to_end
from rlx.agents.programs import ProgramLoop
from rlx.config import AgentLoopConfig, SampleParams
from rlx.samplers import TransformersSampler
from rlx.tokens import prompt_ids
from rlx.training.loading import load_policy

ROUNDS, SESSIONS = 5, 64
PARAMS = SampleParams(max_tokens=16, min_tokens=16)
QUESTION = [{"role": "user", "content": "What is 17 + 25?"}]


def direct(sampler, tokenizer, ids: list[int]) -> list:
    """The 64 requests sent as the endpoint sends them, without HTTP: what it adds is the difference."""
    made = []

    async def all_sessions():
        turns = TurnRequests(sampler, tokenizer, SESSIONS)

        async def one(index):
            generation, _ = await turns.generate(index, ids, PARAMS, index)  # call 0 of row ``index``: its seed
            turns.leave()
            return generation

        made.extend(await asyncio.gather(*(one(index) for index in range(SESSIONS))))

    run_to_end(all_sessions())
    return made


@pytest.mark.parametrize("size", ["untrained", "25M"])
def test_endpoint_overhead_per_call(benchmark, untrained_model, tiny_model, tmp_path, size):
    tokenizer = demo_tokenizer(untrained_model)
    folder = untrained_model[0].tiny_model.output_dir
    if size != "untrained":
        folder, _ = random_model(make_project(tmp_path, tiny_model), size, tmp_path)
    model = load_policy(folder)
    sampler = TransformersSampler(model, tokenizer, untrained_model[0].rollout_config)
    ids = prompt_ids(tokenizer, QUESTION)
    loop = ProgramLoop(AgentLoopConfig(program="helpers.programs:one_call"), tokenizer, PARAMS)
    starts = loop.starts([reset_row("rlx/arith", QUESTION, "42")] * SESSIONS, [ids] * SESSIONS)
    sides = {
        "direct": lambda: direct(sampler, tokenizer, ids),
        "endpoint": lambda: loop.run(sampler, starts, 0),
    }
    rounds = alternate(benchmark, sides, ROUNDS)
    served, sent = rounds.last["endpoint"], rounds.last["direct"]
    assert [t.response_ids for t in served] == [g.response_ids for g in sent], "not the same tokens"
    assert all(t.finish_reason != "program_failed" for t in served)
    per_call_ms = [
        (endpoint - plain) / SESSIONS * 1000
        for plain, endpoint in zip(rounds.seconds["direct"], rounds.seconds["endpoint"], strict=True)
    ]
    record(
        f"endpoint_overhead/{size}",
        {
            "sessions": SESSIONS,
            "tokens_per_call": PARAMS.max_tokens,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": rounds.seconds,
            "added_ms_per_call": per_call_ms,
            "tokens_per_s_ratio": [
                plain / endpoint
                for plain, endpoint in zip(rounds.seconds["direct"], rounds.seconds["endpoint"], strict=True)
            ],
        },
    )
