"""Stage ``prepare``: the step's prompt groups, drawn from the datasets in a seeded order per epoch.

Output ``step-N/prompts.parquet``, one row per group: ``step, group, batch, epoch, dataset, index,
data_source, prompt`` (chat messages as JSON), ``prompt_ids, ground_truth``. ``batch`` 0 is the step's
``global_batch_size`` groups; with dynamic sampling, batches 1, 2, ... are the reserve it refills from.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from rlx.artifacts import write_rows
from rlx.config import RLTrainerConfig
from rlx.data import load_rows, prompt_ids
from rlx.errors import UserError


@dataclass
class PromptPool:
    """Every usable prompt of the configured datasets, tokenized once; too-long ones are counted."""

    rows: list[dict]
    dropped_too_long: int

    @classmethod
    def load(cls, config: RLTrainerConfig, tokenizer) -> PromptPool:
        buffer = config.replay_buffer_config
        rows, dropped = [], 0
        for dataset in buffer.dataset_cfg:
            source = load_rows(dataset.anno_path)
            for index in sample_indices(len(source), dataset.sample_ratio, config.seed):
                row = source[index]
                ids = prompt_ids(tokenizer, row["prompt"])
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


def sample_indices(size: int, ratio: float, seed: int) -> list[int]:
    """Row indices for a ``sample_ratio``: a seeded subset below 1, whole repeats plus a subset above."""
    whole, fraction = divmod(ratio, 1)
    extra = random.Random(seed).sample(range(size), math.floor(fraction * size))
    return [*range(size)] * int(whole) + sorted(extra)


def step_groups(pool: PromptPool, config: RLTrainerConfig, step: int) -> tuple[int, list[dict]]:
    """(epoch, rows) for a step: each epoch visits the pool in its own seeded order."""
    size = config.dataflow_config.global_batch_size
    epoch, position = divmod(step - 1, pool.steps_per_epoch(size))
    order = list(range(len(pool.rows)))
    if config.replay_buffer_config.shuffle:
        random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
    return epoch, [pool.rows[i] for i in order[position * size : (position + 1) * size]]


def reserve_groups(pool: PromptPool, config: RLTrainerConfig, step: int) -> list[dict]:
    """Prompts to refill a step whose groups dynamic sampling dropped: ``max_retry_times`` batches
    drawn from the pool in a seeded order of the step's own."""
    flow = config.dataflow_config
    count = flow.max_retry_times * flow.global_batch_size if flow.enable_dynamic_sampling else 0
    order = random.Random(config.seed * 1_000_003 + 7919 * step).sample(
        range(len(pool.rows)), min(count, len(pool.rows))
    )
    return [pool.rows[i] for i in order]


def run(config: RLTrainerConfig, step: int, engines) -> dict:
    """Write the step's groups (``batch`` 0) and, with dynamic sampling, its reserve (``batch`` 1, 2, ...)."""
    epoch, rows = step_groups(engines.prompt_pool, config, step)
    size = config.dataflow_config.global_batch_size
    rows += reserve_groups(engines.prompt_pool, config, step)
    paths = engines.layout.step(step)
    write_rows(
        [{"step": step, "group": g, "batch": g // size, "epoch": epoch, **row} for g, row in enumerate(rows)],
        paths.prompts,
    )
    return {
        "prompts/epoch": epoch,
        "prompts/pool_size": len(engines.prompt_pool.rows),
        "prompts/dropped_too_long": engines.prompt_pool.dropped_too_long,
    }


def outputs(paths) -> list:
    return [paths.prompts]
