"""Verifiable rewards (XTuner ``judger_config``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlx.config.fields import Section


class JudgerItemConfig(Section):
    """One reward judger and the rows it scores."""

    judger_name: str = Field(..., min_length=1, description="A registered judger, e.g. `arith` or `gsm8k`.")
    data_source: list[str] = Field(default_factory=list, description="Rows it scores; empty means its own name.")
    weight: float = Field(
        1.0, ge=-1e6, le=1e6, description="Weight in the total reward (within +-1e6, so the total stays finite)."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Judger-specific options.")


class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment (arXiv 2503.14476), added to the reward of responses near max_tokens."""

    enable: bool = Field(False, description="DAPO turns it on.")
    len: int = Field(
        16,
        gt=0,
        description="The last this many tokens before max_tokens ramp the penalty to -factor (DAPO: 4096 of 20480).",
    )
    penalty_factor: float = Field(1.0, ge=0, le=1e6, description="The penalty at max_tokens, negated (DAPO: 1.0).")


class JudgerConfig(Section):
    """Verifiable rewards (XTuner ``JudgerConfig``)."""

    reward_judger_configs: list[JudgerItemConfig] = Field(
        default_factory=lambda: [JudgerItemConfig(judger_name="arith", data_source=["rlx/arith"])],
        min_length=1,
        description="The judgers; each row is scored by those of its data_source, their scores weighted and summed.",
    )
    timeout: float = Field(
        5.0,
        gt=0,
        le=86400,
        description="Seconds per sample and judger before its score is 0 (counted in judge/errors); at most a day.",
    )
    max_response_chars: int = Field(
        16000,
        gt=0,
        description="rlx addition: judgers see at most the last this many characters of a response (where the "
        "answer is), so no parser ever gets unbounded text.",
    )
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=lambda: OverlongBufferConfig(), description="DAPO's soft length penalty."
    )
