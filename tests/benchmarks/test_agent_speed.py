"""Agent rollouts (issue 30): what the tools' turns add to generation, and what a turn costs the loop
as the conversation grows.

Overhead: every response of the demo batch (16 prompts x 8) calls a 50 ms tool (helpers.agents.pause)
in each of two turns, then answers, through the real agent loop and transformers backend, greedy; the
same generate calls (the same contexts and seeds: the same tokens) are then made back to back without
tools. The tools of different rollouts run together, so the issue's target is agent <= generation +
2 x 50 ms x 1.2: the agent loop's wall time minus the seconds its own generate calls took, each round.
Two model sizes: the untrained model (1 layer of 32: generation cheap, the tools' share large) and a
random-init model of the demo's shape (4 layers of 160), each first taught the conversation by heart.
Two kinds of tool: a plain function (its calls in threads, ``helpers.agents.pause``) and the same as
``async def`` (its calls on one event loop, ``helpers.async_agents.pause``).

Given-up tools: Python work in the process after four CPU-bound tools were given up at their deadline,
against the same work before (issue 45 measured 4.1x when their threads went on running).

Per-turn cost: the loop's own work for each turn of a 128-turn conversation (reading the model's
turn, rendering and tokenizing the tool's result) against a loop that renders and tokenizes the whole
conversation again each turn (TRL PR #6250 measured ~56 % of generation at 128 turns that way).
"""

from __future__ import annotations

import itertools
import statistics
import time
from functools import partial

import pytest
from harness import DEMO, FLOW, alternate, demo_tokenizer, record

from rlx.agents.calls import Outcome, run_chains
from rlx.agents.format import tool_turn_ids
from rlx.agents.loop import AgentLoop, Trajectory, reset_row
from rlx.agents.tools import open_session
from rlx.config import AgentLoopConfig, SampleParams
from rlx.samplers import TransformersSampler
from rlx.samplers.types import Generation
from rlx.training.loading import load_policy

ROUNDS = 3
PROMPTS, K = 16, FLOW.prompt_repeat_k  # the demo's batch: 16 prompts x 8
TOOL_S, CALLS = 0.05, 2
SHAPE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
CALL = '<tool_call>\n{"name": "pause", "arguments": {}}\n</tool_call>'
TOOLS = {"thread": "helpers.agents:pause", "async": "helpers.async_agents:pause"}  # both named pause
AGENT = AgentLoopConfig(tools=[TOOLS["thread"]], max_turns=CALLS + 1, tool_timeout=5.0)
PARAMS = SampleParams(max_tokens=256, temperature=0.0)


def taught(model_dir, tokenizer, prompts: list[list[int]], folder):
    """The model taught to answer each prompt with two calls of ``pause`` (one a turn), then ``#### 1``."""
    from helpers.teaching import teach

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tokenizer.eos_token_id
    call, result = [*encode(CALL), eos], tool_turn_ids(tokenizer, [{"role": "tool", "content": "ok"}])
    pieces = [call, result] * CALLS + [[*encode("#### 1"), eos]]
    teach(model_dir, folder, [(ids, pieces) for ids in prompts[::K]], steps=120)
    return load_policy(folder)


@pytest.fixture(scope="module", params=["untrained", "demo-shape"])
def agent_batch(request, untrained_model, tmp_path_factory):
    """(name, the model taught to call, its tokenizer, the batch's prompt ids with the tool's schema, the
    rollout settings). Sizes: the untrained model (1 layer of 32) and a random-init one of the demo
    model's shape (4 layers of 160; its warm start would teach it nothing the teaching here needs)."""
    from rlx.tasks.data import load_rows
    from rlx.tasks.tiny_model import create_model, save
    from rlx.tokens import prompt_ids

    cfg, _ = untrained_model
    tokenizer = demo_tokenizer(untrained_model)
    base = tmp_path_factory.mktemp(f"agent-{request.param}")
    start = cfg.tiny_model.output_dir
    if request.param == "demo-shape":
        start, shape = base / "random", DEMO.tiny_model
        sized = cfg.tiny_model.model_copy(update={name: getattr(shape, name) for name in SHAPE})
        save(create_model(sized, tokenizer), tokenizer, start)
    rows = load_rows(cfg.synthetic_task.output_dir / "train.parquet")[:PROMPTS]
    schemas = AGENT.toolbox().schemas
    prompts = [prompt_ids(tokenizer, row["prompt"], schemas) for row in rows for _ in range(K)]
    return request.param, taught(start, tokenizer, prompts, base / "model"), tokenizer, prompts, cfg


@pytest.mark.parametrize("tool", list(TOOLS))
def test_agent_rollout_overhead(benchmark, agent_batch, tool):
    """Rounds alternate the agent loop and its generate calls alone, so a drift in speed hits both; the
    verdict compares each agent round with its own generate calls' seconds (the machine's noise between
    two rounds, seconds on a shared one, would swamp the 0.1 s measured)."""
    from helpers.agents import Recorded

    name, model, tokenizer, prompts, cfg = agent_batch
    sampler = TransformersSampler(model, tokenizer, cfg.rollout_config)
    loop = AgentLoop(AGENT.model_copy(update={"tools": [TOOLS[tool]]}), tokenizer, PARAMS)
    recorded, generating = Recorded(sampler), []

    def agent():
        recorded.calls.clear()
        recorded.seconds.clear()
        starts = [loop.start(reset_row("rlx/arith", [], "1"), ids) for ids in prompts]
        rollouts = loop.run(recorded, starts, seed=0)
        generating.append(sum(recorded.seconds))
        return rollouts

    def generation_only():
        return [sampler.generate(contexts, params, seed=seeds) for contexts, params, seeds in list(recorded.calls)]

    rounds = alternate(benchmark, {"agent": agent, "generation": generation_only}, ROUNDS)
    rollouts, generated = rounds.last["agent"], rounds.last["generation"]
    calls = [sum(call["error"] is None for call in t.calls) for t in rollouts]
    assert calls == [CALLS] * len(prompts), f"not every response made {CALLS} good calls: {calls}"
    model_tokens = sum(sum(t.response_mask) for t in rollouts)
    assert model_tokens == sum(len(g.response_ids) for batch in generated for g in batch), "not the same tokens"
    record(
        f"agent_overhead/{name}/{tool}",
        {
            "rollouts": len(rollouts),
            "calls_per_rollout": CALLS,
            "tool_s": TOOL_S,
            "model_tokens": model_tokens,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": rounds.seconds,
            "generating_in_agent_s": generating[1:],  # (not the warm-up round's)
        },
    )


TURNS = 128


def test_agent_turn_cost_by_turn(benchmark, untrained_model):
    """Each side takes the same 128 turns (a call, its result), timed turn by turn: flat for a loop that
    only tokenizes what is new, growing for one that renders the whole conversation again."""
    tokenizer = demo_tokenizer(untrained_model)
    config = AgentLoopConfig(tools=["helpers.agents:pause"], max_turns=TURNS + 1)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=100 * TURNS))
    call = [*tokenizer.encode(CALL, add_special_tokens=False), tokenizer.eos_token_id]
    turn = Generation([], call, CALL, [0.0] * len(call), "stop")

    def token_in_token_out():
        trajectory, seconds = Trajectory([0], open_session(loop.toolbox, {})), []
        for _ in range(TURNS):
            started = time.perf_counter()
            calls = loop.take_turn(trajectory, turn)
            loop.add_results([(trajectory, calls, [Outcome("ok")] * len(calls))])
            seconds.append(time.perf_counter() - started)
        return seconds

    def re_tokenized():
        messages, seconds = [{"role": "user", "content": "Wait for it."}], []
        for _ in range(TURNS):
            started = time.perf_counter()
            messages += [{"role": "assistant", "content": CALL}, {"role": "tool", "content": "ok"}]
            tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            seconds.append(time.perf_counter() - started)
        return seconds

    rounds = alternate(benchmark, {"rlx": token_in_token_out, "re-tokenized": re_tokenized}, ROUNDS)
    record("agent_turns", {"turns": TURNS, "seconds": {side: rounds.last[side] for side in rounds.last}})
    assert statistics.median(rounds.last["rlx"][-16:]) < 3 * statistics.median(rounds.last["rlx"][:16])


GIVEN_UP = 4  # CPU-bound tools given up at their deadline each round (issue 45 measured 4.1x after four)


def python_work() -> float:
    """Seconds of some pure-Python work: what a spinning tool's thread competes with for the GIL."""
    started, total = time.perf_counter(), 0
    for number in range(3_000_000):
        total += number
    return time.perf_counter() - started


def test_python_work_after_cpu_bound_tools_are_given_up(benchmark):
    """Each round: the work alone, then four spinning tools given up at a 50 ms deadline and the same work."""
    from helpers import agents

    labels, seconds = (f"bench-spin-{n}" for n in itertools.count()), {"before": [], "after": []}

    def before():
        seconds["before"].append(python_work())

    def after():
        chains = [[partial(agents.spin, next(labels))] for _ in range(GIVEN_UP)]
        assert all(outcome.timed_out for (outcome,) in run_chains(chains, timeout=0.05))
        seconds["after"].append(python_work())

    alternate(benchmark, {"before": before, "after": after}, 5)
    record("given_up_tools", {"tools": GIVEN_UP, "seconds": {side: s[1:] for side, s in seconds.items()}})
