"""Stage ``rollout``: ``prompt_repeat_k`` responses per prompt group from the previous step's policy,
or with ``dataflow_config.max_staleness`` k from the policy k steps before it (rlx.config.rollout_policy_step).

With ``dataflow_config.enable_dynamic_sampling``, groups whose responses all score the same are
dropped and replaced from the step's reserve prompts, up to ``max_retry_times`` extra batches; the
rows then carry their verdicts (column ``judgment``), which the judge stage reuses.

Output ``step-N/rollouts.parquet``, one row per response, ordered group by group: ``step, group,
sample, data_source, ground_truth, prompt_ids, response_ids, response_text, rollout_logprobs,
finish_reason, prompt_len, response_len, policy_step`` (whose policy generated it) and ``prompt`` (the
chat messages as JSON). With ``dataflow_config.agent_loop_config`` (rlx.agents), a row is a multi-turn
rollout: ``response_ids`` hold every turn, tool results included, and the row adds ``response_mask``
(per response token: 1 the model's, 0 a tool's), ``final_text`` (the model's last turn, which judgers
score), ``turns``, ``tool_calls`` (JSON: each call's turn, tool, arguments, result shown, error,
timed_out, seconds) and ``environment_reward``/``environment_error``; ``rollout_logprobs`` is null at
tool tokens. The tools' results are data here: nothing downstream (judging, training, replay) calls a
tool again.
"""

from __future__ import annotations

import json
import time

from rlx import seeds
from rlx.agents.loop import reset_row, tool_use
from rlx.agents.programs import agent_loop
from rlx.config import RLTrainerConfig, rollout_policy_step, staleness
from rlx.judgers import Panel
from rlx.judgers.rows import VERDICT, judge_rollouts
from rlx.store.artifacts import read_rows, write_rows
from rlx.store.layout import StepPaths

draws_random_numbers = False  # every row samples from its own seeded stream: safe in a background thread


def off_policy_advice(config: RLTrainerConfig) -> str | None:
    """What a run that may sample off the policy (``allow_off_policy_sampling``) should hear as it starts."""
    flow = config.dataflow_config
    if not flow.allow_off_policy_sampling:
        return None
    sampling = flow.sample_params
    return (
        f"dataflow_config.allow_off_policy_sampling: training rollouts sample with repetition_penalty "
        f"{sampling.repetition_penalty} and min_tokens {sampling.min_tokens}, which the trainer does not score, so "
        "every update is off-policy by as much as mismatch/k3_kl says (past rollout_config.max_mismatch_kl the run "
        "stops)"
    )


def sampling_seed(config: RLTrainerConfig, step: int) -> int:
    """Each step samples with its own seed, fixed by the run's seed: a rerun draws the same responses."""
    params = config.dataflow_config.sample_params
    return seeds.derive(params.seed if params.seed is not None else config.seed, step)


def sample_groups(config: RLTrainerConfig, step: int, engines, groups: list[dict], seed: int) -> list[dict]:
    """``prompt_repeat_k`` responses for each group, as rollout rows in group order."""
    flow = config.dataflow_config
    k, policy = flow.prompt_repeat_k, rollout_policy_step(step, flow.max_staleness)
    sampler, repeated = engines.rollouts.sampler(policy), [group for group in groups for _ in range(k)]
    if flow.agent_loop_config is None:
        generations = sampler.generate([group["prompt_ids"] for group in repeated], flow.sample_params, seed=seed)
    else:
        loop = agent_loop(flow.agent_loop_config, engines.tokenizer, flow.sample_params)
        starts = loop.starts([prompt_row(group) for group in repeated], [group["prompt_ids"] for group in repeated])
        generations = loop.run(sampler, starts, seed)
    rows = []
    for position, out in enumerate(generations):
        group = groups[position // k]
        rows.append(
            {
                "step": step,
                "group": group["group"],
                "sample": position % k,
                "data_source": group["data_source"],
                "ground_truth": group["ground_truth"],
                "prompt": group["prompt"],
                "prompt_ids": out.prompt_ids,
                "response_ids": out.response_ids,
                "response_text": out.text,
                "rollout_logprobs": out.logprobs,
                "finish_reason": out.finish_reason,
                "prompt_len": len(out.prompt_ids),
                "response_len": len(out.response_ids),
                "policy_step": policy,
                **(out.columns() if flow.agent_loop_config else {}),
            }
        )
    return rows


def prompt_row(group: dict) -> dict:
    """The prompt group as an agent's environment is reset with it (rlx.agents.loop.reset_row)."""
    return reset_row(group["data_source"], json.loads(group["prompt"]), group["ground_truth"])


def informative_groups(config: RLTrainerConfig, rows: list[dict], panel: Panel) -> list[list[dict]]:
    """The groups whose rewards (as the judge stage gives them, overlong penalty included) are not all
    equal: the only ones that carry a gradient (DAPO). Each row keeps its verdict for the judge stage."""
    k = config.dataflow_config.prompt_repeat_k
    for row, verdict in zip(rows, judge_rollouts(config, panel, rows), strict=True):
        row[VERDICT] = verdict
    groups = [rows[i : i + k] for i in range(0, len(rows), k)]
    return [group for group in groups if len({row[VERDICT]["reward"] for row in group}) > 1]


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    flow = config.dataflow_config
    prompts = read_rows(paths.checked(paths.prompts))
    batches = [[g for g in prompts if g["batch"] == b] for b in range(max(g["batch"] for g in prompts) + 1)]
    started = time.perf_counter()
    rows = sample_groups(config, step, engines, batches[0], sampling_seed(config, step))
    generated, metrics, tokens = 1, {}, sum(row["response_len"] for row in rows)
    if flow.enable_dynamic_sampling:
        # Dynamic sampling (DAPO, Yu et al., 2025): keep informative groups, refill from the reserve.
        panel = Panel(config.judger_config)
        kept = informative_groups(config, rows, panel)
        while len(kept) < flow.global_batch_size and generated < len(batches):
            seed = seeds.derive(sampling_seed(config, step), generated)  # rows draw seed + i: keep the batches apart
            extra = sample_groups(config, step, engines, batches[generated], seed)
            tokens += sum(row["response_len"] for row in extra)
            kept += informative_groups(config, extra, panel)
            generated += 1
        if kept:  # with none at all, train on the first batch: its advantages are 0, the update a no-op
            rows = [row for group in kept[: flow.global_batch_size] for row in group]
        metrics = {"filter/kept_groups": len(kept[: flow.global_batch_size]), "filter/generated_batches": generated}
    seconds = time.perf_counter() - started
    metrics["rollout/engine_digest"] = engines.rollouts.engine_digest(rollout_policy_step(step, flow.max_staleness))
    write_rows(rows, paths.rollouts)
    lengths = [row["response_len"] for row in rows]
    lags = [staleness(row) for row in rows]
    return {
        **metrics,
        "async/staleness/mean": sum(lags) / len(lags),
        "async/staleness/max": max(lags),
        "response/response_len/mean": sum(lengths) / len(lengths),
        "response/response_len/max": max(lengths),
        "response/truncated_frac": sum(row["finish_reason"] == "length" for row in rows) / len(rows),
        "perf/rollout_tokens_per_s": tokens / seconds,
        **(tool_use(rows, "agent") if flow.agent_loop_config else {}),
    }


def outputs(paths) -> list:
    return [paths.rollouts]
