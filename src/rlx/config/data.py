"""The prompts a run trains on (XTuner ``replay_buffer_config``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rlx.config.fields import Section


class DatasetConfig(Section):
    """One prompt dataset: parquet or jsonl rows with ``data_source``, ``prompt`` and ``reward_model``."""

    name: str = Field(..., min_length=1, description="The set's name in metrics and artifacts.")
    anno_path: Path = Field(..., description="A .parquet or .jsonl file, or a folder of them.")
    sample_ratio: float = Field(
        1.0, gt=0, le=100, description="Fraction of rows used, a seeded subset (above 1 repeats rows, up to 100 times)."
    )


class ReplayBufferConfig(Section):
    """Where prompts come from (XTuner ``ReplayBufferConfig``)."""

    dataset_cfg: list[DatasetConfig] = Field(
        default_factory=lambda: [DatasetConfig(name="arith", anno_path=Path("data/arith/train.parquet"))],
        min_length=1,
        description="The training prompt sets, mixed.",
    )
    max_prompt_length: int = Field(128, gt=0, description="Longer prompts are dropped and counted.")
    shuffle: bool = Field(True, description="Seeded reshuffle of the prompts every epoch; false keeps file order.")
