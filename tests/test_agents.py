"""Agent rollouts (rlx.agents): the call format, tool faults, environments, the mask through the loss,
and one multi-turn rollout through the real transformers backend and the rollout stage."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlx.agents.calls import run_chains
from rlx.agents.format import parse_calls, render_tool_turn, shown_results, tool_turn_ids, tool_turns_ids, turn_frame
from rlx.agents.loop import AgentLoop, reset_row, tool_use
from rlx.agents.tools import open_session
from rlx.algo import advantages
from rlx.algo.losses import policy_loss
from rlx.config import AgentLoopConfig, JudgerConfig, SampleParams
from rlx.errors import UserError
from rlx.judgers import Panel
from rlx.judgers.rows import judge_rows
from rlx.samplers.types import Generation
from rlx.training.microbatch import response_mask
from rlx.training.trainer import TokenBatch


@pytest.fixture(scope="module")
def tokenizer(untrained_model):
    return AutoTokenizer.from_pretrained(untrained_model[0].tiny_model.output_dir)


def test_tool_calls_are_read_in_order_and_each_mistake_is_named():
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> then '
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call><tool_call>{oops}</tool_call>'
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call><tool_call>{"name": "add", "arguments": {}}'
    )
    calls = [(c.name, c.arguments, c.problem) for c in parse_calls(text, {"add"})]
    assert calls == [
        ("add", {"a": 1, "b": 2}, None),
        ("", {}, "unreadable tool call (arguments must be an object, got list)"),
        ("", {}, "unreadable tool call (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ("rm", {}, "unknown tool 'rm'; tools: add"),
        ("add", {}, "unreadable tool call (no </tool_call>)"),
    ]
    assert parse_calls("#### 12", {"add"}) == []


def test_a_tool_that_raises_hangs_or_answers_wrongly_runs_no_longer_than_its_deadline(tokenizer):
    """Chains of different rollouts run together; in a chain, a call past the deadline stops the calls after it."""
    from helpers import agents

    started = time.perf_counter()
    (ok, bug), (slow, after), (asleep,) = run_chains(
        [
            [lambda: agents.add(2, 3), lambda: agents.broken("x")],
            [lambda: agents.sleepy(30), lambda: agents.add(1, 1)],
            [lambda: agents.sleepy(0.2)],
        ],
        timeout=0.3,
    )
    assert time.perf_counter() - started < 1.0
    assert (ok.value, ok.error, bug.error) == ("5", None, "RuntimeError: tool bug")
    assert (slow.error, slow.timed_out, slow.seconds) == ("timeout: no result within 0.3 s", True, 0.3)
    assert (after.error, after.timed_out) == ("not run: an earlier call of this turn timed out", False)
    assert asleep.value == "awake" and 0.2 <= asleep.seconds < 0.3
    not_text, short, failed = shown_results(tokenizer, [(42, None), ("7", None), (None, "ValueError: no")], 64)
    assert not_text == ("Error: the tool returned int, not text", "the tool returned int, not text")
    assert (short, failed) == (("7", None), ("Error: ValueError: no", "ValueError: no"))
    (text, error), (kept, _) = shown_results(tokenizer, [("1234567890", None), ("1234", None)], 4)
    note = "output cut to 4 of 10 tokens (agent_loop_config.max_tool_response_tokens)"  # digits: one token each
    assert (text, error, kept) == (f"1234 [Error: {note}]", note, "1234")


def test_a_tools_huge_answer_or_error_is_cut_in_characters_before_any_work_on_it(tokenizer):
    """A 20 MB result costs what its first tokens cost, and a 20 MB error message is kept as 2,000 characters."""
    from rlx.agents.format import longest_token
    from rlx.errors import MESSAGE_CHARS

    huge = "7" * 20_000_000

    def flood():
        raise ValueError(huge)

    began = time.perf_counter()
    ((raised,),) = run_chains([[flood]], timeout=5.0)
    (text, error), (shown, kept) = shown_results(tokenizer, [(huge, None), (None, raised.error)], 4)
    assert time.perf_counter() - began < 2.0
    digits = 4 * longest_token(tokenizer) + 1  # one token each: what was kept of the 20,000,000 characters
    note = f"output cut to 4 of at least {digits} tokens (agent_loop_config.max_tool_response_tokens)"
    assert (text, error) == (f"7777 [Error: {note}]", note)
    assert raised.error == f"ValueError: {'7' * MESSAGE_CHARS}... (20,000,000 characters)" and kept == raised.error
    assert shown.startswith("Error") and len(shown) < 200  # cut to 4 tokens too


def test_tool_threads_are_kept_for_the_next_turn_and_a_hung_one_holds_up_none(monkeypatch):
    """A turn's chains run on the threads the turn before left idle; a thread stuck in a hung tool is
    not given another call, so the next turn starts one more; idle threads end after IDLE_S."""
    from helpers import agents
    from rlx.agents import calls

    monkeypatch.setattr(calls, "THREADS", calls.DaemonThreads("rlx-tool-test"))
    monkeypatch.setattr(calls, "IDLE_S", 0.5)
    tools = lambda: [t for t in threading.enumerate() if t.name == "rlx-tool-test"]  # noqa: E731
    run_chains([[lambda: agents.sleepy(0.05)] for _ in range(4)], timeout=1.0)
    assert len(tools()) == 4
    (hung,), *quick = run_chains([[lambda: agents.sleepy(1.0)], *[[agents.pause]] * 3], timeout=0.2)
    assert hung.timed_out and [outcome.value for (outcome,) in quick] == ["ok"] * 3
    assert len(tools()) == 4  # the same four threads
    (after,) = run_chains([[agents.pause]] * 4, timeout=1.0)[0]
    assert after.value == "ok" and len(tools()) == 5  # three idle, the hung one busy: one started
    time.sleep(1.6)  # the hung tool has ended, every thread idle past IDLE_S
    assert tools() == []


def test_async_tools_wait_together_on_one_event_loop_and_are_cancelled_past_their_deadline(monkeypatch):
    """64 async calls of 50 ms take no thread each and end together; a hung one is cancelled at its deadline
    and the calls after it are skipped; a bug is the call's error; in a chain with a plain tool, the async
    call still runs on the loop."""
    from helpers import agents, async_agents
    from rlx.agents import calls

    monkeypatch.setattr(calls, "THREADS", calls.DaemonThreads("rlx-tool-test"))
    session = open_session(AgentLoopConfig(tools=["helpers.async_agents:where"]).toolbox(), {})
    started = time.perf_counter()
    outcomes = run_chains([[async_agents.pause]] * 64 + [[session.job("where", {})]], timeout=5.0)
    assert time.perf_counter() - started < 1.0
    assert [o.value for (o,) in outcomes] == ["ok"] * 64 + ["rlx-tool-loop"]
    assert not [t for t in threading.enumerate() if t.name == "rlx-tool-test"]
    label = f"hung-{time.monotonic()}"
    (hung, skipped), (bug,), (plain, mixed) = run_chains(
        [
            [partial(async_agents.hang, label), async_agents.pause],
            [async_agents.broken],
            [agents.pause, async_agents.where],
        ],
        timeout=0.2,
    )
    assert (hung.timed_out, skipped.error) == (True, "not run: an earlier call of this turn timed out")
    assert bug.error == "ValueError: async tool bug"
    assert (plain.value, mixed.value) == ("ok", "rlx-tool-loop")
    deadline = time.monotonic() + 2.0
    while label not in async_agents.CANCELLED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert label in async_agents.CANCELLED


def test_a_tool_raising_systemexit_or_keyboardinterrupt_is_that_calls_error_and_later_calls_run(monkeypatch):
    """A BaseException from user code, in a thread or on the shared event loop (where it once ended the loop's
    thread, and every later async call timed out), is the call's error; the machinery stays up."""
    from helpers import agents, async_agents
    from rlx.agents import calls

    monkeypatch.setattr(calls, "LOOP", calls.EventLoopThread())
    for _ in range(2):
        (sync_exit, after), (interrupt,), (async_exit, async_after), (plain, mixed) = run_chains(
            [[agents.exits, agents.pause], [agents.interrupted], [async_agents.exits, async_agents.pause],
             [agents.pause, async_agents.exits]],
            timeout=2.0,
        )  # fmt: skip
        assert (sync_exit.error, after.value) == ("SystemExit: 3", "ok")
        assert interrupt.error == "KeyboardInterrupt: from a library"
        assert (async_exit.error, async_after.value, plain.value, mixed.error) == (
            "SystemExit: 3",
            "ok",
            "ok",
            "SystemExit: 3",
        )
        assert not any(o.timed_out for o in (sync_exit, interrupt, async_exit, async_after, mixed))


def ended(labels: list[str], within: float = 2.0) -> bool:
    """Whether every ``helpers.agents.spin`` of ``labels`` ran its cleanup within ``within`` seconds."""
    from helpers import agents

    deadline = time.monotonic() + within
    while not set(labels) <= set(agents.CLEANED) and time.monotonic() < deadline:
        time.sleep(0.01)
    return set(labels) <= set(agents.CLEANED)


def test_a_cpu_bound_call_past_its_deadline_is_stopped_and_its_thread_serves_the_next(monkeypatch, tmp_path):
    """Tools looping in Python past their deadline (one swallowing every Exception) stop: their loops stop
    counting, their ``finally`` runs, the calls after them in their chains never start, and their threads
    take the next calls; a judger past its timeout (rlx.judgers.deadline) is stopped the same way."""
    from helpers import agents
    from rlx.agents import calls
    from rlx.judgers.deadline import call_within

    monkeypatch.setattr(calls, "THREADS", calls.DaemonThreads("rlx-tool-stop"))
    monkeypatch.chdir(tmp_path)
    labels = [f"spin-{n}-{time.monotonic()}" for n in range(4)]
    outcomes = run_chains([[partial(agents.spin, label), agents.ping] for label in labels], timeout=0.2)
    assert [(first.timed_out, then.error) for first, then in outcomes] == [
        (True, "not run: an earlier call of this turn timed out")
    ] * 4
    assert ended(labels)
    counts = {label: agents.SPINS[label] for label in labels}
    time.sleep(0.1)
    assert counts == {label: agents.SPINS[label] for label in labels}
    time.sleep(0.3)
    assert not (tmp_path / agents.TOOL_LOG).exists()  # the calls after the stopped ones never ran
    pool = lambda: [t for t in threading.enumerate() if t.name == "rlx-tool-stop"]  # noqa: E731
    assert len(pool()) == 4
    assert [o.value for (o,) in run_chains([[agents.ping]] * 4, timeout=1.0)] == ["pong"] * 4
    assert len(pool()) == 4  # the stopped calls' threads took them
    label = f"judger-{time.monotonic()}"
    assert call_within(0.2, agents.spin, label) == (0.0, None, "timeout: no score within 0.2 s")
    assert ended([label])


def test_a_call_past_its_deadline_that_python_cannot_stop_yet_is_named(monkeypatch, caplog):
    """A call blocked in C (here a sleep) is stopped only when it returns: meanwhile a warning names it; then
    it ends without running the rest of its chain."""
    from helpers import agents
    from rlx.agents import calls, stopping

    monkeypatch.setattr(calls, "THREADS", calls.DaemonThreads("rlx-tool-stop"))
    ((blocked, skipped),) = run_chains([[partial(agents.sleepy, 1.5), agents.pause]], timeout=0.1)
    assert (blocked.timed_out, skipped.error) == (True, "not run: an earlier call of this turn timed out")
    assert "sleepy" in stopping.still_running(grace=0.0)
    time.sleep(0.1)
    stopping.warn_still_running()
    assert "sleepy" not in caplog.text  # the grace (1 s) is not over (earlier tests' hung calls may be named)
    time.sleep(1.0)
    stopping.warn_still_running()
    assert re.search(r"call\(s\) given up at their deadline still run \([^)]*\bsleepy\b", caplog.text)
    deadline = time.monotonic() + 2.0
    while "sleepy" in stopping.still_running(grace=0.0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "sleepy" not in stopping.still_running(grace=0.0)


def test_a_tool_past_its_deadline_on_an_event_loop_leaves_its_thread_unharmed(monkeypatch):
    """LMDeploy's driver waits on a turn's calls from its event loop, which cancels the future it gives up
    on; the tool's thread, ending later, must not fail setting it (it once did, with InvalidStateError)."""
    import asyncio

    from helpers import agents
    from rlx.agents.calls import Chain

    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    outcomes = asyncio.run(Chain([lambda: agents.sleepy(0.2), agents.pause]).outcomes_async(0.05))
    assert [o.timed_out for o in outcomes] == [True, False]
    time.sleep(0.4)
    assert failures == []


def test_tool_results_follow_the_model_turn_as_the_chat_template_renders_them(tokenizer):
    """After the model's end-of-turn token: the newline the template writes, the tool message, the next prompt."""
    ids = tool_turn_ids(tokenizer, [{"role": "tool", "name": "add", "content": "5"}])
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


CONTENTS = ["5", "", " two\nlines ", "{{ not jinja }}", "<tool_response>", "émoji 🧮"]
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


@pytest.mark.parametrize("template", ["tiny", "qwen2_5", "qwen3", "trimming"])
def test_a_tool_turn_is_the_template_s_own_rendering_of_its_messages(tokenizer, template):
    """The turn's frame is rendered once and the contents put in: the ids are those of rendering each turn,
    for one result or two, with the demo's template and Qwen's (Qwen3's renders a last model turn with an
    empty think block); a template that trims the content is rendered each time."""
    tokenizer = copy.deepcopy(tokenizer)
    if template == "trimming":
        tokenizer.chat_template = tokenizer.chat_template.replace("message['content']", "(message['content'] | trim)")
        assert "| trim" in tokenizer.chat_template
    elif template != "tiny":
        tokenizer.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    pairs = zip(CONTENTS, CONTENTS[::-1], strict=True)
    turns = [[{"role": "tool", "name": "add", "content": c}] for c in CONTENTS]
    turns += [[{"role": "tool", "content": a}, {"role": "tool", "name": "x", "content": b}] for a, b in pairs]
    rendered = [render_tool_turn(tokenizer, messages) for messages in turns]
    assert tool_turns_ids(tokenizer, turns) == [tokenizer.encode(text, add_special_tokens=False) for text in rendered]
    assert (turn_frame(tokenizer, ((("role", "tool"), ("name", "add")),)) is None) == (template == "trimming")
    qwen = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert rendered[0] == (
        qwen if template.startswith("qwen") else "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("environment", ["helpers.agents:Counter", "helpers.async_agents:AsyncCounter"])
def test_an_environment_is_made_per_rollout_its_methods_are_the_tools_and_its_reward_a_judger(tokenizer, environment):
    config = AgentLoopConfig(environment=environment, max_turns=2)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=400))
    assert [s["function"]["name"] for s in loop.toolbox.schemas] == ["increment"]
    first, second = (loop.start(reset_row("count", [{"role": "user", "content": "?"}], "3"), [0]) for _ in range(2))
    assert tokenizer.decode(first.prompt_ids) == "<|im_start|>user\nCount to 3.<|im_end|>\n<|im_start|>assistant\n"
    call = '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call><|im_end|>'
    for trajectory, by in ((first, 2), (second, 5)):
        ids = tokenizer.encode(call.replace('"by": 2', f'"by": {by}'), add_special_tokens=False)
        calls = loop.take_turn(trajectory, Generation([], ids, "", [-1.0] * len(ids), "stop"))
        loop.add_results([(trajectory, calls, loop.chain(trajectory, calls).outcomes(config.tool_timeout))])
        answer = tokenizer.encode("done<|im_end|>", add_special_tokens=False)
        assert loop.take_turn(trajectory, Generation([], answer, "done", [-1.0] * len(answer), "stop")) == []
    loop.finish([first, second])
    assert [(t.reward, t.turns, t.finish_reason, t.final_text) for t in (first, second)] == [
        (2.0, 2, "stop", "done"),
        (5.0, 2, "stop", "done"),
    ]
    assert [json.loads(t.columns()["tool_calls"])[0]["result"] for t in (first, second)] == ["2", "5"]
    judgers = JudgerConfig(
        reward_judger_configs=[{"judger_name": "environment", "data_source": ["count"], "weight": 2}]
    )
    verdicts = Panel(judgers).judge_many([("done", "count", "3", first.columns()), ("done", "count", "3", {})])
    assert [(v.reward, v.error) for v in verdicts] == [
        (4.0, None),
        (
            0.0,
            "environment: ValueError: no environment_reward: the row was not made by an agent_loop_config.environment",
        ),
    ]


def test_an_environment_whose_reset_fails_scores_that_rollout_0_and_the_run_goes_on(untrained_model, tokenizer):
    """A user's reset that raises is the environment's fault, like a tool's: counted, the rollout scored 0
    with the error kept; only when it fails on every row is it the run's end, in one line."""
    from rlx.samplers import TransformersSampler
    from rlx.training.loading import load_policy

    cfg = untrained_model[0]
    config = AgentLoopConfig(environment="helpers.agents:Picky", max_turns=2)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=4))
    rows = [reset_row("count", [{"role": "user", "content": "?"}], gold) for gold in ("3", "-1")]
    sampler = TransformersSampler(load_policy(cfg.tiny_model.output_dir), tokenizer, cfg.rollout_config)
    ran = loop.run(sampler, [loop.start(row, [0]) for row in rows], seed=0)
    assert [(t.finish_reason == "reset_failed", t.turns) for t in ran] == [(False, 1), (True, 0)]
    assert (ran[1].response_ids, ran[1].reward) == ([], None)
    assert ran[1].reward_error == "reset failed (ValueError: cannot count to -1)"
    produced = [{"data_source": "count", "ground_truth": r["ground_truth"], "response_len": len(t.response_ids),
                 "finish_reason": t.finish_reason, **t.columns()} for r, t in zip(rows, ran, strict=True)]  # fmt: skip
    judgers = JudgerConfig(reward_judger_configs=[{"judger_name": "environment", "data_source": ["count"]}])
    judged = judge_rows(Panel(judgers), produced, "final_text")
    assert [(j["reward"], j["error"]) for j in judged] == [
        (0.0, None),  # the counter's reward: nothing counted in 4 tokens
        (0.0, "environment: reset failed (ValueError: cannot count to -1)"),
    ]
    assert tool_use(produced, "agent")["agent/environment_errors"] == 1
    with pytest.raises(UserError) as failed:
        loop.run(sampler, [loop.start(rows[1], [0]) for _ in range(2)], seed=0)
    assert str(failed.value) == (
        "agent_loop_config.environment: reset failed (ValueError: cannot count to -1), on every prompt row"
    )


@pytest.mark.parametrize("environment", ["helpers.agents:Stuck", "helpers.async_agents:AsyncStuck"])
def test_an_environment_whose_reset_hangs_or_exits_fails_its_rollout_at_the_deadline(tokenizer, environment):
    """Every environment is made and reset at once, under tool_timeout: one that never returns (or raises
    SystemExit) fails its own rollout, counted; the rest start, all within about one deadline."""
    config = AgentLoopConfig(environment=environment, max_turns=2, tool_timeout=0.3)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=16))
    rows = [reset_row("count", [{"role": "user", "content": "?"}], gold) for gold in ("hang", "3", "exit", "hang")]
    began = time.perf_counter()
    started = loop.starts(rows, [[0]] * len(rows))
    assert time.perf_counter() - began < 1.5
    assert [t.finish_reason == "reset_failed" for t in started] == [True, False, True, True]
    assert [t.reward_error for t in started] == [
        "reset failed (timeout: no result within 0.3 s)", None,
        f"reset failed ({'RuntimeError: ' if 'async' in environment else ''}SystemExit: 1)",
        "reset failed (timeout: no result within 0.3 s)",
    ]  # fmt: skip
    assert tokenizer.decode(started[1].prompt_ids).startswith("<|im_start|>user\nCount to 3.")


def test_the_loss_and_the_advantages_length_terms_read_only_the_model_tokens():
    """Two responses of 4 tokens; the first has 2 tool tokens in the middle (mask 1 0 0 1)."""
    rows = [
        {"response_len": 4, "response_mask": [1, 0, 0, 1]},
        {"response_len": 4, "response_mask": [1, 1, 1, 1]},
    ]
    assert response_mask(rows).tolist() == [[1, 0, 0, 1], [1, 1, 1, 1]]
    # OPO's length-weighted baseline: lengths 2 and 4, rewards 1 and 0 -> baseline 1/3
    opo = advantages.compute("opo", torch.tensor([1.0, 0.0]), 2, mask=response_mask(rows))
    assert torch.allclose(opo, torch.tensor([2 / 3, -1 / 3]))
    batch = TokenBatch.from_ids([[7, 8], [7, 8]], [[1, 2, 3, 4], [1, 2, 3, 4]], 0, [r["response_mask"] for r in rows])
    assert batch.mask.tolist() == [[0, 1, 0, 0, 1], [0, 1, 1, 1, 1]] and batch.num_tokens == 6
    logp = torch.full((2, 5), -1.0)
    wild = logp.clone()
    wild[0, 2:4] = 5.0  # the tool tokens' log-probs: whatever they are, the loss does not see them
    for values in (logp, wild):
        loss, _ = policy_loss(values, logp, torch.tensor([1.0, -1.0]), batch.mask, global_tokens=6)
        assert loss.item() == pytest.approx((-2 * 1.0 + 4 * 1.0) / 6)


@pytest.fixture(scope="module")
def taught(untrained_model, tmp_path_factory):
    """The folder of the model taught one rollout (:func:`taught_to_call`), its prompt and pieces."""
    folder = tmp_path_factory.mktemp("taught") / "model"
    return folder, *taught_to_call(untrained_model, folder)


def taught_to_call(untrained_model, folder):
    """The untrained model taught one rollout by heart: call ``add`` (the call spelled character by
    character: ids the tokenizer would merge if the text were encoded again), read the result, answer.
    Returns the prompt's ids and the rollout's three pieces of ids."""
    from helpers.teaching import teach
    from rlx.tokens import prompt_ids

    cfg = untrained_model[0]
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call = [i for character in '<tool_call>{"name": "add", "arguments": {"a": 4, "b": 5}}</tool_call>'
            for i in encode(character)]  # fmt: skip
    pieces = ([*call, tokenizer.eos_token_id], tool_turn_ids(tokenizer, [{"role": "tool", "content": "9"}]))
    pieces += ([*encode("#### 9"), tokenizer.eos_token_id],)
    prompt = prompt_ids(tokenizer, [{"role": "user", "content": "4 + 5?"}])
    teach(cfg.tiny_model.output_dir, folder, [(prompt, list(pieces))], steps=60)
    return prompt, pieces


@pytest.mark.parametrize("in_a_cell", [False, True], ids=["in a script", "where an event loop runs (a notebook)"])
def test_each_turn_goes_on_from_the_ids_of_the_turn_before_byte_for_byte(untrained_model, taught, tokenizer, in_a_cell):
    """No re-tokenization (TRL #5224): the input of turn 2 starts with the very ids of turn 1's input and
    its sampled reply, though this tokenizer, decoding and encoding them again, would merge them. The same
    from code that an event loop runs already, as a notebook's kernel runs a cell."""
    from helpers.agents import Recorded
    from rlx.samplers import TransformersSampler
    from rlx.training.loading import load_policy

    folder, prompt, (call, tool, _) = taught
    config = AgentLoopConfig(tools=["helpers.agents:add"], max_turns=2)
    loop = AgentLoop(config, tokenizer, SampleParams(max_tokens=120, temperature=0))
    sampler = Recorded(TransformersSampler(load_policy(folder), tokenizer, untrained_model[0].rollout_config))
    starts = [loop.start(reset_row("rlx/arith", [], "9"), prompt)]

    async def cell():
        return loop.run(sampler, starts, seed=3)

    (rollout,) = asyncio.run(cell()) if in_a_cell else loop.run(sampler, starts, seed=3)
    assert (rollout.turns, rollout.finish_reason, rollout.final_text) == (2, "stop", "#### 9")
    first, second = (prompts[0] for prompts, _, _ in sampler.calls)
    as_bytes = lambda ids: torch.tensor(ids, dtype=torch.int64).numpy().tobytes()  # noqa: E731
    assert as_bytes(second[: len(first)]) == as_bytes(first) == as_bytes(prompt)
    assert second == prompt + call + tool
    assert tokenizer.encode(tokenizer.decode(prompt + call), add_special_tokens=False) != prompt + call


def test_a_multi_turn_rollout_keeps_the_sampled_ids_and_trains_on_the_model_tokens_only(
    untrained_model, taught, tmp_path
):
    """Through the real transformers backend and the rollout stage: the turns' ids are never re-tokenized
    (the ids of each turn's input start the next one's, even where decoding and encoding again would
    change them), tool tokens are 0 in the mask with no log-prob, the trainer's log-probs of the model's
    tokens equal the rollout's, judgers score the final answer, and the tools' use is counted."""
    from conftest import demo_config
    from rlx.engines import Engines
    from rlx.explore import segments
    from rlx.judgers.rows import judge_rollouts
    from rlx.stages.rollout import sample_groups
    from rlx.training.trainer import token_logprobs
    from rlx.workers.home import place_policy

    folder, prompt, (call, tool, answer) = taught
    config = demo_config(
        tmp_path,
        f"load_from={folder}",
        f"tokenizer_path={folder}",
        f"work_dir={tmp_path / 'run'}",
        "dataflow_config.prompt_repeat_k=2",
        "dataflow_config.sample_params.temperature=0",
        "dataflow_config.sample_params.max_tokens=120",
        "dataflow_config.agent_loop_config.tools=[helpers.agents:add]",
    )
    engines = place_policy(Engines(config))
    group = {"group": 0, "data_source": "rlx/arith", "ground_truth": "9", "prompt_ids": prompt,
             "prompt": json.dumps([{"role": "user", "content": "4 + 5?"}])}  # fmt: skip
    rows = sample_groups(config, 1, engines, [group], seed=3)
    row = rows[0]
    assert row["response_ids"] == call + tool + answer
    assert row["response_mask"] == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    assert segments(row["response_ids"], row["response_mask"]) == [(1, call), (0, tool), (1, answer)]  # Run.turns
    tokenizer = engines.tokenizer
    context = prompt + call
    assert (
        tokenizer.encode(tokenizer.decode(context), add_special_tokens=False) != context
    )  # re-tokenizing would change it
    assert [p is None for p in row["rollout_logprobs"]] == [m == 0 for m in row["response_mask"]]
    assert (row["turns"], row["finish_reason"], row["final_text"]) == (2, "stop", "#### 9")
    calls = json.loads(row["tool_calls"])
    assert [(c["tool"], json.loads(c["arguments"]), c["result"], c["error"]) for c in calls] == [
        ("add", {"a": 4, "b": 5}, "9", None)
    ]
    batch = TokenBatch.from_ids([prompt], [row["response_ids"]], tokenizer.pad_token_id, [row["response_mask"]])
    trained, _ = token_logprobs(engines.policy(0), batch)
    scored = trained[batch.mask > 0]
    sampled = torch.tensor([p for p in row["rollout_logprobs"] if p is not None])
    assert torch.allclose(scored, sampled, atol=1e-4)
    assert [j["reward"] for j in judge_rollouts(config, Panel(config.judger_config), rows)] == [1.0, 1.0]
    assert tool_use(rows, "agent") == {
        "agent/turns/mean": 2.0, "agent/tool_calls": 2, "agent/tool_call_frac": 1.0, "agent/tool_errors": 0,
        "agent/tool_timeouts": 0, "agent/max_turns_frac": 0.0, "agent/environment_errors": 0,
    }  # fmt: skip


def test_the_calculator_computes_exactly_and_runs_no_code():
    from rlx.tasks.calculator import calculator, expression

    assert [calculator(e) for e in ("4821 + 3977", "(12 - 4.5) / 3", "10 / 4 * 2", "1 / 3")] == [
        "8798",
        "2.5",
        "5",
        "0.3333333333",
    ]
    for bad in ("2 ** 3", "__import__('os')", "x"):
        with pytest.raises(ValueError, match="only numbers"):
            calculator(bad)
    assert expression("5 + 3 = 8\n8 * 2 = 16\n#### 16") == "(5 + 3) * 2"
