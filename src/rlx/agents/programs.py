"""Agents as plain OpenAI-client programs (``agent_loop_config.program``): the rollouts of a step are the
conversations programs hold with the policy through rlx's endpoint (rlx.agents.endpoint).

A program is an ``async def run(client, row)`` named as ``'package.module:run'``, given an
``openai.AsyncOpenAI`` whose base URL and key are set, or a command (``["python", "agent.py"]``) that reads
the row as JSON on stdin and finds ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in its environment. The row is
the prompt row (``data_source``, ``prompt`` messages, ``ground_truth``). It returns (a command prints) its
answer, which the judgers score as they score a built-in agent's last turn, or a number, its own reward (the
``environment`` judger reads it). A program that raises, exits non-zero, runs past ``program_timeout`` or
calls past ``max_turns`` scores 0, its reason kept (``environment_error``) and counted; one that fails on
every row of a batch stops the run in one line (as an environment whose ``reset`` fails everywhere does).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from numbers import Real

from rlx.agents.calls import EventLoopThread, settled
from rlx.agents.endpoint import Endpoint, Limits
from rlx.agents.loop import PROGRAM_FAILED, AgentLoop, Trajectory, TurnRequests, run_to_end, with_texts
from rlx.agents.sessions import AgentSession
from rlx.agents.stopping import warn_still_running
from rlx.agents.tools import Session
from rlx.config import AgentLoopConfig, SampleParams
from rlx.errors import UserError
from rlx.plugins import AgentProgram

PROGRAM_LOOP = "rlx-program-loop"  # the name of the thread in-process programs run in
CLOSE_S = 1.0  # seconds the programs' connection pool may take to close
STDERR_SHOWN = 300  # characters of a failed command's standard error kept as its reason


class ProgramFailed(Exception):
    """A program's failure, as its rollout's record says it."""


class ProgramThread:
    """The event loop in-process programs run on (one that blocks holds up the other programs, never the
    endpoint), with one connection pool for every program's client: an ``openai.AsyncOpenAI`` with a pool
    of its own builds an SSL context, 27 ms a call's client on a 2-core EPYC, for a server on plain HTTP."""

    def __init__(self) -> None:
        self.loop, self.http = EventLoopThread(PROGRAM_LOOP), None

    async def on_loop(self, coroutine):
        return await asyncio.wrap_future(self.loop.submit(coroutine))

    async def open(self) -> None:
        self.http = await self.on_loop(new_pool())

    async def close(self) -> None:
        """Close the pool and end the loop's thread; a program blocking the loop is left to it."""
        try:
            await asyncio.wait_for(self.on_loop(self.http.aclose()), CLOSE_S)
        except TimeoutError:
            pass
        self.loop.stop()

    async def run(self, function, base_url: str, key: str, row: dict) -> object:
        said, error = await self.on_loop(settled(self.call(function, base_url, key, row)))
        if error is not None:
            raise ProgramFailed(f"raised {error}")
        return said

    async def call(self, function, base_url: str, key: str, row: dict) -> object:
        import openai

        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=self.http)
        return await function(client, row)  # (not closed: that would close the shared pool)


async def new_pool():
    """A connection pool for clients of a local plain-HTTP server (openai's defaults, no SSL context)."""
    import openai

    return openai.DefaultAsyncHttpxClient(verify=False)


async def run_command(command: tuple[str, ...], base_url: str, key: str, row: dict) -> object:
    """A command's answer: its standard output (a JSON ``{"answer": ...}`` or ``{"reward": ...}``, or text)."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, err = await process.communicate(json.dumps(row).encode())
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        raise ProgramFailed(f"exit code {process.returncode}: {err.decode(errors='replace').strip()[-STDERR_SHOWN:]}")
    text = out.decode(errors="replace").strip()
    try:
        said = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(said, dict) and ("answer" in said or "reward" in said):
        return said.get("reward", said.get("answer"))
    return text


@dataclass
class ProgramTrajectory(Trajectory):
    """A program's rollout: a built-in agent's columns, and what only a program's has (the segments its
    rewritten histories left, each call answered, the calls the endpoint refused)."""

    segments: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    refused_calls: int = 0

    def columns(self) -> dict:
        made = {"segments": json.dumps(self.segments), "requests": json.dumps(self.requests)}
        return {**super().columns(), **made, "refused_calls": self.refused_calls}


class ProgramLoop:
    """The rollouts of ``agent_loop_config.program``: the same ``starts``/``run`` as rlx.agents.loop.AgentLoop."""

    def __init__(self, config: AgentLoopConfig, tokenizer, params: SampleParams):
        self.config, self.tokenizer, self.params = config, tokenizer, params
        self.program = AgentProgram.load(config.program)
        self.limits = Limits(config.max_turns, params.max_tokens)

    def starts(self, rows: list[dict], ids: list[list[int]]) -> list[tuple[dict, list[int]]]:
        return list(zip(rows, ids, strict=True))

    def run(self, sampler, starts: list[tuple[dict, list[int]]], seed: int) -> list[ProgramTrajectory]:
        limit = self.config.max_tool_response_tokens
        keys = [f"rlx-{i}-{secrets.token_hex(12)}" for i in range(len(starts))]  # no program can guess another's
        sessions = [AgentSession(key, seed + i, self.tokenizer, limit) for i, key in enumerate(keys)]
        run_to_end(self.converse_all(sampler, sessions, [row for row, _ in starts]))
        warn_still_running()
        if sessions and all(session.failure for session in sessions):
            raise UserError(f"agent_loop_config.program: {sessions[0].failure}, on every prompt row")
        return self.finish(sessions, [ids for _, ids in starts])

    async def converse_all(self, sampler, sessions: list[AgentSession], rows: list[dict]) -> None:
        turns = TurnRequests(sampler, self.tokenizer, len(sessions))
        endpoint = Endpoint(turns, {s.key: s for s in sessions}, self.params, self.limits)
        base_url, programs = await endpoint.start(), ProgramThread()
        await programs.open()
        try:
            await asyncio.gather(
                *(
                    self.converse(base_url, i, s, row, turns, programs)
                    for i, (s, row) in enumerate(zip(sessions, rows, strict=True))
                )
            )
        finally:
            await programs.close()
            await endpoint.close()

    def running(self, programs: ProgramThread, base_url: str, key: str, row: dict):
        """The program's run for ``row``: a function on the programs' loop, or a command in a child process."""
        if self.program.function is None:
            return run_command(self.program.command, base_url, key, row)
        return programs.run(self.program.function, base_url, key, row)

    async def converse(self, base_url: str, index: int, session: AgentSession, row: dict, turns, programs) -> None:
        """One program run to its answer under ``program_timeout``; why it failed, if it did."""
        timeout = self.config.program_timeout
        try:
            said = await within_deadline(self.running(programs, base_url, session.key, row), session, timeout)
            session.answer = said if isinstance(said, str) else None
            session.reward = float(said) if isinstance(said, Real) and not isinstance(said, bool) else None
            if session.answer is None and session.reward is None:
                session.failure = f"returned {said!r}, not an answer (a string) or a reward (a number)"
        except TimeoutError:
            session.failure = f"no answer within {timeout} s (agent_loop_config.program_timeout)"
        except ProgramFailed as exc:
            session.failure = session.failure or str(exc)
        except OSError as exc:  # a command that could not start after all (its file removed since the check)
            session.failure = f"could not start ({exc})"
        finally:
            turns.leave(index)

    def finish(self, sessions: list[AgentSession], prompts: list[list[int]]) -> list[ProgramTrajectory]:
        trajectories = [finished(session, ids) for session, ids in zip(sessions, prompts, strict=True)]
        return with_texts(self.tokenizer, trajectories, self.params.skip_special_tokens)


async def within_deadline(running, session: AgentSession, timeout: float) -> object:
    """What ``running`` returns, unless the program spends ``timeout`` seconds of its own first (its waits for
    the model not counted: a batch per round waits for every rollout's program, the hung one's too, and the
    others must not pay for it); then it is cancelled (a command killed) and TimeoutError raised."""
    task, started = asyncio.ensure_future(running), time.perf_counter()
    while True:
        done, _ = await asyncio.wait({task}, timeout=max(timeout - session.own_seconds(started), 0.0))
        if done:
            return task.result()
        if session.own_seconds(started) >= timeout:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise TimeoutError


def finished(session: AgentSession, prompt_ids: list[int]) -> ProgramTrajectory:
    """A session's rollout: its last segment, the answer its program gave, or its failure."""
    made = session.trajectory or Trajectory(list(prompt_ids), Session({}, None, None), finish_reason="stop")
    trajectory = ProgramTrajectory(**{name: getattr(made, name) for name in made.__dataclass_fields__})
    trajectory.segments, trajectory.requests = session.segments, session.requests
    trajectory.refused_calls = session.refused
    if session.answer is not None:
        trajectory.final_text = session.answer
    trajectory.reward = session.reward
    if session.failure is not None:
        trajectory.finish_reason, trajectory.reward_error = PROGRAM_FAILED, session.failure
    return trajectory


def agent_loop(config: AgentLoopConfig, tokenizer, params: SampleParams) -> AgentLoop | ProgramLoop:
    """What drives an agent's rollouts: the endpoint for its program, or the built-in loop over its tools."""
    return (AgentLoop if config.program is None else ProgramLoop)(config, tokenizer, params)
