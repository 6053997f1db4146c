"""The tool-call format of the Qwen family (Qwen2.5, Qwen3; Hermes' format): a call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the model's turn, and results go back
as ``tool`` messages, rendered by the tokenizer's own chat template.

Only the new messages are rendered and tokenized: the ids of the turns before them are never decoded
and encoded again (BPE is not bijective, so re-tokenizing can change the ids the policy sampled, TRL
issue #5224, and costs O(T^2) over T turns, TRL PR #6250).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from rlx.errors import UserError

CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
PROBE = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]  # a finished model turn


@dataclass(frozen=True)
class ToolCall:
    """One call read from the model's turn: the tool and its arguments, or why it cannot run (the
    model's mistake, shown to it as the call's error)."""

    name: str
    arguments: dict
    raw: str  # the text between the tags, as the model wrote it
    problem: str | None = None


def parse_calls(text: str, known: set[str]) -> list[ToolCall]:
    """Every ``<tool_call>`` in the text, in order; a call whose JSON does not parse, lacks a ``name`` or
    object ``arguments``, is cut off before ``</tool_call>`` or names a tool not in ``known`` carries its
    problem."""
    calls = []
    for match in CALL.finditer(text):
        raw, problem = match.group(1).strip(), None
        try:
            name, arguments = read_call(raw)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            name, arguments, problem = "", {}, f"unreadable tool call ({exc})"
        if problem is None and not match.group(2):
            problem = "unreadable tool call (no </tool_call>)"
        if problem is None and name not in known:
            problem = f"unknown tool {name!r}; tools: {', '.join(sorted(known))}"
        calls.append(ToolCall(name, arguments, raw, problem))
    return calls


def read_call(raw: str) -> tuple[str, dict]:
    """The tool's name and arguments from a call's JSON; ValueError when they are not there."""
    call = json.loads(raw)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError('expected {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments must be an object, got {type(arguments).__name__}")
    return call["name"], arguments


def tool_turn_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The tokens that follow a finished model turn (its end-of-turn token) when ``messages`` (tool
    results) come next, up to and including the prompt for the model's next turn: what the chat
    template writes after the model's end-of-turn token, then the messages and the generation prompt."""
    before = finished_turn(tokenizer)
    after = tokenizer.apply_chat_template(PROBE + messages, tokenize=False, add_generation_prompt=True)
    eos = tokenizer.eos_token or ""
    if not after.startswith(before) or eos not in before:
        raise UserError(
            "the tokenizer's chat template renders a finished assistant turn differently once tool messages "
            "follow it (or does not end it with the EOS token), so rlx cannot append tool results as tokens"
        )
    return tokenizer.encode(before[before.rindex(eos) + len(eos) :] + after[len(before) :], add_special_tokens=False)


@lru_cache(maxsize=8)
def finished_turn(tokenizer) -> str:
    """A finished model turn as the chat template renders it: the same for every tool turn of a run, so
    rendered once (a render costs about as much as the rest of a tool turn's token work)."""
    return tokenizer.apply_chat_template(PROBE, tokenize=False)


def shown_result(tokenizer, value: object, error: str | None, limit: int) -> tuple[str, str | None]:
    """(what the model is shown, the call's error): a text result, or the error as ``Error: ...``; a
    result that is not text is an error, and any text past ``limit`` tokens is cut, which is one too."""
    if error is None and not isinstance(value, str):
        error = f"the tool returned {type(value).__name__}, not text"
    text = value if error is None else f"Error: {error}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > limit:
        note = f"output cut to {limit} of {len(ids)} tokens (agent_loop_config.max_tool_response_tokens)"
        text, error = f"{tokenizer.decode(ids[:limit])} [Error: {note}]", error or note
    return text, error
