"""Train tokens/s of one policy update: rlx's DeepSpeed trainer (ZeRO-1, fp32) through the train
stage's micro-batch loss against a bare torch loop (plain model, ``torch.optim.AdamW``), on the same
micro-batches of the same demo rollouts with the same loss from rlx.algo.

Timed: forward, backward and optimizer step of one update, what ``perf/train_tokens_per_s`` covers.
Set-up (DeepSpeed's initialisation, old log-probs) is outside the timing; each side runs a warm-up
update first."""

from __future__ import annotations

import pytest
import torch
from harness import alternate, demo_prompts, demo_tokenizer, record
from train_loop import bare_optimizer, bare_update, prepare, rlx_update, rollout_rows, update_tokens
from transformers import AutoModelForCausalLM

from conftest import PARAMS
from rlx.config import load
from rlx.judgers import get
from rlx.samplers import TransformersSampler
from rlx.samplers.transformers_backend import stop_ids
from rlx.training.loading import load_policy
from rlx.training.trainer import PolicyTrainer

DEMO = load(PARAMS)
ROUNDS = 5


@pytest.fixture(scope="module")
def update(tiny_model):
    """The demo's first step, ready to train on: rollouts, rewards, the trainer and its micro-batches."""
    cfg, _ = tiny_model
    model_dir = cfg.tiny_model.output_dir
    tokenizer = demo_tokenizer(tiny_model)
    prompts, golds = demo_prompts(tiny_model, tokenizer, DEMO.dataflow_config.global_batch_size)
    params = DEMO.dataflow_config.sample_params
    sampler = TransformersSampler(load_policy(model_dir), tokenizer, DEMO.rollout_config)
    outputs = sampler.generate(prompts, params, seed=0)
    judger = get("arith")
    rewards = torch.tensor([judger.score(out.text, gold) for out, gold in zip(outputs, golds, strict=True)])
    rows = rollout_rows(prompts, [out.response_ids for out in outputs], set(stop_ids(tokenizer, params)))
    trainer = PolicyTrainer(DEMO.train_worker_cfg, model_dir, model_dir / "no-state", total_optimizer_steps=100)
    micros = prepare(DEMO, rows, rewards, trainer, tokenizer)
    return model_dir, rows, trainer, micros


def test_train_rlx_vs_bare(benchmark, update):
    """Rounds alternate rlx's update and the bare loop's, so a drift in the machine's speed hits both alike."""
    model_dir, rows, trainer, micros = update
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = bare_optimizer(model, DEMO)
    sides = {
        "rlx": lambda: rlx_update(trainer, DEMO, micros),
        "bare": lambda: bare_update(model, optimizer, DEMO, micros),
    }
    rounds = alternate(benchmark, sides, ROUNDS)
    for name in sides:
        record(
            f"train/{name}",
            {"tokens": update_tokens(rows), "micro_batches": len(micros), "seconds": rounds.seconds[name]},
        )
