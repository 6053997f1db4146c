"""Held-out evaluation (XTuner ``evaluator_config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from rlx.config.data import DatasetConfig
from rlx.config.fields import Section
from rlx.config.rollout import SampleParams


class EvalDatasetConfig(DatasetConfig):
    """An eval set; it may name its own judger and sampling (e.g. n samples for pass@k)."""

    sample_ratio: float = Field(
        1.0, gt=0, le=1, description="Fraction of the set's rows evaluated, a seeded subset (times eval_sample_ratio)."
    )
    judger_name: str | None = Field(None, description="Judger for this set; default: judger_config by data_source.")
    judger_options: dict[str, Any] = Field(default_factory=dict, description="Options of that judger.")
    sample_params: SampleParams | None = Field(None, description="Sampling for this set; default: the evaluator's.")


class EvaluatorConfig(Section):
    """Held-out evaluation (XTuner ``EvaluatorConfig``)."""

    enable_evaluate: bool = Field(True, description="Evaluate every evaluate_step steps and at the end.")
    enable_initial_evaluate: bool = Field(True, description="Evaluate the base policy as step 0 (rlx default on).")
    evaluate_step: int = Field(10, gt=0, description="Evaluate every this many rollout steps and at the end.")
    dataset_cfg: list[EvalDatasetConfig] = Field(
        default_factory=lambda: [EvalDatasetConfig(name="arith", anno_path=Path("data/arith/test.parquet"))],
        min_length=1,
        description="The held-out sets, each reported on its own.",
    )
    eval_sample_ratio: float = Field(
        1.0, gt=0, le=1, description="Fraction of every set's rows evaluated, the same seeded subset each time."
    )
    sample_params: SampleParams = Field(
        default_factory=lambda: SampleParams(temperature=0.0, do_sample=False),
        description="Sampling of the eval sets that set none (default greedy).",
    )
