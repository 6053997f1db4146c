"""The GPU check (``make gpu-check``, ``scripts/gpu_check.sh``): LMDeploy and bf16 DeepSpeed on one CUDA GPU.

Skipped where there is no GPU or no LMDeploy. The model is built on the spot (nothing is downloaded):
Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, vocabulary 151936, tied
embeddings) with random weights in bf16, and the demo's tokenizer. The report, printed and written
to ``$RLX_GPU_REPORT`` (default ``gpu_check.json`` in pytest's temp folder), has three parts:

- ``host_copy``: GB/s of a checkpoint's host copy (``rlx.training.safe_checkpoint.to_host``, page-locked) against a
  plain ``.cpu()``, 4 GiB of bf16, and again once the first copy is freed (torch keeps its page-locked blocks);
- ``rollout``: tokens/s of LMDeploy's PyTorch engine and of the transformers backend on the same 512
  prompts x 256 new tokens (every response runs to 256);
- ``weight_sync``: one bf16 AdamW update, sent to the running engine; LMDeploy's log-probs of a fixed
  greedy batch against the trainer's before it (they must differ) and after it (they must agree);
- ``lora_weight_sync``: the same for a LoRA policy (peft adapter, one update), sent as merged weights;
- ``pipeline``: 5 `rlx fit` steps with LMDeploy rollouts and bf16 ZeRO-2, with each step's time
  breakdown, peak GPU memory and ``perf/throughput`` as verl logs it (prompt plus response tokens of
  the step, per second of the step, per GPU);
- ``lora_pipeline``: 3 such steps training a rank-16 LoRA adapter, with its parameter and optimizer-state
  counts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch

from conftest import make_project
from rlx import config
from rlx.algo.correction import mismatch_metrics
from rlx.config import RolloutConfig, SampleParams
from rlx.samplers import TransformersSampler
from rlx.store.layout import RunLayout
from rlx.tasks.data import prompt_ids
from rlx.training.loading import load_policy
from rlx.training.trainer import TokenBatch, token_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("lmdeploy") is None, reason="needs the gpu extra (LMDeploy)"),
]

REPORT: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
QWEN25_05B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
)  # fmt: skip
ENGINE: dict = {}  # the LMDeploy sampler the first two parts share (one engine start)


@pytest.fixture(autouse=True)
def report(tmp_path_factory):
    """The report so far, written after every part: a part that hangs past the script's limit loses
    only its own figures."""
    yield REPORT
    path = Path(os.environ.get("RLX_GPU_REPORT", tmp_path_factory.getbasetemp() / "gpu_check.json"))
    path.write_text(json.dumps(REPORT, indent=2) + "\n")
    print(f"\nGPU check report ({path}):\n{json.dumps(REPORT, indent=2)}")


@pytest.fixture(scope="module")
def qwen_shaped(untrained_model, tmp_path_factory):
    """The demo's data and tokenizer with a random Qwen2.5-0.5B-shaped model in bf16, as ``tiny_model`` gives them."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    cfg, metrics = untrained_model
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir, padding_side="left")
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    folder = tmp_path_factory.mktemp("qwen2.5-0.5b-shaped")
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    shaped = cfg.model_copy(update={"tiny_model": cfg.tiny_model.model_copy(update={"output_dir": folder})})
    return shaped, metrics, tokenizer


def lmdeploy_sampler(folder, tokenizer):
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    if "sampler" not in ENGINE:
        config = RolloutConfig(backend="lmdeploy", gpu_memory_utilization=0.4, context_length=1024)
        ENGINE["sampler"] = LMDeploySampler(folder, tokenizer, config)
    return ENGINE["sampler"]


def close_engine() -> None:
    """Give the GPU back before the pipeline starts its own engine."""
    sampler = ENGINE.pop("sampler", None)
    if sampler is not None:
        sampler.sleep()
        sampler.pipe.close()
    torch.cuda.empty_cache()


def tokens_per_second(sampler, prompts, params) -> float:
    sampler.generate(prompts[:8], params, seed=0)  # warm-up: kernels, caches, CUDA graphs
    torch.cuda.synchronize()
    started = time.perf_counter()
    outputs = sampler.generate(prompts, params, seed=1)
    torch.cuda.synchronize()
    return sum(len(out.response_ids) for out in outputs) / (time.perf_counter() - started)


def questions(tokenizer, count: int) -> list[list[int]]:
    texts = [f"What is {a} + {b}?" for a in range(32) for b in range(32)][:count]
    return [prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in texts]


def test_host_copies_are_page_locked_exact_and_faster():
    from rlx.training.safe_checkpoint import copies_done, to_host

    source = torch.empty(2**31, dtype=torch.bfloat16, device="cuda").normal_()  # 4 GiB

    def gb_per_s(copy) -> tuple[float, torch.Tensor]:
        torch.cuda.synchronize()
        started = time.perf_counter()
        host = copy()
        copies_done()
        return source.numel() * source.element_size() / 1e9 / (time.perf_counter() - started), host

    pageable, plain = gb_per_s(source.cpu)
    first, locked = gb_per_s(lambda: to_host(source))
    assert locked.is_pinned() and torch.equal(locked, plain)
    del locked, plain
    again, _ = gb_per_s(lambda: to_host(source))
    REPORT["host_copy"] = {"pageable_gb_s": pageable, "page_locked_first_gb_s": first, "page_locked_again_gb_s": again}
    assert again > pageable


def test_rollout_tokens_per_second_lmdeploy_and_transformers(qwen_shaped):
    cfg, _, tokenizer = qwen_shaped
    folder = cfg.tiny_model.output_dir
    prompts, params = questions(tokenizer, 512), SampleParams(max_tokens=256, min_tokens=256, temperature=1.0)
    # The transformers backend keeps every step's logits (151936 wide): 64 sequences a batch fit in memory.
    hf_config = RolloutConfig(backend="transformers", rollout_max_batch_size=64, dtype="bfloat16")
    hf = TransformersSampler(load_policy(folder, "bfloat16"), tokenizer, hf_config)
    hf_rate = tokens_per_second(hf, prompts, params)
    del hf
    torch.cuda.empty_cache()
    fast = tokens_per_second(lmdeploy_sampler(folder, tokenizer), prompts, params)
    REPORT["rollout"] = {
        "prompts": len(prompts),
        "new_tokens": 256,
        "transformers_batch": 64,
        "transformers_tokens_per_s": hf_rate,
        "lmdeploy_tokens_per_s": fast,
        "ratio": fast / hf_rate,
    }


def on_the_mask(generations, like: torch.Tensor) -> torch.Tensor:
    """Rollout log-probs placed where ``TokenBatch.mask`` marks each response token."""
    out = torch.zeros_like(like)
    for row, gen in enumerate(generations):
        start = len(gen.prompt_ids) - 1
        out[row, start : start + len(gen.logprobs)] = torch.tensor(gen.logprobs)
    return out


def agreement(model, generations, pad_id: int) -> dict[str, float]:
    batch = TokenBatch.from_ids([g.prompt_ids for g in generations], [g.response_ids for g in generations], pad_id)
    with torch.no_grad():
        trainer = token_logprobs(model, batch)[0]
    return mismatch_metrics(trainer, on_the_mask(generations, batch.mask), batch.mask)


def test_weight_sync_after_one_bf16_update(qwen_shaped):
    """LMDeploy's log-probs disagree with the updated trainer's until the update is sent, then agree."""
    cfg, _, tokenizer = qwen_shaped
    folder = cfg.tiny_model.output_dir
    try:
        sampler, policy = lmdeploy_sampler(folder, tokenizer), load_policy(folder, "bfloat16")
        prompts, greedy = questions(tokenizer, 32), SampleParams(max_tokens=32, temperature=0.0, do_sample=False)
        before = sampler.generate(prompts, greedy, seed=0)
        start = agreement(policy, before, tokenizer.pad_token_id)
        batch = TokenBatch.from_ids(prompts, [g.response_ids for g in before], tokenizer.pad_token_id)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        loss = -(token_logprobs(policy, batch)[0] * batch.mask).sum() / batch.mask.sum()
        loss.backward()
        optimizer.step()
        stale = agreement(policy, before, tokenizer.pad_token_id)
        started = time.perf_counter()
        sampler.load_weights(policy.state_dict().items())
        sync_s = time.perf_counter() - started
        synced = agreement(policy, sampler.generate(prompts, greedy, seed=0), tokenizer.pad_token_id)
    except BaseException:
        close_engine()
        raise
    REPORT["weight_sync"] = {"before_update": start, "stale": stale, "after_sync": synced, "sync_s": sync_s}
    assert stale["mismatch/abs_logprob_diff"] > 10 * synced["mismatch/abs_logprob_diff"]
    assert synced["mismatch/k3_kl"] < 1e-2


def test_a_lora_policy_syncs_as_merged_weights(qwen_shaped):
    """A LoRA policy (peft, rank 16 on every linear layer) after one bf16 update of its adapter reaches
    the running engine as merged weights (``rlx.training.lora.full_weights``); LMDeploy's log-probs then agree
    with the adapted model's, as after a full-weight sync."""
    from peft import get_peft_model

    from rlx.config import LoraConfig
    from rlx.training.lora import full_weights, peft_config

    cfg, _, tokenizer = qwen_shaped
    try:
        sampler = lmdeploy_sampler(cfg.tiny_model.output_dir, tokenizer)
        policy = get_peft_model(load_policy(cfg.tiny_model.output_dir, "bfloat16"), peft_config(LoraConfig(rank=16)))
        prompts, greedy = questions(tokenizer, 32), SampleParams(max_tokens=32, temperature=0.0, do_sample=False)
        responses = [g.response_ids for g in sampler.generate(prompts, greedy, seed=0)]
        batch = TokenBatch.from_ids(prompts, responses, tokenizer.pad_token_id)
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
        (-(token_logprobs(policy, batch)[0] * batch.mask).sum() / batch.mask.sum()).backward()
        optimizer.step()
        stale = agreement(policy, sampler.generate(prompts, greedy, seed=0), tokenizer.pad_token_id)
        started = time.perf_counter()
        sampler.load_weights(full_weights(policy))
        sync_s = time.perf_counter() - started
        synced = agreement(policy, sampler.generate(prompts, greedy, seed=0), tokenizer.pad_token_id)
    finally:
        close_engine()
    REPORT["lora_weight_sync"] = {"stale": stale, "after_sync": synced, "sync_s": sync_s}
    assert stale["mismatch/abs_logprob_diff"] > 10 * synced["mismatch/abs_logprob_diff"]
    assert synced["mismatch/k3_kl"] < 1e-2


def verl_throughput(layout: RunLayout, step: int, seconds: float) -> float:
    """verl's ``perf/throughput``: the step's prompt plus response tokens / step time / GPUs (one here)."""
    import pyarrow.parquet as pq

    table = pq.read_table(layout.step(step).rollouts, columns=["prompt_ids", "response_ids"]).to_pylist()
    return sum(len(row["prompt_ids"]) + len(row["response_ids"]) for row in table) / seconds


PIPELINE = [
    "resources.accelerator=GPU",
    "rollout_config.backend=lmdeploy",
    "rollout_config.gpu_memory_utilization=0.3",
    "rollout_config.context_length=1024",
    "train_worker_cfg.deepspeed.precision=bf16",
    "train_worker_cfg.deepspeed.zero_stage=2",
    "dataflow_config.global_batch_size=64",
    "dataflow_config.prompt_repeat_k=8",
    "dataflow_config.sample_params.max_tokens=256",
    "wandb.mode=disabled",
]
STEP_KEYS = ("time/", "perf/", "mismatch/", "train/trainable_params", "train/optimizer_state_bytes", "checkpoint/")


def fit_on_gpu(tmp_path, qwen_shaped, overrides: list[str]) -> dict:
    """`rlx fit` of the demo project with the Qwen2.5-0.5B-shaped model: each step's times and sizes."""
    from rlx.run.fit import fit

    close_engine()
    cfg, metrics, _ = qwen_shaped
    project = make_project(tmp_path, (cfg, metrics))
    torch.cuda.reset_peak_memory_stats()
    with contextlib.chdir(project):
        history = fit(project / "params.yaml", overrides)
        layout = RunLayout(config.load(project / "params.yaml", overrides).work_dir.resolve())
    return {
        "peak_gpu_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,  # engine and trainer: one process
        "peak_gpu_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "steps": [
            {
                **{k: v for k, v in m.items() if k.startswith(STEP_KEYS)},
                "perf/throughput": verl_throughput(layout, step, m["time/step"]),
            }
            for step, m in enumerate(history, start=1)
        ],
    }


def test_five_fit_steps_with_lmdeploy_and_bf16_zero2(tmp_path, qwen_shaped):
    REPORT["pipeline"] = fit_on_gpu(tmp_path, qwen_shaped, [*PIPELINE, "rollout_steps=5"])
    assert len(REPORT["pipeline"]["steps"]) == 5


def test_three_lora_fit_steps_with_lmdeploy_and_bf16_zero2(tmp_path, qwen_shaped):
    """The same run with a rank-16 LoRA adapter: LMDeploy starts from the base and gets merged weights."""
    lora = ["train_worker_cfg.lora={rank: 16, alpha: 32.0}", "train_worker_cfg.optim_cfg.lr=1e-5"]
    REPORT["lora_pipeline"] = fit_on_gpu(tmp_path, qwen_shaped, [*PIPELINE, *lora, "rollout_steps=3"])
    steps = REPORT["lora_pipeline"]["steps"]
    assert len(steps) == 3 and 0 < steps[0]["train/trainable_params"] < 5e7
