"""Rollout tokens/s: rlx's transformers backend against a bare ``model.generate`` on the same batch
(the demo's 16 prompts x 8 responses), both sampling at the demo's temperature, every response exactly
32 tokens long (``min_tokens`` = ``max_tokens``), so both sides take the same number of decoding steps.
(Letting each side stop at its own EOS made the longest response, and so the step count, differ by
chance between the sides: 0.93x on one machine, 0.77x on another.) The difference is what rlx adds:
sampling each row from its own seeded stream, padding the prompts, log-probs of the sampled tokens,
decoding, and the ``Generation`` records."""

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
    params = params.model_copy(update={"min_tokens": params.max_tokens})
    sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
    kwargs = generation_kwargs(tokenizer, params) | sampling  # generate's own sampler, one stream for the batch
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
    assert tokens == dict.fromkeys(tokens, len(prompts) * params.max_tokens), tokens
    for name in ("rlx", "bare"):
        record(f"rollout/{name}", {"tokens": tokens[name], "seconds": rounds.seconds[name]})
