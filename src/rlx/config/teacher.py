"""On-policy distillation (rlx addition; XTuner has none): teachers that score every token the student
samples, and how their signal mixes with the verifiable reward."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rlx.config.fields import Section


class TeacherItemConfig(Section):
    """One teacher and the rows it scores."""

    name: str = Field(..., min_length=1, description="Names the teacher in teacher.parquet and the step's metrics.")
    path: Path = Field(
        ...,
        description="A HF model folder, or with `step` an rlx run's work_dir (its policy of that step, replayed "
        "exactly as `rlx materialize` does, no copy written). It must share the student's tokenizer.",
    )
    step: int | None = Field(None, ge=0, description="With a run's work_dir: the step whose policy teaches.")
    data_source: list[str] | None = Field(
        None,
        description="The rows it scores, by data_source (NeMo-RL and slime route teachers per domain); null: every "
        "row no other teacher names. A row no teacher scores learns from its reward only.",
    )


class TeacherConfig(Section):
    """On-policy distillation (Agarwal et al., 2024, GKD; Thinking Machines, "On-Policy Distillation", 2025):
    the student samples, a teacher scores each sampled token, and each token's advantage is the negative
    reverse KL estimate ``-(log p_student - log p_teacher)``, mixed with the reward's advantage."""

    teachers: list[TeacherItemConfig] = Field(..., min_length=1, description="The teachers, routed by data_source.")
    kl_coef: float = Field(
        1.0,
        gt=0,
        le=1e6,
        description="Weight of the per-token reverse-KL advantage (Thinking Machines use 1, no discount).",
    )
    reward_coef: float = Field(
        0.0,
        ge=0,
        le=1e6,
        description="Weight of the reward's advantage (advantage_estimator_config) beside it: 0 is pure "
        "distillation (Thinking Machines; Qwen3's report), above 0 mixes distillation and RL.",
    )

    @model_validator(mode="after")
    def _routed_once(self) -> TeacherConfig:
        names = [teacher.name for teacher in self.teachers]
        if len(set(names)) < len(names):
            raise ValueError(f"teachers: names must differ, got {names}")
        catch_all = [teacher.name for teacher in self.teachers if teacher.data_source is None]
        if len(catch_all) > 1:
            raise ValueError(f"teachers {catch_all} each take every row (data_source null): name all but one's rows")
        routed = [source for teacher in self.teachers for source in teacher.data_source or []]
        twice = sorted({source for source in routed if routed.count(source) > 1})
        if twice:
            raise ValueError(f"data_source {twice} is named by two teachers: each row has one teacher")
        return self

    def teacher_of(self, data_source: str) -> TeacherItemConfig | None:
        """The teacher that scores rows of ``data_source``, or None (they learn from their reward only)."""
        for teacher in self.teachers:
            if teacher.data_source is not None and data_source in teacher.data_source:
                return teacher
        return next((teacher for teacher in self.teachers if teacher.data_source is None), None)
