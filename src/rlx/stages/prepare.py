"""Stage ``prepare``: the step's prompt groups, drawn from the datasets in a seeded order per epoch.

Output ``step-N/prompts.parquet``, one row per group: ``step, group, batch, epoch, dataset, index,
data_source, prompt`` (chat messages as JSON), ``prompt_ids, ground_truth``. ``batch`` 0 is the step's
``global_batch_size`` groups; with dynamic sampling, batches 1, 2, ... are the reserve it refills from.
Also ``step-N/run_length.json``: the run's length in steps (``rollout_steps``, or from the prompt pool,
the tokenizer, ``max_prompt_length`` and ``global_batch_size``), which the later stages read from it.
"""

from __future__ import annotations

import random

from rlx import seeds
from rlx.config import RLTrainerConfig
from rlx.store.artifacts import write_json, write_rows
from rlx.store.layout import StepPaths
from rlx.tasks.data import PromptPool, run_length


def step_groups(pool: PromptPool, config: RLTrainerConfig, step: int) -> tuple[int, list[dict]]:
    """(epoch, rows) for a step: each epoch visits the pool in its own seeded order."""
    size = config.dataflow_config.global_batch_size
    epoch, position = divmod(step - 1, pool.steps_per_epoch(size))
    order = list(range(len(pool.rows)))
    if config.replay_buffer_config.shuffle:
        random.Random(seeds.derive(config.seed, epoch)).shuffle(order)
    return epoch, [pool.rows[i] for i in order[position * size : (position + 1) * size]]


def reserve_groups(pool: PromptPool, config: RLTrainerConfig, step: int) -> list[dict]:
    """Prompts to refill a step whose groups dynamic sampling dropped: ``max_retry_times`` batches
    drawn from the pool in a seeded order of the step's own."""
    flow = config.dataflow_config
    count = flow.max_retry_times * flow.global_batch_size if flow.enable_dynamic_sampling else 0
    order = random.Random(seeds.derive(config.seed, 7919 * step)).sample(
        range(len(pool.rows)), min(count, len(pool.rows))
    )
    return [pool.rows[i] for i in order]


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    """Write the step's groups (``batch`` 0) and, with dynamic sampling, its reserve (``batch`` 1, 2, ...)."""
    epoch, rows = step_groups(engines.prompt_pool, config, step)
    size = config.dataflow_config.global_batch_size
    rows += reserve_groups(engines.prompt_pool, config, step)
    write_json({"total_steps": run_length(config, engines.prompt_pool)}, paths.run_length)
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
    return [paths.prompts, paths.run_length]
