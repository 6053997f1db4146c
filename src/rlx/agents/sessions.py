"""One agent program's conversation with the policy (``agent_loop_config.program``), token in and token out.

An OpenAI-client program sends the whole conversation with every call. The session keeps the token ids
its calls were sampled from: a call whose messages are the previous call's, then the reply it got, then
new messages (tool results, a user's turn) continues from exactly those ids, with only the new messages
rendered and tokenized (rlx.agents.format.tool_turn_ids; their tokens are context, masked out of the loss).
A call that changes what came before starts a new segment from its messages, rendered whole; the segment
before it is kept in the record and counted, never re-tokenized into the new one (BPE is not bijective:
decoded and encoded again, the ids need not be the ones sampled, TRL issue #5224).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from rlx.agents.format import parse_calls, shown_results, tool_turn_ids
from rlx.agents.loop import Trajectory, call_record
from rlx.agents.tools import Session
from rlx.samplers.types import Generation
from rlx.store import faults
from rlx.tokens import prompt_ids


def message_text(content) -> str:
    """A message's content as text: a string, None, or OpenAI's list of parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def canonical(message: dict) -> tuple:
    """What a message is, for telling whether a call's history is the one the session's ids hold: its role,
    text and tool calls (name and arguments, parsed), not the fields clients add or drop (ids, refusal, None)."""
    calls = tuple(call_key(call) for call in message.get("tool_calls") or ())
    return message["role"], message_text(message.get("content")).strip(), calls


def call_key(call: dict) -> tuple:
    """A tool call's name and arguments (as parsed JSON, keys sorted; as sent where they do not parse)."""
    function = call.get("function") or {} if isinstance(call, dict) else {}
    arguments = function.get("arguments") or "{}"
    try:
        arguments = json.dumps(json.loads(arguments), sort_keys=True)
    except (TypeError, ValueError):
        arguments = str(arguments)
    return function.get("name"), arguments


def openai_message(text: str, raw: str, tools: list[dict] | None, turn: int) -> tuple[dict, list[dict]]:
    """The model's turn as OpenAI's assistant message: ``content`` the text outside its tool calls, and each
    well-formed call to a tool the request offered in ``tool_calls``; and the calls as the record keeps them.
    A malformed call stays in the content, where the program sees what the model wrote."""
    offered = {tool["function"]["name"] for tool in tools or ()}
    calls = [call for call in parse_calls(raw, offered) if call.problem is None] if offered else []
    content = text
    for call in calls:
        content = content.replace(f"<tool_call>{call.raw}</tool_call>", "").replace(call.raw, "")
    tool_calls = [
        {
            "id": f"call_{turn}_{index}",  # the turn counts from 1, as the record's does
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for index, call in enumerate(calls)
    ]
    message = {"role": "assistant", "content": content.strip() if calls else text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    record = [  # the result, its error and seconds come with the program's next call (shown_turn); and its id
        call_record(turn, call.name, json.dumps(call.arguments), None, None, False, None) | {"id": made["id"]}
        for call, made in zip(calls, tool_calls, strict=True)
    ]
    return message, record


def shown_turn(tokenizer, messages: list[dict], calls: list[dict], limit: int, seconds: float) -> list[dict]:
    """Messages a program added, as the model is shown them (their role and text; a tool result with its
    tool's name, as the built-in loop renders it): a tool result past ``limit`` tokens cut with a note. Each
    result is kept in the record of the call it answers (by ``tool_call_id``), with its error if cut and the
    ``seconds`` the program took to send it."""
    results = [message_text(m.get("content")) for m in messages if m["role"] == "tool"]
    shown = iter(shown_results(tokenizer, [(text, None) for text in results], limit))
    by_id, turn = {call["id"]: call for call in calls}, []
    for message in messages:
        text, call = message_text(message.get("content")), by_id.get(message.get("tool_call_id"))
        if message["role"] != "tool":
            turn.append({"role": message["role"], "content": text})
            continue
        text, error = next(shown)
        if call is not None:
            call.update(result=text, error=error, seconds=seconds)
        turn.append({"role": "tool", **({"name": call["tool"]} if call else {}), "content": text})
    return turn


@dataclass
class AgentSession:
    """One (row, sample)'s conversation: its trajectory so far (the current segment), the canonical messages
    its ids hold, the segments a rewritten history left behind, and its budgets' use."""

    key: str
    row_seed: int
    tokenizer: object
    tool_limit: int  # agent_loop_config.max_tool_response_tokens
    trajectory: Trajectory | None = None
    seen: list[tuple] = field(default_factory=list)
    tools: list[dict] | None = None
    segments: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)  # each call answered: its tokens and seconds
    model_wait: float = 0.0  # seconds its calls have waited for the model, and since when one waits now
    waiting_since: float | None = None
    replied_at: float = 0.0  # when the last reply went out: a tool result's seconds count from it
    refused: int = 0  # calls the endpoint refused (malformed, other sampling, past the budget)
    failure: str | None = None  # why the trajectory scores 0 (the program raised, hung, called too often...)
    answer: str | None = None
    reward: float | None = None

    @property
    def calls(self) -> int:
        """Calls answered so far, in every segment: the session's call budget counts them all."""
        return sum(segment["turns"] for segment in self.segments) + (self.trajectory.turns if self.trajectory else 0)

    def own_seconds(self, started: float) -> float:
        """Seconds since ``started`` the program spent on its own, not waiting for the model."""
        now = time.perf_counter()
        return now - started - self.model_wait - (now - self.waiting_since if self.waiting_since else 0.0)

    @property
    def response_tokens(self) -> int:
        return len(self.trajectory.response_ids) if self.trajectory else 0

    def context(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids the next call continues: the session's own, with the new messages' tokens added, where
        ``messages`` extends the history they hold; else a new segment's prompt."""
        canon = [canonical(message) for message in messages]
        extends = len(canon) > len(self.seen) and canon[: len(self.seen)] == self.seen and tools == self.tools
        if self.trajectory is not None and extends:
            since = time.perf_counter() - self.replied_at
            new = messages[len(self.seen) :]
            added = tool_turn_ids(
                self.tokenizer, shown_turn(self.tokenizer, new, self.trajectory.calls, self.tool_limit, since)
            )
            self.trajectory.append(added, 0, [None] * len(added))
            faults.point("agent.tool_results")
        else:
            started = Trajectory(prompt_ids(self.tokenizer, messages, tools), Session({}, None, None))
            if self.trajectory is not None:
                self.segments.append(segment_record(self.trajectory))
            self.trajectory = started
        self.seen, self.tools = canon, tools
        return self.trajectory.context()

    def take(self, generation: Generation, raw: str, budget: int, seconds: float) -> dict:
        """The model's turn added to the trajectory (cut at the session's token ``budget``); its OpenAI message.
        The call is recorded: its context's and reply's token counts (the ids are the trajectory's) and the
        ``seconds`` it waited for the reply."""
        trajectory = self.trajectory
        ids = generation.response_ids[: budget - len(trajectory.response_ids)]
        context = len(trajectory.prompt_ids) + len(trajectory.response_ids)
        self.requests.append(
            {"segment": len(self.segments), "prompt_tokens": context, "response_tokens": len(ids), "seconds": seconds}
        )
        cut = len(ids) < len(generation.response_ids)
        trajectory.append(ids, 1, generation.logprobs[: len(ids)])
        trajectory.turns += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if cut else generation.text
        message, calls = openai_message(text, raw, self.tools, trajectory.turns)
        trajectory.calls += calls
        trajectory.final_text = message_text(message["content"])
        trajectory.finish_reason = "length" if cut else generation.finish_reason
        self.seen.append(canonical(message))
        self.replied_at = time.perf_counter()
        return message


def segment_record(trajectory: Trajectory) -> dict:
    """A segment a rewritten history ended: its ids and log-probs as sampled, kept in the rollout's record."""
    return {
        "prompt_ids": trajectory.prompt_ids,
        "response_ids": trajectory.response_ids,
        "response_mask": trajectory.response_mask,
        "logprobs": trajectory.logprobs,
        "turns": trajectory.turns,
    }
