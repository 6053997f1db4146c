"""MATH-500 (Lightman et al., 2023, the MATH test subset) converted to rlx's prompt rows, with the
prompt template used across the field (Qwen2.5-Math, verl, Open R1)."""

from __future__ import annotations

from pathlib import Path

from rlx.tasks.rows import convert_jsonl, make_row

DATA_SOURCE = "HuggingFaceH4/MATH-500"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def convert(source: Path, output: Path, split: str = "test") -> Path:
    """Read MATH-500's jsonl (keys problem, solution, answer, ...) and write rlx rows as parquet."""

    def to_row(record: dict, index: int) -> dict:
        return make_row(
            data_source=DATA_SOURCE,
            question=f"{record['problem']}\n{INSTRUCTION}",
            ground_truth=record["answer"],
            solution=record["solution"],
            split=split,
            index=index,
        )

    return convert_jsonl(source, output, "MATH-500", to_row)
