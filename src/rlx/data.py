"""Reading prompt datasets (parquet or jsonl) into rows, with each broken row reported by number.

Rows follow :mod:`rlx.tasks.rows`. A dataset that cannot be used raises :class:`DataError` naming
the file, the row and the problem, before anything reaches a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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


def jsonl_records(path: Path) -> Iterator[tuple[int, object]]:
    """``(line number, record)`` for each non-blank line; a line that is not UTF-8 or not JSON is
    reported by its number (decoded line by line, so the number is exact)."""
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise DataError(f"{path}: unreadable parquet ({exc})") from None
    return [record for _, record in jsonl_records(path)]


CHAT_ROLES = ("system", "user", "assistant", "tool")  # what chat templates render


def row_problem(row: object) -> str | None:
    """Why a row cannot be used (the column, and what it holds instead), or None when it is fine."""
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    missing = [column for column in ("data_source", "prompt", "reward_model") if column not in row]
    if missing:
        return f"missing column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"
    if not isinstance(row["data_source"], str) or not row["data_source"]:
        return f"'data_source' must be a non-empty string, got {row['data_source']!r}"
    prompt = row["prompt"]
    if (
        not isinstance(prompt, list)
        or not prompt
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    ):
        return f"'prompt' must be a non-empty list of {{role, content}} messages, got {short(prompt)}"
    strange = next((m["role"] for m in prompt if m["role"] not in CHAT_ROLES), None)
    if strange is not None:
        return f"'prompt' has a message with role {strange!r}; chat roles are {', '.join(CHAT_ROLES)}"
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        return f"'reward_model' must be an object with a 'ground_truth', got {short(reward_model)}"
    gold = reward_model.get("ground_truth")
    if gold is None or str(gold).strip() == "":
        return f"empty 'reward_model.ground_truth' (the gold answer), got {gold!r}"
    if isinstance(gold, bool) or not isinstance(gold, str | int | float) or gold != gold:
        return (
            f"'reward_model.ground_truth' must be the gold answer as a string (or a number), got {short(gold)}; "
            "write several answers as one string, e.g. '3, 5'"
        )
    return None


def short(value: object, limit: int = 60) -> str:
    """A value as it appears in an error message, cut to one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


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
