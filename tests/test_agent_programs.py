"""Agents as plain OpenAI-client programs (rlx.agents.programs, rlx.agents.endpoint): the real ``openai``
package against rlx's real endpoint on localhost, over the real transformers backend."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from conftest import fit, killed_and_resumed
from helpers.programs import ADD
from rlx.agents.format import tool_turn_ids
from rlx.agents.loop import reset_row, tool_use
from rlx.agents.programs import PROGRAM_LOOP, ProgramLoop
from rlx.config import AgentLoopConfig, JudgerConfig, SampleParams
from rlx.errors import UserError
from rlx.judgers import Panel
from rlx.judgers.rows import judge_rows
from rlx.lineage.record import edit_params
from rlx.store.layout import RunLayout
from rlx.tokens import prompt_ids
from test_resume import AGENT_KILL, STEPS, final_policy, fresh_copy

QUESTION = [{"role": "user", "content": "4 + 5?"}]


def left_behind(wait: float = 2.0) -> list[str]:
    """The programs' loop threads (and their executors') still running after ``wait`` seconds at most."""
    deadline = time.perf_counter() + wait
    while True:
        names = [t.name for t in threading.enumerate() if t.name == PROGRAM_LOOP or t.name.startswith("asyncio_")]
        if not names or time.perf_counter() > deadline:
            return names
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tokenizer(untrained_model):
    return AutoTokenizer.from_pretrained(untrained_model[0].tiny_model.output_dir)


@pytest.fixture(scope="module")
def taught(untrained_model, tokenizer, tmp_path_factory):
    """The untrained model taught one rollout by heart, with the program's tool shown in its prompt: call
    ``add`` (spelled character by character: ids the tokenizer would merge if encoded again), read the
    result, answer. Its folder, prompt ids and the rollout's three pieces."""
    from helpers.teaching import teach

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = [i for c in '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 5}}</tool_call>' for i in encode(c)]
    pieces = ([*call, tokenizer.eos_token_id], tool_turn_ids(tokenizer, [{"role": "tool", "content": "9"}]))
    pieces += ([*encode("#### 9"), tokenizer.eos_token_id],)
    prompt = prompt_ids(tokenizer, QUESTION, [ADD])
    folder = tmp_path_factory.mktemp("taught-program") / "model"
    teach(untrained_model[0].tiny_model.output_dir, folder, [(prompt, list(pieces))], steps=60)
    return folder, prompt, pieces


@pytest.fixture(scope="module")
def sampler(untrained_model, taught, tokenizer):
    from rlx.samplers import TransformersSampler
    from rlx.training.loading import load_policy

    return TransformersSampler(load_policy(taught[0]), tokenizer, untrained_model[0].rollout_config)


def rollouts(program, sampler, tokenizer, golds=("9",), seed=3, max_tokens=120, **limits):
    """The rollouts of ``program`` on the question, one per gold, sampled greedily (the taught model's
    rollout is exact only so)."""
    loop = ProgramLoop(
        AgentLoopConfig(program=program, **limits), tokenizer, SampleParams(max_tokens=max_tokens, temperature=0)
    )
    rows = [reset_row("rlx/arith", QUESTION, gold) for gold in golds]
    return loop.run(sampler, loop.starts(rows, [prompt_ids(tokenizer, QUESTION)] * len(rows)), seed)


def test_a_program_continues_from_the_sampled_ids_not_from_its_text_encoded_again(sampler, taught, tokenizer):
    """The OpenAI client sends the whole conversation each call; the second call's context is the first's
    ids, the sampled reply's ids and the tool result's, byte for byte, though this tokenizer, decoding and
    encoding the reply again, would merge its ids."""
    _, prompt, (call, tool, answer) = taught
    (rollout,) = rollouts("helpers.programs:adder", sampler, tokenizer)
    assert (rollout.turns, rollout.finish_reason, rollout.final_text) == (2, "stop", "#### 9")
    assert rollout.prompt_ids == prompt
    assert rollout.response_ids == call + tool + answer
    assert rollout.response_mask == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    assert [lp is None for lp in rollout.logprobs] == [m == 0 for m in rollout.response_mask]
    assert tokenizer.encode(tokenizer.decode(prompt + call), add_special_tokens=False) != prompt + call
    (recorded,) = json.loads(rollout.columns()["tool_calls"])
    assert (recorded["turn"], recorded["tool"], recorded["result"]) == (1, "add", "9")
    assert json.loads(recorded["arguments"]) == {"a": 4, "b": 5} and recorded["seconds"] >= 0
    assert json.loads(rollout.columns()["segments"]) == []
    requests = json.loads(rollout.columns()["requests"])
    assert [(r["segment"], r["prompt_tokens"], r["response_tokens"]) for r in requests] == [
        (0, len(prompt), len(call)),
        (0, len(prompt) + len(call) + len(tool), len(answer)),
    ]


def test_a_streamed_conversation_is_the_same_rollout(sampler, tokenizer):
    """``stream: true`` (as the OpenAI client streams, chunk by chunk) gives the program the same reply, and the
    rollout the same tokens, as the plain calls."""
    fields = lambda t: (t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, t.final_text)  # noqa: E731
    (plain,) = rollouts("helpers.programs:adder", sampler, tokenizer)
    (streamed,) = rollouts("helpers.programs:streaming_adder", sampler, tokenizer)
    assert fields(streamed) == fields(plain) and streamed.turns == 2


def test_concurrent_programs_keep_their_own_trajectories_and_a_rerun_is_bitwise_the_same(sampler, tokenizer):
    """Eight programs at once, each with its key: each trajectory is a whole conversation of its own, and
    the same seed gives the same ids, log-probs and texts."""
    first = rollouts("helpers.programs:adder", sampler, tokenizer, golds=["9"] * 8)
    again = rollouts("helpers.programs:adder", sampler, tokenizer, golds=["9"] * 8)
    assert not left_behind(), "a run left its programs' thread or its executor's behind"
    untimed = lambda calls: [{k: v for k, v in call.items() if k != "seconds"} for call in calls]  # noqa: E731
    fields = lambda t: (t.prompt_ids, t.response_ids, t.response_mask, t.logprobs, t.text, untimed(t.calls))  # noqa: E731
    assert [fields(t) for t in first] == [fields(t) for t in again]
    assert all(t.turns == 2 and t.final_text == "#### 9" for t in first)


def test_a_rewritten_history_starts_a_new_segment_and_keeps_the_old_one(sampler, tokenizer):
    (rollout,) = rollouts("helpers.programs:rewriter", sampler, tokenizer)
    (old,) = json.loads(rollout.columns()["segments"])
    assert old["turns"] == 1 and old["prompt_ids"] == prompt_ids(tokenizer, QUESTION)
    assert rollout.turns == 1 and rollout.prompt_ids[: len(old["prompt_ids"])] != old["prompt_ids"]
    assert tokenizer.decode(rollout.prompt_ids).count("Again: 4 + 5?") == 1


FAULTS = {  # each fault of helpers.programs.faulty, by the ground truth that makes it
    "raises": "raised ValueError: the agent's own bug",
    "hangs": "no answer within 1.0 s (agent_loop_config.program_timeout)",
    "chatty": "more than 2 calls (agent_loop_config.max_turns)",
    "says_nothing": "returned {'not': 'an answer'}, not an answer (a string) or a reward (a number)",
}


def test_each_fault_of_a_program_scores_its_rollout_0_with_its_reason_and_the_others_go_on(sampler, tokenizer):
    """All at once, beside a program that sends a malformed call and one that behaves: the hung one is given
    up at its deadline, the others end as they would alone."""
    started = time.perf_counter()
    golds = [*FAULTS, "garbage", "9"]
    made = rollouts("helpers.programs:faulty", sampler, tokenizer, golds, max_turns=2, program_timeout=1.0)
    ran = dict(zip(golds, made, strict=True))
    assert time.perf_counter() - started < 30
    for gold, reason in FAULTS.items():
        assert (ran[gold].finish_reason, ran[gold].reward_error) == ("program_failed", reason), gold
    assert (ran["garbage"].reward_error, ran["garbage"].turns, ran["garbage"].refused_calls) == (None, 1, 1)
    assert (ran["9"].reward_error, ran["9"].turns, ran["9"].final_text) == (None, 2, "#### 9")
    rows = [{"data_source": "rlx/arith", "ground_truth": "9", "response_len": len(t.response_ids),
             "finish_reason": t.finish_reason, **t.columns()} for t in ran.values()]  # fmt: skip
    judged = judge_rows(Panel(JudgerConfig()), rows, "final_text")
    assert [j["error"] for j in judged][: len(FAULTS)] == [f"program: {reason}" for reason in FAULTS.values()]
    assert [j["reward"] for j in judged] == [0.0] * (len(rows) - 1) + [1.0]
    used = tool_use(rows, "agent")
    assert (used["agent/program_failures"], used["agent/refused_calls"]) == (len(FAULTS), 2)  # garbage, chatty


def test_a_program_that_fails_on_every_row_stops_the_run_in_one_line(sampler, tokenizer):
    """Failing everywhere is the program's (or the setup's) fault, not the rollouts': no step trains on it."""
    with pytest.raises(UserError) as failed:
        rollouts("helpers.programs:raises", sampler, tokenizer, golds=["9", "9"])
    assert str(failed.value) == (
        "agent_loop_config.program: raised ValueError: the agent's own bug, on every prompt row"
    )


def test_a_command_program_reads_its_row_and_endpoint_from_stdin_and_environment(sampler, tokenizer):
    command = [sys.executable, "tests/helpers/agent_command.py"]
    ok, failed = rollouts(command, sampler, tokenizer, golds=["9", "fail"], program_timeout=60.0)
    assert (ok.finish_reason, ok.turns, ok.final_text) == ("length", 1, ok.final_text)
    assert ok.reward_error is None and len(ok.response_ids) == 3
    assert (failed.finish_reason, failed.reward_error) == ("program_failed", "exit code 4: cannot go on")


def test_sampling_the_run_fixes_is_refused_with_the_field_named(sampler, tokenizer):
    rollout, _ = rollouts("helpers.programs:hotter", sampler, tokenizer, golds=["9", "behaves"])
    assert rollout.finish_reason == "program_failed"
    assert "temperature 0.3: this run samples with 0.0 (its dataflow_config.sample_params)" in rollout.reward_error


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"program": "helpers.programs:missing"}, "program 'helpers.programs:missing': cannot import it"),
        ({"program": "helpers.programs:plain"}, "expected an async def run(client, row)"),
        ({"program": ["no-such-agent-binary"]}, "no-such-agent-binary is not an executable on PATH"),
        ({"program": "helpers.programs:adder", "tools": ["helpers.agents:add"]}, "set one of tools"),
        ({"program": "helpers.programs:adder", "tool_timeout": 3.0}, "tool_timeout: the program runs its own tools"),
        ({"tools": ["helpers.agents:add"], "program_timeout": 3.0}, "program_timeout acts only with program"),
    ],
)
def test_a_program_that_cannot_run_is_refused_with_the_config(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AgentLoopConfig(**fields)


@pytest.mark.parametrize("fields", [{"program": "helpers.programs:adder"}, {"tools": ["helpers.agents:add"]}])
def test_a_saved_config_loads_back_with_every_field_named(fields):
    """A run's config.yaml names every field, defaults too: nothing it holds is refused on resume."""
    saved = AgentLoopConfig(**fields).model_dump()
    assert AgentLoopConfig(**saved).model_dump() == saved


def test_the_endpoint_lists_its_model_and_refuses_an_unknown_key(sampler, tokenizer):
    import openai

    from rlx.agents.endpoint import Endpoint, Limits
    from rlx.agents.loop import TurnRequests

    async def ask():
        endpoint = Endpoint(TurnRequests(sampler, tokenizer, 1), {}, SampleParams(), Limits(2, 8))
        base_url = await endpoint.start()
        try:
            async with openai.AsyncOpenAI(base_url=base_url, api_key="stranger", max_retries=0) as client:
                models = [m.id async for m in client.models.list()]
                with pytest.raises(openai.AuthenticationError, match="unknown API key"):
                    await client.chat.completions.create(model="rlx-policy", messages=QUESTION)
        finally:
            await endpoint.close()
        return models

    assert asyncio.run(ask()) == ["rlx-policy"]


def test_the_readme_shows_the_demo_program_in_full():
    """The README's program is the demo's (rlx.tasks.calculator_agent), word for word."""
    from conftest import ROOT

    block = (ROOT / "README.md").read_text().split("```python\n# calculator_agent.py\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "src/rlx/tasks/calculator_agent.py").read_text()


PROGRAM = "dataflow_config.agent_loop_config={program: helpers.programs:pinger, max_turns: 2}"


@pytest.mark.slow
def test_an_agent_program_run_killed_in_its_rollout_reruns_to_the_same_weights(agent_project, tmp_path):
    """The agent run with its agent an OpenAI-client program (helpers.programs.pinger): run uninterrupted, and
    killed by SIGKILL in step 2's rollout as the endpoint appends a program's tool results, then rerun; both
    end on the same weights, with the same rollouts (tokens, masks, log-probs, answers)."""
    runs = {}
    for name in ("uninterrupted", "killed"):
        project = fresh_copy(agent_project, tmp_path / name)
        edit_params(project / "params.yaml", [PROGRAM])
        runs[name] = project
    done = fit(runs["uninterrupted"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pq.read_table(RunLayout(runs["uninterrupted"] / "runs/demo").step(1).rollouts).to_pylist()
    answered = sum(any(call["turn"] == 1 for call in json.loads(row["tool_calls"])) for row in rows)
    assert answered > 0, "the program's model called no tool"
    kill = f"{AGENT_KILL}@{answered + 1}"  # each result a program sends back reaches it once: step 2's first
    assert killed_and_resumed(runs["killed"], [kill], STEPS) == "resumed to the reference"
    assert final_policy(runs["killed"]) == final_policy(runs["uninterrupted"])
    assert sampled(runs["killed"]) == sampled(runs["uninterrupted"])


def sampled(project) -> list[list[dict]]:
    """Each step's rollouts as sampled (their tokens, mask and log-probs; not the tools' timings)."""
    columns = ["prompt_ids", "response_ids", "response_mask", "rollout_logprobs", "final_text"]
    layout = RunLayout(project / "runs/demo")
    return [pq.read_table(layout.step(step).rollouts, columns=columns).to_pylist() for step in range(1, STEPS + 1)]
