"""The agent loop, token in and token out: generate until a tool call or an answer, run the calls,
append their results as tokens, and go on until an answer, ``max_turns`` or the response budget
(``sample_params.max_tokens``, which counts the tool tokens too, as XTuner's loop does).

A rollout is a :class:`Trajectory`: its response ids with a mask (1 for the model's tokens, 0 for
the tool results' tokens, which the loss, the KL and the importance weights skip), the model tokens'
log-probs, the turns and every call. :class:`AgentLoop` holds the turn logic and drives every sampler
the same way (as verl's agent loop drives its server manager): each rollout is a conversation on one
event loop, and a rollout waiting for its tools holds up no other. The sampler only generates;
:class:`TurnRequests` sends it the turns as it serves them best: each at once to LMDeploy, which
batches continuously, or one batch per turn to the transformers backend and worker groups.

Turn 0 of row ``i`` samples from seed ``seed + i``, as a single-turn rollout does; turn ``t`` from
``derive(seed + i, t)``: a rollout depends on its prompt, the policy, its seed and its tools' results.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from numbers import Real

from rlx import seeds
from rlx.agents.calls import Chain, Outcome, run_chains
from rlx.agents.format import ToolCall, parse_calls, shown_results, tool_turns_ids
from rlx.agents.stopping import warn_still_running
from rlx.agents.tools import Session, open_session
from rlx.config import AgentLoopConfig, SampleParams
from rlx.errors import UserError
from rlx.samplers.types import Generation
from rlx.store import faults
from rlx.tokens import decode, decode_many, prompt_ids

RESET_FAILED = "reset_failed"  # the finish of a rollout whose environment could not start: no turn, scored 0
PROGRAM_FAILED = "program_failed"  # the finish of a rollout whose agent program failed (rlx.agents.programs): scored 0
FAILED = {RESET_FAILED: "environment", PROGRAM_FAILED: "program"}  # the judgment's error names what failed


def turn_seed(row_seed: int, turn: int) -> int:
    return row_seed if turn == 0 else seeds.derive(row_seed, turn)


@dataclass
class Trajectory:
    """One multi-turn rollout; ``finish_reason`` is None while it goes on, then ``stop`` (an answer),
    ``length`` (the response budget ran out), ``max_turns`` (a call in the last allowed turn) or
    ``reset_failed`` (its environment's ``reset`` raised: no turn at all, ``reward_error`` says why)."""

    prompt_ids: list[int]
    session: Session
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)  # None for a tool token: not the model's
    calls: list[dict] = field(default_factory=list)
    turns: int = 0
    finish_reason: str | None = None
    final_text: str = ""  # the model's last turn: what judgers score
    text: str = ""  # the whole response, tool results included
    reward: float | None = None  # the environment's reward(), if it has one
    reward_error: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def context(self) -> list[int]:
        """The ids the next turn continues: the prompt and every turn so far, never re-tokenized."""
        return [*self.prompt_ids, *self.response_ids]

    def append(self, ids: list[int], mask: int, logprobs: list[float | None]) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.logprobs += logprobs

    def columns(self) -> dict:
        """The columns rollouts.parquet adds for an agent's rollout."""
        return {
            "response_mask": self.response_mask,
            "final_text": self.final_text,
            "turns": self.turns,
            "tool_calls": json.dumps(self.calls),
            "environment_reward": self.reward,
            "environment_error": self.reward_error,
        }


def reset_row(data_source: str, prompt: list[dict], ground_truth: str) -> dict:
    """What an environment's ``reset`` and the prompt are made from: the prompt row's data source, chat
    messages and gold answer."""
    return {"data_source": data_source, "prompt": prompt, "ground_truth": ground_truth}


class AgentLoop:
    """The turn logic of ``dataflow_config.agent_loop_config`` for rollouts sampled with ``params``."""

    def __init__(self, config: AgentLoopConfig, tokenizer, params: SampleParams):
        self.config, self.tokenizer, self.params = config, tokenizer, params
        self.toolbox = config.toolbox()
        self.known = set(self.toolbox.functions)

    def start(self, row: dict, ids: list[int]) -> Trajectory:
        """A rollout of the prompt ``row`` (rlx.agents.loop.reset_row), whose rendered ``ids`` it starts
        from unless its environment's ``reset`` gives another conversation."""
        return self.starts([row], [ids])[0]

    def starts(self, rows: list[dict], ids: list[list[int]]) -> list[Trajectory]:
        """:meth:`start` for many rows. Their environments are made and reset all at once, each under
        ``tool_timeout``: user code, which may raise, hang or exit; such a rollout fails (counted, scored 0)
        and the others go on."""
        if self.toolbox.environment is None:
            return [
                Trajectory(list(row_ids), open_session(self.toolbox, row))
                for row, row_ids in zip(rows, ids, strict=True)
            ]
        made = run_chains([[partial(open_session, self.toolbox, row)] for row in rows], self.config.tool_timeout)
        return [self.started(outcome, row_ids) for (outcome,), row_ids in zip(made, ids, strict=True)]

    def started(self, made: Outcome, ids: list[int]) -> Trajectory:
        if made.error is not None:
            error = f"reset failed ({made.error})"
            return Trajectory(list(ids), Session({}, None, None), finish_reason=RESET_FAILED, reward_error=error)
        session = made.value
        if session.start is not None:
            messages = [{"role": "user", "content": session.start}] if isinstance(session.start, str) else session.start
            ids = prompt_ids(self.tokenizer, messages, self.toolbox.schemas)
        return Trajectory(list(ids), session)

    def budget(self, trajectory: Trajectory) -> int:
        return self.params.max_tokens - len(trajectory.response_ids)

    def take_turn(self, trajectory: Trajectory, generation: Generation, raw: str | None = None) -> list[ToolCall]:
        """Append the model's turn; the calls to run next, none when the rollout ends with it. ``raw``: the
        turn decoded with its special tokens, where the caller decoded the turns of a batch together."""
        budget = self.budget(trajectory)
        ids = generation.response_ids[:budget]
        cut = len(ids) < len(generation.response_ids)
        trajectory.append(ids, 1, generation.logprobs[:budget])
        trajectory.turns += 1
        trajectory.final_text = generation.text if not cut else self.decode(ids)
        if cut or generation.finish_reason == "length":
            trajectory.finish_reason = "length"
            return []
        if raw is None:
            raw = decode(self.tokenizer, ids, skip_special_tokens=False)
        calls = parse_calls(raw, self.known)
        if not calls:
            trajectory.finish_reason = generation.finish_reason
        elif trajectory.turns >= self.config.max_turns:
            trajectory.finish_reason = "max_turns"
        return [] if trajectory.done else calls

    def chain(self, trajectory: Trajectory, calls: list[ToolCall]) -> Chain:
        """The calls that can run, started in the order the model wrote them."""
        return Chain([trajectory.session.job(call.name, call.arguments) for call in calls if call.problem is None])

    def add_results(self, turns: list[tuple[Trajectory, list[ToolCall], list[Outcome]]]) -> None:
        """Append each rollout's tool messages of its turn (the ``calls`` that could not run carry their
        problem; the others' ``ran`` outcomes, in order) as tokens; the turns' texts are encoded together."""
        outcomes = [every_outcome(calls, ran) for _, calls, ran in turns]
        limit = self.config.max_tool_response_tokens
        shown = iter(shown_results(self.tokenizer, [(o.value, o.error) for turn in outcomes for o in turn], limit))
        messages = [self.record_calls(t, calls, ran, shown) for (t, calls, _), ran in zip(turns, outcomes, strict=True)]
        for (trajectory, _, _), ids in zip(turns, tool_turns_ids(self.tokenizer, messages), strict=True):
            ids = ids[: self.budget(trajectory)]
            trajectory.append(ids, 0, [None] * len(ids))
            faults.point("agent.tool_results")
            if self.budget(trajectory) <= 0:
                trajectory.finish_reason = "length"

    def record_calls(self, trajectory: Trajectory, calls: list[ToolCall], ran: list[Outcome], shown) -> list[dict]:
        """Record the turn's calls in ``trajectory.calls``; their tool messages, with ``shown`` texts."""
        messages = []
        for call, outcome in zip(calls, ran, strict=True):
            text, error = next(shown)
            messages.append({"role": "tool", "name": call.name, "content": text})
            arguments = call.raw if call.problem else json.dumps(call.arguments)
            trajectory.calls.append(
                call_record(trajectory.turns, call.name, arguments, text, error, outcome.timed_out, outcome.seconds)
            )
        return messages

    def finish(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Decode each whole response and take each environment's ``reward()`` (under the tool deadline)."""
        scored = [t for t in trajectories if t.session.has_reward()]
        results = run_chains([[t.session.environment.reward] for t in scored], self.config.tool_timeout)
        for trajectory, (outcome,) in zip(scored, results, strict=True):
            trajectory.reward, trajectory.reward_error = number(outcome)
        return with_texts(self.tokenizer, trajectories, self.params.skip_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return decode(self.tokenizer, ids, self.params.skip_special_tokens)

    def run(self, sampler, trajectories: list[Trajectory], seed: int) -> list[Trajectory]:
        """Every rollout to its end, each its own conversation with ``sampler``. A failed ``reset`` costs
        its rollout a score of 0; one that fails on every row is the run's end."""
        if trajectories and all(t.finish_reason == RESET_FAILED for t in trajectories):
            raise UserError(f"agent_loop_config.environment: {trajectories[0].reward_error}, on every prompt row")
        run_to_end(self.converse_all(sampler, trajectories, seed))
        finished = self.finish(trajectories)
        warn_still_running()
        return finished

    async def converse_all(self, sampler, trajectories: list[Trajectory], seed: int) -> None:
        live = [(index, t) for index, t in enumerate(trajectories) if not t.done]  # done: its reset failed
        turns = TurnRequests(sampler, self.tokenizer, len(live))
        await asyncio.gather(*(self.converse(turns, index, t, seed + index) for index, t in live))

    async def converse(self, turns: TurnRequests, index: int, trajectory: Trajectory, row_seed: int) -> None:
        """One rollout, turn by turn: its ids go in whole (never re-tokenized), the turn's ids and log-probs
        come back, its calls run (awaited: other rollouts go on meanwhile), their results go in as ids."""
        try:
            while not trajectory.done:  # take_turn ends it at an answer, max_turns or the budget's end
                params = self.params.model_copy(update={"max_tokens": self.budget(trajectory)})
                seed = turn_seed(row_seed, trajectory.turns)
                generation, raw = await turns.generate(index, trajectory.context(), params, seed)
                if calls := self.take_turn(trajectory, generation, raw):
                    outcomes = await self.chain(trajectory, calls).outcomes_async(self.config.tool_timeout)
                    self.add_results([(trajectory, calls, outcomes)])
        finally:
            turns.leave()


class TurnRequests:
    """The rollouts' requests for their next turn, sent to the sampler: each at once where it batches
    continuously (LMDeploy), or else together once every rollout still going waits, one batch per turn,
    in row order (the transformers backend and worker groups generate best in batches). A batch is sampled
    with the largest budget among its rows; each row takes only its own (AgentLoop.take_turn)."""

    def __init__(self, sampler, tokenizer, going: int):
        self.sampler, self.tokenizer, self.going = sampler, tokenizer, going
        self.waiting: list[tuple[int, list[int], SampleParams, int, asyncio.Future]] = []

    async def generate(self, index: int, ids: list[int], params: SampleParams, seed: int) -> tuple[Generation, str]:
        """Row ``index``'s turn from ``ids``, with its text decoded with the special tokens (to find calls)."""
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append((index, ids, params, seed, answer))
        self.send_if_due()
        return await answer

    def leave(self, index: int | None = None) -> None:
        """A rollout has ended: the others no longer wait for it. ``index``: a rollout that may end with a turn
        still asked for (an agent program given up at its deadline), whose request is dropped."""
        if index is not None:
            for request in [request for request in self.waiting if request[0] == index]:
                self.waiting.remove(request)
                request[-1].cancel()
        self.going -= 1
        self.send_if_due()

    def send_if_due(self) -> None:
        if self.waiting and (self.sampler.continuous_batching or len(self.waiting) == self.going):
            batch, self.waiting = sorted(self.waiting, key=lambda request: request[0]), []
            longest = max(params.max_tokens for _, _, params, _, _ in batch)
            params = batch[0][2].model_copy(update={"max_tokens": longest})
            sent = self.sampler.submit([ids for _, ids, *_ in batch], params, seed=[seed for *_, seed, _ in batch])
            asyncio.wrap_future(sent).add_done_callback(partial(self.answer, [answer for *_, answer in batch]))

    def answer(self, answers: list[asyncio.Future], sent: asyncio.Future) -> None:
        if sent.exception() is not None:
            for answer in answers:
                answer.set_exception(sent.exception())
            return
        generations = sent.result()
        raws = decode_many(self.tokenizer, [g.response_ids for g in generations], skip_special_tokens=False)
        for answer, generation, raw in zip(answers, generations, raws, strict=True):
            answer.set_result((generation, raw))


def run_to_end(coroutine) -> None:
    """``coroutine`` run to its end on an event loop of its own: in this thread, or in a thread of its own
    where this one runs a loop already (a notebook's kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="rlx-agents") as thread:
        thread.submit(asyncio.run, coroutine).result()


def call_record(
    turn: int, tool: str, arguments: str, result: str | None, error: str | None, timed_out: bool, seconds
) -> dict:
    """One tool call as a rollout's ``tool_calls`` keep it, whoever ran it (the loop, or an agent program)."""
    return {"turn": turn, "tool": tool, "arguments": arguments, "result": result, "error": error,
            "timed_out": timed_out, "seconds": seconds}  # fmt: skip


def with_texts(tokenizer, trajectories: list[Trajectory], skip_special_tokens: bool) -> list[Trajectory]:
    """``trajectories`` with each whole response decoded (``text``, tool results included), in one batch."""
    texts = decode_many(tokenizer, [t.response_ids for t in trajectories], skip_special_tokens)
    for trajectory, text in zip(trajectories, texts, strict=True):
        trajectory.text = text
    return trajectories


def every_outcome(calls: list[ToolCall], ran: list[Outcome]) -> list[Outcome]:
    """Each call's outcome: its problem for a call that could not run, else the next of ``ran``."""
    outcomes = iter(ran)
    return [Outcome(error=call.problem) if call.problem else next(outcomes) for call in calls]


def number(outcome: Outcome) -> tuple[float | None, str | None]:
    """An environment's reward as a float, or why it is not one (the ``environment`` judger counts it)."""
    if outcome.error is not None:
        return None, outcome.error
    if isinstance(outcome.value, bool) or not isinstance(outcome.value, Real):
        return None, f"reward() returned {outcome.value!r}, not a number"
    return float(outcome.value), None


def tool_use(rows: list[dict], prefix: str) -> dict:
    """How agents used their tools over rollout rows (or eval samples): turns, calls, the share of
    rollouts with a call, calls that failed or timed out, rollouts stopped at ``max_turns``, environments
    whose ``reset`` failed; and for an agent program's, the programs that failed, the histories they
    rewrote and the calls the endpoint refused them."""
    calls = [call for row in rows for call in json.loads(row["tool_calls"])]
    used = {
        f"{prefix}/turns/mean": sum(row["turns"] for row in rows) / len(rows),
        f"{prefix}/tool_calls": len(calls),
        f"{prefix}/tool_call_frac": sum(row["tool_calls"] != "[]" for row in rows) / len(rows),
        f"{prefix}/tool_errors": sum(call["error"] is not None for call in calls),
        f"{prefix}/tool_timeouts": sum(call["timed_out"] for call in calls),
        f"{prefix}/max_turns_frac": sum(row["finish_reason"] == "max_turns" for row in rows) / len(rows),
        f"{prefix}/environment_errors": sum(row["finish_reason"] == RESET_FAILED for row in rows),
    }
    if "segments" in rows[0]:  # an agent program's rollouts (rlx.agents.programs)
        used[f"{prefix}/program_failures"] = sum(row["finish_reason"] == PROGRAM_FAILED for row in rows)
        used[f"{prefix}/rewritten_histories"] = sum(len(json.loads(row["segments"])) for row in rows)
        used[f"{prefix}/refused_calls"] = sum(row["refused_calls"] for row in rows)
    return used
