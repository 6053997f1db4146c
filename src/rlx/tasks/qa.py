"""A question/answer set of your own, one ``{"question": ..., "answer": ...}`` object a line, converted to
rlx's prompt rows: the question is the user's message as written (add the answer format you want judged to
it), the answer the gold, and ``data_source`` the name the judgers are chosen by."""

from __future__ import annotations

from pathlib import Path

from rlx.tasks.rows import convert_jsonl, make_row


def convert(source: Path, output: Path, split: str, data_source: str) -> Path:
    def to_row(record: dict, index: int) -> dict:
        question, answer = record["question"], record["answer"]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"'question' must be non-empty text, got {question!r}")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise ValueError(f"'answer' must be text or a number, got {answer!r}")
        return make_row(
            data_source=data_source, question=question, ground_truth=str(answer), solution="", split=split, index=index
        )

    return convert_jsonl(source, output, "question/answer", to_row)
