"""Multi-turn, tool-using rollouts (XTuner ``agent_loop_config``): the tools, the environment and the
limits of an agent loop. Tools come from here only, never from a dataset row."""

from __future__ import annotations

from pydantic import Field, model_validator

from rlx.config.fields import Section
from rlx.errors import UserError


class AgentLoopConfig(Section):
    """An agent loop for the run's rollouts and evaluations (XTuner ``agent_loop_config``, one class per
    loop there; here the tools and limits of one loop rlx runs): the model generates until a tool call
    or an answer, the calls run, their results are appended as tokens, and so on."""

    tools: list[str] = Field(
        default_factory=list,
        description="Functions the model may call (plain or async def), as 'package.module:function'; type hints "
        "and a docstring (an 'Args:' line per argument) give the schema the chat template shows the model.",
    )
    environment: str | None = Field(
        None,
        description="Instead of tools: a class 'package.module:Class', made per rollout; reset(row) returns the "
        "conversation to start from (messages, a string as the user's message, or None for the row's prompt), its "
        "other public methods are the tools, and an optional reward() is read by the `environment` judger.",
    )
    program: str | list[str] | None = Field(
        None,
        description="rlx addition: instead of tools, an agent program that talks to the policy through an "
        "OpenAI-compatible endpoint rlx serves during rollouts (rlx.agents.programs): 'package.module:run', an "
        "async def run(client, row) given an openai.AsyncOpenAI, or a command (['python', 'agent.py']) reading the "
        "row on stdin, with OPENAI_BASE_URL and OPENAI_API_KEY set. It returns (prints) its answer or its reward.",
    )
    program_timeout: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="rlx addition, with program: seconds one rollout's program may spend on its own (its waits "
        "for the model not counted); past it the program is stopped, the rollout scores 0 (counted) and the step "
        "goes on.",
    )
    max_turns: int = Field(
        4,
        ge=1,
        le=256,
        description="Model turns per rollout; a call in the last one is not run (finish max_turns). With program: "
        "the calls one rollout's program may make (one more is refused, and the rollout scores 0).",
    )
    max_tool_response_tokens: int = Field(
        256,
        gt=0,
        description="A tool's output past this many tokens is cut and shown to the model as an error (with program: "
        "each tool message the program sends).",
    )
    tool_timeout: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Seconds a tool call may take (an environment's reward() too); past it the model is shown "
        "a timeout error and the call's thread is abandoned (an async call is cancelled).",
    )

    @model_validator(mode="after")
    def _tools_load(self) -> AgentLoopConfig:
        if [bool(self.tools), self.environment is not None, self.program is not None].count(True) != 1:
            raise ValueError(
                "set one of tools (a list of 'package.module:function'), environment or program, not several"
            )
        if self.program is not None:
            self._program_loads()
        else:
            self.toolbox()  # fail at configuration time, naming the entry, not in the middle of a run
        if self.program is None and self.program_timeout != self._default("program_timeout"):
            raise ValueError("program_timeout acts only with program")
        return self

    @classmethod
    def _default(cls, name: str):
        """A field's default: a setting that cannot act is refused when it differs from it (a run's saved
        config names every field, so being set says nothing)."""
        return cls.model_fields[name].default

    def _program_loads(self) -> None:
        """The program imported (or its command found), and no tool setting it would leave unread."""
        from rlx.plugins import AgentProgram

        if self.tool_timeout != self._default("tool_timeout"):
            raise ValueError("tool_timeout: the program runs its own tools (program_timeout bounds it); leave it out")
        try:
            AgentProgram.load(self.program)
        except UserError as exc:
            raise ValueError(str(exc)) from None

    def toolbox(self):
        """The tools, imported (rlx.plugins.Toolbox)."""
        from rlx.plugins import Toolbox

        try:
            return Toolbox.load(self)
        except UserError as exc:
            raise ValueError(str(exc)) from None
