"""Where rollout_config.max_mismatch_kl's default comes from: mismatch/k3_kl (the engine's log-probs against the
trainer's for the same sampled tokens, rlx.algo.correction) for a healthy engine and for broken syncs, at 25 M
and 200 M parameters (random-init Qwen3 with the demo's tokenizer).

The engine samples 16 responses of 48 tokens at temperature 1 with its KV cache (its log-probs are the
ones it sampled with); the trainer scores the padded batch in one forward (rlx.training.trainer.token_logprobs).
Healthy: the same float32 weights; an engine in bf16 (what a GPU engine holds; its kernels differ from the
trainer's, bf16 against float32 bounds that from above). Broken: the output head or one MLP projection left at
another initialisation (a sync that skipped one tensor); every weight from another initialisation."""

from __future__ import annotations

import copy

import pytest
import torch
from harness import random_model, record
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import make_project
from rlx.algo.correction import mismatch_metrics
from rlx.training.trainer import TokenBatch, token_logprobs

RESPONSES, LENGTH = 16, 48


def sampled(engine, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's responses to one prompt (prompt and response ids, ``[B, P + R]``) and its log-probs."""
    torch.manual_seed(0)
    prompt = torch.tensor([prompt_ids] * RESPONSES)
    out = engine.generate(
        prompt, do_sample=True, top_k=0, max_new_tokens=LENGTH, min_new_tokens=LENGTH, output_logits=True,
        return_dict_in_generate=True, pad_token_id=0,
    )  # fmt: skip
    logits = torch.stack(out.logits, dim=1).float()
    responses = out.sequences[:, prompt.shape[1] :]
    logp = torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return out.sequences, logp


def k3_against(trainer, sequences: torch.Tensor, engine_logp: torch.Tensor) -> float:
    """mismatch/k3_kl of the engine's log-probs against ``trainer``'s, over the response tokens."""
    prompt_len = sequences.shape[1] - LENGTH
    rows = sequences.tolist()
    batch = TokenBatch.from_ids([r[:prompt_len] for r in rows], [r[prompt_len:] for r in rows], pad_id=0)
    with torch.no_grad():
        train_logp, _ = token_logprobs(trainer, batch)
    rollout = torch.zeros_like(train_logp)
    rollout[:, prompt_len - 1 :] = engine_logp
    return mismatch_metrics(train_logp, rollout, batch.mask)["mismatch/k3_kl"]


def broken(model, other, names: list[str]):
    """``model`` with the tensors ``names`` taken from ``other`` (a sync that skipped them)."""
    engine = copy.deepcopy(model)
    state = dict(other.state_dict())
    engine.load_state_dict({name: state[name] for name in names}, strict=False)
    return engine


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_mismatch_of_healthy_and_broken_engines(benchmark, tmp_path, tiny_model, size):
    project = make_project(tmp_path, tiny_model)
    folder, parameters = random_model(project, size, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    trainer = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(1)
    other = AutoModelForCausalLM.from_config(trainer.config).eval()
    last_mlp = f"model.layers.{trainer.config.num_hidden_layers - 1}.mlp.down_proj.weight"
    engines = {
        "healthy float32": trainer,
        "healthy bf16 engine": copy.deepcopy(trainer).to(torch.bfloat16),
        "skipped output head": broken(trainer, other, ["lm_head.weight", "model.embed_tokens.weight"]),
        "skipped last MLP projection": broken(trainer, other, [last_mlp]),
        "every weight wrong": other,
    }
    prompt_ids = tokenizer("What is 17 + 25? Answer:")["input_ids"]

    def measure() -> dict[str, float]:
        return {name: k3_against(trainer, *sampled(engine, prompt_ids)) for name, engine in engines.items()}

    k3 = benchmark.pedantic(measure, rounds=1, iterations=1)
    record(f"mismatch_calibration/{size}", {"parameters": parameters, "k3_kl": k3})
    assert k3["healthy float32"] < k3["every weight wrong"]
