"""Reading prompt datasets (parquet or jsonl) into rows, with each broken row reported by number, and
the run's prompt pool (every usable prompt of ``replay_buffer_config``), which fixes the run's length.

Rows follow :mod:`rlx.tasks.rows`. A dataset that cannot be used raises :class:`DataError` naming
the file, the row and the problem, before anything reaches a model.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.tokens import prompts_ids

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


def tool_schemas(config: RLTrainerConfig) -> list[dict] | None:
    """The schemas of the run's agent tools, which its prompts show the model (None without an agent loop, and
    with an agent program, which sends its own with each call)."""
    agent = config.dataflow_config.agent_loop_config
    return agent.toolbox().schemas if agent and agent.program is None else None


@dataclass
class PromptPool:
    """Every usable prompt of the configured datasets, tokenized once; too-long ones are counted."""

    rows: list[dict]
    dropped_too_long: int

    @classmethod
    def load(cls, config: RLTrainerConfig, tokenizer) -> PromptPool:
        """The pool ``config`` asks for. The last one made is kept for the process: `rlx fit` and `rlx stage`
        check it before the run starts (rlx.run.preflight), then run from it, and tokenizing every prompt
        was a third of their start (1.9 s of the demo's ~6)."""
        global _last_pool
        key = pool_key(config)
        if _last_pool is None or _last_pool[0] != key:
            _last_pool = (key, cls.tokenized(config, tokenizer))
        return _last_pool[1]

    @classmethod
    def tokenized(cls, config: RLTrainerConfig, tokenizer) -> PromptPool:
        buffer = config.replay_buffer_config
        rows, dropped, tools = [], 0, tool_schemas(config)
        for dataset in buffer.dataset_cfg:
            source = load_rows(dataset.anno_path)
            indices = sample_indices(len(source), dataset.sample_ratio, config.seed)
            distinct = sorted(set(indices))  # a sample_ratio above 1 repeats rows: each is tokenized once
            tokenized = prompts_ids(tokenizer, [source[i]["prompt"] for i in distinct], tools)
            tokens = dict(zip(distinct, tokenized, strict=True))
            for index in indices:
                row, ids = source[index], list(tokens[index])
                if len(ids) > buffer.max_prompt_length:
                    dropped += 1
                    continue
                rows.append(
                    {
                        "dataset": dataset.name,
                        "index": index,
                        "data_source": row["data_source"],
                        "prompt": json.dumps(row["prompt"]),
                        "prompt_ids": ids,
                        "ground_truth": str(row["reward_model"]["ground_truth"]),
                    }
                )
        if not rows:
            raise UserError(
                f"every prompt ({dropped}) is longer than replay_buffer_config.max_prompt_length="
                f"{buffer.max_prompt_length} tokens; raise the limit or shorten the prompts"
            )
        return cls(rows, dropped)

    def steps_per_epoch(self, global_batch_size: int) -> int:
        steps = len(self.rows) // global_batch_size
        if steps == 0:
            raise UserError(
                f"only {len(self.rows)} usable prompts ({self.dropped_too_long} more were longer than "
                f"replay_buffer_config.max_prompt_length), fewer than dataflow_config.global_batch_size="
                f"{global_batch_size}"
            )
        return steps


_last_pool: tuple[tuple, PromptPool] | None = None


def pool_key(config: RLTrainerConfig) -> tuple:
    """What a prompt pool is made of: the datasets' files as they are now, how they are sampled, the length
    limit, the tokenizer's folders and the tools the prompts show."""
    buffer = config.replay_buffer_config
    paths = [file for dataset in buffer.dataset_cfg for file in dataset_files(dataset.anno_path)]
    files = [(str(file), file.stat().st_mtime_ns, file.stat().st_size) for file in paths]
    sampled = [(d.name, str(d.anno_path), d.sample_ratio) for d in buffer.dataset_cfg]
    tokenizer = (str(config.tokenizer_path), str(config.load_from), json.dumps(tool_schemas(config)))
    return (tuple(files), tuple(sampled), buffer.max_prompt_length, config.seed, tokenizer)


def sample_indices(size: int, ratio: float, seed: int) -> list[int]:
    """Row indices for a ``sample_ratio``: a seeded subset below 1, whole repeats plus a subset above."""
    whole, fraction = divmod(ratio, 1)
    extra = random.Random(seed).sample(range(size), math.floor(fraction * size))
    return [*range(size)] * int(whole) + sorted(extra)


def run_length(config: RLTrainerConfig, pool: PromptPool) -> int:
    """The run's length in steps: ``rollout_steps`` if set, else ``total_epochs`` x steps per epoch."""
    if config.rollout_steps:
        return config.rollout_steps
    return config.total_epochs * pool.steps_per_epoch(config.dataflow_config.global_batch_size)
