"""Rollout tokens/s: rlx's transformers backend against a bare ``model.generate`` on the same batch
(the demo's 16 prompts x 8 responses x 32 new tokens), with the same generation kwargs and seed, so
both sample the very same tokens. The difference is what rlx adds: padding the prompts, log-probs
of the sampled tokens, decoding, and the ``Generation`` records."""

from __future__ import annotations

import pytest
import torch
from harness import alternate, demo_prompts, demo_tokenizer, record

from conftest import PARAMS
from rlx.config import load
from rlx.samplers import TransformersSampler
from rlx.samplers.transformers_backend import generation_kwargs, stop_ids
from rlx.training.loading import load_policy

DEMO = load(PARAMS)
ROUNDS = 5
SEED = 0


@pytest.fixture(scope="module")
def batch(tiny_model):
    cfg, _ = tiny_model
    tokenizer = demo_tokenizer(tiny_model)
    prompts, _ = demo_prompts(tiny_model, tokenizer, DEMO.dataflow_config.global_batch_size)
    return load_policy(cfg.tiny_model.output_dir), tokenizer, prompts


def response_tokens(new_tokens: torch.Tensor, stops: set[int], pad: int) -> int:
    """Generated tokens up to and including each row's first stop token (pad after it does not count)."""
    total = 0
    for row in new_tokens.tolist():
        ends = [i for i, token in enumerate(row) if token in stops]
        total += ends[0] + 1 if ends else sum(token != pad for token in row)
    return total


def test_rollout_rlx_vs_bare(benchmark, batch):
    """Rounds alternate rlx and bare generate, so a drift in the machine's speed hits both alike."""
    model, tokenizer, prompts = batch
    params = DEMO.dataflow_config.sample_params
    kwargs = generation_kwargs(tokenizer, params)
    pad, width = tokenizer.pad_token_id, max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts])
    attention_mask = (torch.arange(width) >= torch.tensor([width - len(ids) for ids in prompts]).unsqueeze(-1)).long()

    def rollout():
        return TransformersSampler(model, tokenizer, DEMO.rollout_config).generate(prompts, params, seed=SEED)

    @torch.no_grad()
    def bare():
        torch.manual_seed(SEED)
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    rounds = alternate(benchmark, {"rlx": rollout, "bare": bare}, ROUNDS)
    outputs, out = rounds.last["rlx"], rounds.last["bare"]
    tokens = {
        "rlx": sum(len(o.response_ids) for o in outputs),
        "bare": response_tokens(out.sequences[:, width:], set(stop_ids(tokenizer, params)), pad),
    }
    for name in ("rlx", "bare"):
        record(f"rollout/{name}", {"tokens": tokens[name], "seconds": rounds.seconds[name]})
