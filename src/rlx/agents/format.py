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
from rlx.tokens import decode, encode_many

CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MODEL_TURN = "<rlx-model-turn>"
PROBE = [{"role": "user", "content": "?"}, {"role": "assistant", "content": MODEL_TURN}]  # a finished model turn


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
    results) come next, up to and including the prompt for the model's next turn."""
    return tool_turns_ids(tokenizer, [messages])[0]


def tool_turns_ids(tokenizer, turns: list[list[dict]]) -> list[list[int]]:
    """:func:`tool_turn_ids` of many rollouts' turns, encoded in one batch."""
    return encode_many(tokenizer, [tool_turn_text(tokenizer, messages) for messages in turns])


def tool_turn_text(tokenizer, messages: list[dict]) -> str:
    """What the chat template writes after the model's end-of-turn token, then the messages and the
    generation prompt: the contents put into the turn's frame (rendered once per shape), or the whole
    turn rendered where the template does more with a content than insert it."""
    shape = tuple(tuple((k, v) for k, v in message.items() if k != "content") for message in messages)
    frame = turn_frame(tokenizer, shape)
    if frame is None:
        return render_tool_turn(tokenizer, messages)
    contents = [message["content"] for message in messages]
    return "".join(piece for pair in zip(frame, contents, strict=False) for piece in pair) + frame[-1]


STAND_INS = ("<rlx-content-{}>", " \n{{{{rlx content {}}}}}\n ")  # unlike: a template that trims or escapes shows it


@lru_cache(maxsize=64)
def turn_frame(tokenizer, shape: tuple[tuple[tuple[str, str], ...], ...]) -> tuple[str, ...] | None:
    """The text around the contents of a tool turn whose messages have these fields besides their content,
    or None when the template renders two unlike stand-in contents other than by inserting them
    (rendering a turn costs more than the rest of its token work, and the frame is the same each turn)."""
    renders = []
    for stand_in in STAND_INS:
        contents = [stand_in.format(index) for index in range(len(shape))]
        messages = [dict(fields, content=content) for fields, content in zip(shape, contents, strict=True)]
        renders.append((render_tool_turn(tokenizer, messages), contents))
    (text, contents), (other_text, other_contents) = renders
    frame = split_around(text, contents)
    if frame is None or split_around(other_text, other_contents) != frame:
        return None
    return frame


def split_around(text: str, contents: list[str]) -> tuple[str, ...] | None:
    """The pieces of ``text`` before, between and after ``contents`` (in order), None if one is missing."""
    pieces = []
    for content in contents:
        before, found, text = text.partition(content)
        if not found:
            return None
        pieces.append(before)
    return (*pieces, text)


def render_tool_turn(tokenizer, messages: list[dict]) -> str:
    """The chat template's rendering of a tool turn: what follows the EOS token that ends a model's turn.
    The model's turn is found by its content, not by rendering it alone: a template may render the last
    turn otherwise (Qwen3's adds an empty ``<think>`` block to it)."""
    text = tokenizer.apply_chat_template(PROBE + messages, tokenize=False, add_generation_prompt=True)
    eos = tokenizer.eos_token or ""
    _, found, after = text.partition(MODEL_TURN)
    if not found or not eos or eos not in after:
        raise UserError(
            "the tokenizer's chat template does not end an assistant turn with the EOS token "
            f"({tokenizer.eos_token!r}), so rlx cannot tell where the tool results' tokens start"
        )
    return after[after.index(eos) + len(eos) :]


def shown_results(tokenizer, results: list[tuple[object, str | None]], limit: int) -> list[tuple[str, str | None]]:
    """(what the model is shown, the call's error) for each call's (value, error): a text result, or the
    error as ``Error: ...``; a result that is not text is an error, and any text past ``limit`` tokens is
    cut, which is one too. A text is first cut to as many characters as ``limit`` tokens can hold (no token
    is longer than the vocabulary's longest), so a tool's 50 MB answer costs what its first tokens cost; the
    texts are then encoded in one batch."""
    errors = [error if error is not None or isinstance(value, str) else not_text(value) for value, error in results]
    texts = [value if error is None else f"Error: {error}" for (value, _), error in zip(results, errors, strict=True)]
    bound = limit * longest_token(tokenizer) + 1  # characters: a text longer holds more than ``limit`` tokens
    kept = [text[:bound] for text in texts]
    return [
        cut(tokenizer, text, error, ids, limit, whole=len(text) == len(full))
        for text, full, error, ids in zip(kept, texts, errors, encode_many(tokenizer, kept), strict=True)
    ]


@lru_cache(maxsize=8)
def longest_token(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` stands for (its vocabulary's longest entry in bytes)."""
    return max(len(token.encode()) for token in tokenizer.get_vocab())


def not_text(value: object) -> str:
    return f"the tool returned {type(value).__name__}, not text"


def cut(tokenizer, text: str, error: str | None, ids: list[int], limit: int, whole: bool) -> tuple[str, str | None]:
    """``text`` (encoded as ``ids``; ``whole``: not already cut to a bound) and its error, cut to ``limit``
    tokens with a note if longer."""
    if len(ids) <= limit:
        return text, error
    count = len(ids) if whole else f"at least {len(ids)}"
    note = f"output cut to {limit} of {count} tokens (agent_loop_config.max_tool_response_tokens)"
    return f"{decode(tokenizer, ids[:limit], skip_special_tokens=False)} [Error: {note}]", error or note
