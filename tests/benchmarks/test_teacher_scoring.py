"""What on-policy distillation's teacher stage adds to a step: the teacher scoring a step's responses
(rlx.stages.teacher.score: no-grad forwards in pack_max_length micro-batches) against the train stage's
forward and backward of the same tokens under a student of the same size, at 25 M and 200 M parameters
(random-init Qwen3 with the demo's tokenizer), the sides alternated for 3 rounds.

The batch: 4 demo prompts x 8 responses (prompt_repeat_k) of 32 tokens. A teacher of the student's size costs a
forward pass, which a CPU does in about a third of a forward and backward; a larger teacher costs in
proportion to its size."""

from __future__ import annotations

import random

import pytest
from harness import FLOW, alternate, demo_prompts, demo_tokenizer, random_model, record

from conftest import PARAMS, make_project
from rlx.config import load
from rlx.stages.teacher import score
from rlx.training.loading import load_policy
from rlx.training.trainer import TokenBatch, token_logprobs

ROUNDS, PROMPTS, RESPONSE = 3, 4, 32


def rollouts(tiny_model) -> list[dict]:
    tokenizer = demo_tokenizer(tiny_model)
    prompts, _ = demo_prompts(tiny_model, tokenizer, PROMPTS)
    draw = random.Random(0)
    return [
        {"prompt_ids": prompt, "response_ids": [draw.randrange(4, 300) for _ in range(RESPONSE)],
         "prompt_len": len(prompt), "response_len": RESPONSE, "response_mask": None}
        for prompt in prompts
    ]  # fmt: skip


def update_pass(student, batch: TokenBatch, sampling) -> None:
    """The train stage's scoring of the batch: the log-probs with their graph, and a backward through them."""
    logp, _ = token_logprobs(student, batch, sampling)
    (-(logp * batch.mask).sum() / batch.mask.sum()).backward()
    student.zero_grad(set_to_none=True)


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_teacher_scoring_against_the_updates_scoring(benchmark, tmp_path, tiny_model, size):
    project = make_project(tmp_path, tiny_model)
    folder, parameters = random_model(project, size, tmp_path)
    config = load(PARAMS, [f"load_from={folder}", f"tokenizer_path={folder}"])
    teacher, student = load_policy(folder).requires_grad_(False), load_policy(folder).train()
    rows, sampling = rollouts(tiny_model), config.dataflow_config.sample_params
    batch = TokenBatch.from_ids([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], 0)
    measured = alternate(
        benchmark,
        {
            "teacher": lambda: score(teacher, rows, config, pad_id=0),
            "update": lambda: update_pass(student, batch, sampling),
        },
        ROUNDS,
    )
    seconds = {side: sorted(values)[len(values) // 2] for side, values in measured.seconds.items()}
    ratio = seconds["teacher"] / seconds["update"]
    tokens = len(rows) * RESPONSE
    record(f"teacher_scoring/{size}", {"parameters": parameters, "responses": len(rows), "tokens": tokens,
                                       "seconds": measured.seconds, "teacher_over_update": ratio,
                                       "teacher_tokens_per_s": tokens / seconds["teacher"]})  # fmt: skip
    assert len(measured.last["teacher"]) == len(rows) == PROMPTS * FLOW.prompt_repeat_k
    assert 0 < ratio < 1, f"a teacher forward cost {ratio:.2f}x the update's forward and backward"
