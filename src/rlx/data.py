"""Reading prompt datasets (parquet or jsonl) into rows, with each broken row reported by number.

Rows follow :mod:`rlx.tasks.rows`. A dataset that cannot be used raises :class:`DataError` naming
the file, the row and the problem, before anything reaches a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from rlx.errors import UserError

SUFFIXES = (".parquet", ".jsonl", ".json")


class DataError(UserError):
    """A prompt dataset is missing, unreadable, or has rows rlx cannot use."""


def dataset_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"{path}: folder holds no {', '.join(SUFFIXES)} files")
        return files
    if not path.is_file():
        raise DataError(f"{path}: no such dataset file (build the demo data with `dvc repro` or `rlx init-data`)")
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: expected a {', '.join(SUFFIXES)} file")
    return [path]


def read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DataError(f"{path}: unreadable parquet ({exc})") from None
    rows = []
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return rows


def row_problem(row: object) -> str | None:
    """Why a row cannot be used, or None when it is fine."""
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        return "missing 'data_source'"
    prompt = row.get("prompt")
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    ):
        return "'prompt' must be a non-empty list of {role, content} messages"
    gold = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    if gold is None or str(gold).strip() == "":
        return "missing 'reward_model.ground_truth' (the gold answer)"
    return None


def load_rows(path: Path) -> list[dict]:
    """All rows of a dataset file or folder; raises DataError on the first unusable row."""
    rows = []
    for file in dataset_files(path):
        file_rows = read_file(file)
        for index, row in enumerate(file_rows):
            problem = row_problem(row)
            if problem:
                raise DataError(f"{file}: row {index}: {problem}")
        rows.extend(file_rows)
    if not rows:
        raise DataError(f"{path}: the dataset is empty")
    return rows


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt rendered by the tokenizer's template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)
