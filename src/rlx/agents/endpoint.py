"""The OpenAI-compatible endpoint an agent program talks to during a step's rollouts (``agent_loop_config.
program``): ``POST /v1/chat/completions`` and ``GET /v1/models`` on 127.0.0.1, served with aiohttp over the
step's sampler (rlx.agents.loop.TurnRequests: continuous batching on LMDeploy, a batch per round elsewhere).

Each (row, sample) has its own API key, which names its session (rlx.agents.sessions): concurrent programs
never share a trajectory, and a program needs nothing but ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. The run
fixes the sampling (temperature, top-p, top-k, seed): a call asking for other values gets a 400 naming the
field, not a silent change; ``max_tokens`` may only shorten a call. ``stream`` is served as one chunk (a turn
is sampled whole). Call ``t`` of a session samples from
``derive(row_seed, t)``, as the built-in loop's turn ``t`` does, so a deterministic program's rerun is bitwise
the same.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

from aiohttp import web

from rlx.agents.loop import TurnRequests, turn_seed
from rlx.agents.sessions import AgentSession
from rlx.config import SampleParams

MODEL = "rlx-policy"
CLOSE_S = 1.0  # seconds calls still in flight as the step ends may take (their programs have ended)
RUN_FIXED = ("temperature", "top_p", "top_k", "seed")  # sample_params' fields a call may not change


class BadCall(Exception):
    """A call the endpoint refuses: its HTTP status and the reason, sent as OpenAI's error object."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Limits:
    """Per session: the calls it may make (``max_turns``) and its response's tokens, tool results included
    (``sample_params.max_tokens``, as the built-in loop counts them)."""

    max_calls: int
    max_tokens: int


def refused_sampling(body: dict, params: SampleParams) -> str | None:
    """The first sampling field the call sets to other than the run's value, described; None if none."""
    for field in RUN_FIXED:
        asked, fixed = body.get(field), getattr(params, field)
        if asked is not None and asked != fixed and not (field == "top_k" and asked in (0, -1) and not fixed):
            return f"{field} {asked!r}: this run samples with {fixed!r} (its dataflow_config.sample_params)"
    if body.get("n", 1) != 1:
        return f"n {body['n']!r}: one choice per call (each session is one trajectory)"
    return None


@dataclass
class Call:
    """What a chat-completions call asks: its conversation, tools, token cap, whether to return log-probs and
    whether to stream the reply."""

    messages: list[dict]
    tools: list[dict] | None
    cap: int | None
    logprobs: bool
    stream: bool


def read_call(body: object, params: SampleParams) -> Call:
    """A chat-completions body read; BadCall(400) naming what is wrong with it."""
    if not isinstance(body, dict):
        raise BadCall(400, "the body must be a JSON object")
    messages, tools = body.get("messages"), body.get("tools") or None
    if not isinstance(messages, list) or not messages or not all(_is_message(m) for m in messages):
        raise BadCall(400, "messages: a non-empty list of objects with a role is needed")
    if tools is not None and not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
        raise BadCall(400, "tools: a list of {'type': 'function', 'function': {...}} is needed")
    if problem := refused_sampling(body, params):
        raise BadCall(400, problem)
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise BadCall(400, f"max_tokens {cap!r}: a positive integer is needed")
    return Call(messages, tools, cap, bool(body.get("logprobs")), bool(body.get("stream")))


def _is_message(message: object) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "user", "assistant", "tool")


class Endpoint:
    """The step's endpoint: the sessions by key, answered from ``turns``."""

    def __init__(self, turns: TurnRequests, sessions: dict[str, AgentSession], params: SampleParams, limits: Limits):
        self.turns, self.sessions, self.params, self.limits = turns, sessions, params, limits
        self.order = {key: index for index, key in enumerate(sessions)}
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1; the base URL (``http://127.0.0.1:PORT/v1``)."""
        app = web.Application(client_max_size=64 << 20)
        app.add_routes([web.get("/v1/models", self.models), web.post("/v1/chat/completions", self.chat)])
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=CLOSE_S)
        await self.runner.setup()
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))  # a free port, chosen by the system
        await web.SockSite(self.runner, listening).start()
        return f"http://127.0.0.1:{listening.getsockname()[1]}/v1"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "rlx"}]})

    async def chat(self, request: web.Request) -> web.Response:
        session = None
        try:
            session = self.session_of(request)
            call = read_call(await request.json(loads=json.loads), self.params)
            answered = await self.answer(session, call)
            return await streamed(request, answered) if call.stream else web.json_response(answered)
        except json.JSONDecodeError as exc:
            return self.refuse(BadCall(400, f"the body is not JSON ({exc})"), session)
        except BadCall as exc:
            return self.refuse(exc, session)

    def refuse(self, exc: BadCall, session: AgentSession | None) -> web.Response:
        """OpenAI's error object, the refusal counted against the session it names, if any."""
        if session is not None:
            session.refused += 1
        kind = "invalid_request_error" if exc.status == 400 else "rlx_error"
        return web.json_response({"error": {"message": str(exc), "type": kind}}, status=exc.status)

    def session_of(self, request: web.Request) -> AgentSession:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        session = self.sessions.get(key)
        if session is None:
            raise BadCall(401, "unknown API key: each rollout's program gets its own in OPENAI_API_KEY")
        if session.failure is not None or session.answer is not None:
            raise BadCall(409, f"this rollout has ended ({session.failure or 'its program answered'})")
        return session

    async def answer(self, session: AgentSession, call: Call) -> dict:
        """One call answered: its context, the sampled turn, the OpenAI completion."""
        if session.calls >= self.limits.max_calls:
            session.failure = f"more than {self.limits.max_calls} calls (agent_loop_config.max_turns)"
            raise BadCall(429, session.failure)
        try:
            ids = session.context(call.messages, call.tools)
        except Exception as exc:  # noqa: BLE001 - the chat template's error on what the program sent
            raise BadCall(
                400, f"messages: the chat template cannot render them ({type(exc).__name__}: {exc})"
            ) from None
        left = self.limits.max_tokens - session.response_tokens
        if left <= 0:
            return completion(session, {"role": "assistant", "content": ""}, "length", len(ids), [], [])
        params = self.params.model_copy(update={"max_tokens": min(call.cap or left, left)})
        seed = turn_seed(session.row_seed, session.calls)
        session.waiting_since = time.perf_counter()
        try:
            generation, raw = await self.turns.generate(self.order[session.key], ids, params, seed)
        finally:
            waited, session.waiting_since = time.perf_counter() - session.waiting_since, None
            session.model_wait += waited
        message = session.take(generation, raw, self.limits.max_tokens, waited)
        finish = "tool_calls" if message.get("tool_calls") else session.trajectory.finish_reason
        logprobs = generation.logprobs if call.logprobs else None
        return completion(session, message, finish, len(ids), generation.response_ids, logprobs)


def completion(
    session: AgentSession, message: dict, finish: str, prompt: int, made: list[int], logprobs: list[float] | None
) -> dict:
    """OpenAI's chat.completion object for one call, with each sampled token's log-prob where asked."""
    if logprobs is not None:
        tokens = session.tokenizer.convert_ids_to_tokens(made)
        pairs = zip(tokens, logprobs, strict=True)
        logprobs = {"content": [{"token": t, "logprob": lp, "top_logprobs": []} for t, lp in pairs]}
    return {
        "id": f"chatcmpl-{session.key}-{session.calls}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(made), "total_tokens": prompt + len(made)},
    }


async def streamed(request: web.Request, answered: dict) -> web.StreamResponse:
    """A completion as OpenAI's stream of chunks (server-sent events): the whole turn in one delta (it is
    sampled whole), then its finish reason, then ``[DONE]``."""
    (choice,) = answered["choices"]
    delta = {key: value for key, value in choice["message"].items() if key != "tool_calls"}
    if calls := choice["message"].get("tool_calls"):
        delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(calls)]
    chunk = {key: answered[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    events = [
        chunk | {"choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": choice["logprobs"]}]},
        chunk | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
