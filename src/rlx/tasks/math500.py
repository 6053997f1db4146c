"""MATH-500 (Lightman et al., 2023, the MATH test subset) converted to rlx's prompt rows, with the
prompt template used across the field (Qwen2.5-Math, verl, Open R1)."""

from __future__ import annotations

import json
from pathlib import Path

from rlx.artifacts import write_rows
from rlx.errors import UserError
from rlx.tasks.rows import make_row

DATA_SOURCE = "HuggingFaceH4/MATH-500"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def convert(source: Path, output: Path, split: str = "test") -> Path:
    """Read MATH-500's jsonl (keys problem, solution, answer, ...) and write rlx rows as parquet."""
    rows = []
    with open(source, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
                rows.append(
                    make_row(
                        data_source=DATA_SOURCE,
                        question=f"{record['problem']}\n{INSTRUCTION}",
                        ground_truth=record["answer"],
                        solution=record["solution"],
                        split=split,
                        index=len(rows),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{source}:{number}: not a MATH-500 row ({exc})") from None
    return write_rows(rows, output)
