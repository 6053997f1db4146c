"""GSM8K (Cobbe et al., 2021) converted to rlx's prompt rows, so a config can point at it instead of
the synthetic task. The gold answer is what follows ``####`` in the reference solution, with
thousands commas removed."""

from __future__ import annotations

from pathlib import Path

from rlx.tasks.rows import INSTRUCTION, convert_jsonl, make_row

DATA_SOURCE = "openai/gsm8k"


def gold_answer(solution: str) -> str:
    _, sep, tail = solution.rpartition("####")
    if not sep or not tail.strip():
        raise ValueError("no '#### answer' at the end of the solution")
    return tail.strip().replace(",", "")


def convert(source: Path, output: Path, split: str) -> Path:
    """Read GSM8K's jsonl (keys ``question``, ``answer``) and write rlx rows as parquet."""

    def to_row(record: dict, index: int) -> dict:
        return make_row(
            data_source=DATA_SOURCE,
            question=f"{record['question']} {INSTRUCTION}",
            ground_truth=gold_answer(record["answer"]),
            solution=record["answer"],
            split=split,
            index=index,
        )

    return convert_jsonl(source, output, "GSM8K", to_row)
