"""Stage ``teacher``: each response's tokens scored by its teacher (on-policy distillation).

Output ``step-N/teacher.parquet``, one row per response in rollout order: ``step, group, sample``,
``teacher`` (its name, null for a row no teacher scores), ``teacher_logprobs`` (the teacher's log-prob
of each response token, null at an agent's tool tokens, as ``rollout_logprobs``), ``reverse_kl`` (the
sampled tokens' summed ``log p_student - log p_teacher``, the student's as the rollout engine sampled
it) and ``teacher_fingerprint``. No rows without ``teacher_config``. The train stage turns them into
per-token advantages (rlx.algo.distill); they are on disk, so replay and resume score nothing again.

A teacher scores as the trainer scores the policy (rlx.training.trainer.token_logprobs: response
positions only, the rollouts' sampling distribution), in micro-batches of ``pack_max_length`` tokens,
with the model kept loaded between steps (one copy, whatever its size).
"""

from __future__ import annotations

import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import pyarrow as pa
import torch

from rlx.config import RLTrainerConfig
from rlx.errors import UserError
from rlx.store.artifacts import read_json, read_rows, write_rows
from rlx.store.layout import StepPaths
from rlx.training.packing import micro_batches
from rlx.training.teachers import Teacher, located
from rlx.training.trainer import TokenBatch, token_logprobs

TEACHER_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("group", pa.int64()),
        ("sample", pa.int64()),
        ("teacher", pa.string()),
        ("teacher_fingerprint", pa.string()),
        ("teacher_logprobs", pa.list_(pa.float32())),
        ("reverse_kl", pa.float64()),
    ]
)


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    rollouts = read_rows(paths.checked(paths.rollouts))
    if config.teacher_config is None:
        write_rows([], paths.teacher, schema=TEACHER_SCHEMA)
        return {}
    rows = [{"step": step, "group": r["group"], "sample": r["sample"]} for r in rollouts]
    start = paths.run.step(0)
    recorded = {name: record["fingerprint"] for name, record in read_json(start.checked(start.teachers)).items()}
    started, scored = time.perf_counter(), 0
    for teacher in located(config):
        mine = [i for i, r in enumerate(rollouts) if routed_to(config, r["data_source"]) == teacher.name]
        if not mine:
            continue
        fingerprint = recorded.get(teacher.name)
        model = engines.teacher(teacher, check=partial(check_fingerprint, teacher, fingerprint, start.teachers))
        logprobs = score(model, [rollouts[i] for i in mine], config, engines.tokenizer.pad_token_id)
        for index, values in zip(mine, logprobs, strict=True):
            rows[index].update(teacher=teacher.name, teacher_fingerprint=fingerprint, teacher_logprobs=values)
            rows[index]["reverse_kl"] = reverse_kl(rollouts[index]["rollout_logprobs"], values)
        scored += sum(scored_tokens(values) for values in logprobs)
    write_rows(rows, paths.teacher, schema=TEACHER_SCHEMA)
    return metrics(rollouts, rows, scored, time.perf_counter() - started)


def routed_to(config: RLTrainerConfig, data_source: str) -> str | None:
    teacher = config.teacher_config.teacher_of(data_source)
    return None if teacher is None else teacher.name


def check_fingerprint(teacher: Teacher, recorded: str | None, record: Path) -> None:
    """Refuse a teacher whose weights are not those the run recorded at its start (step 0's teachers.json),
    before it is loaded (once per process: the copy in memory cannot change)."""
    now = teacher.fingerprint()
    if now != recorded:
        raise UserError(
            f"{teacher.field} ({teacher.name}): {teacher.path}'s weights are not those the run started with "
            f"(fingerprint {now[:12]}, recorded {str(recorded)[:12]} in {record}); a run's teacher cannot "
            "change: restore it, or start a new run"
        )


def score(model, rollouts: list[dict], config: RLTrainerConfig, pad_id: int) -> list[list[float | None]]:
    """Each rollout's response tokens scored by ``model``: its log-prob of each, None at a tool's token."""
    lengths = [row["prompt_len"] + row["response_len"] for row in rollouts]
    budget, sampling = config.train_worker_cfg.pack_max_length, config.dataflow_config.sample_params
    out = []
    for indices in micro_batches(list(range(len(rollouts))), lengths, budget):
        rows = [rollouts[i] for i in indices]
        masks = [row.get("response_mask") for row in rows]
        batch = TokenBatch.from_ids([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id, masks)
        with torch.no_grad():
            logp = token_logprobs(model, batch, sampling)[0]
        for row, values, scored in zip(rows, logp, batch.mask, strict=True):
            start, end = row["prompt_len"] - 1, row["prompt_len"] - 1 + row["response_len"]
            kept = zip(values[start:end].tolist(), scored[start:end].tolist(), strict=True)
            out.append([value if model_made else None for value, model_made in kept])
    return out


def reverse_kl(student: list[float | None], teacher: list[float | None]) -> float:
    """The response's summed ``log p_student - log p_teacher`` over the tokens the model sampled."""
    return sum(s - t for s, t in zip(student, teacher, strict=True) if t is not None)


def scored_tokens(values: list[float | None]) -> int:
    return sum(value is not None for value in values)


def metrics(rollouts: list[dict], rows: list[dict], tokens: int, seconds: float) -> dict:
    """Reverse KL to the teachers per token, over all scored rows and per data source; scoring speed."""
    kl, counts = defaultdict(float), defaultdict(int)
    for rollout, row in zip(rollouts, rows, strict=True):
        if row.get("teacher") is not None:
            for key in ("mean", rollout["data_source"]):
                kl[key] += row["reverse_kl"]
                counts[key] += scored_tokens(row["teacher_logprobs"])
    out = {f"teacher/reverse_kl/{key}": kl[key] / max(1, counts[key]) for key in kl}
    out.update({"teacher/tokens": tokens, "teacher/tokens_per_s": tokens / max(seconds, 1e-9)})
    out["teacher/unscored_responses"] = sum(row.get("teacher") is None for row in rows)
    return out


def outputs(paths) -> list:
    return [paths.teacher]
