"""The GPU check (``make gpu-check``, ``scripts/gpu_check.sh``): LMDeploy and bf16 DeepSpeed on one CUDA GPU.

Skipped where there is no GPU or no LMDeploy. The model is built on the spot (nothing is downloaded):
Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, vocabulary 151936, tied
embeddings, 494 M parameters) with random weights in bf16, and the demo's tokenizer. The report is
written to ``$RLX_GPU_REPORT`` (default ``gpu_check.json`` in pytest's temp folder) after every test,
so a part cut off by the script's time limit loses only its own figures. Its parts, in order:

- ``host_copy``: GB/s of a checkpoint's host copy (``rlx.training.safe_checkpoint.to_host``, page-locked)
  against a plain ``.cpu()``, 4 GiB of bf16, and again once the first copy is freed;
- ``rollout`` (a): rlx's LMDeploy rollout against LMDeploy's own batch inference (``Pipeline.infer``) on
  the same engine, prompts, sampling settings and seeds, 512 prompts x 256 new tokens: tokens/s of
  each, rlx's as a share of LMDeploy's (target >= 0.9), and LMDeploy's without per-token log-probs
  (tests/helpers/engine_pace);
- ``weight_sync`` (b): one bf16 AdamW update, sent to the running engine; LMDeploy's log-probs of a fixed
  greedy batch against the trainer's before it (they must differ) and after it (they must agree);
- ``engine_settings``: rlx's rollout of (a) again on a fresh engine per setting (``ENGINE_SWEEP``:
  no CUDA graphs, a larger prefill, max_batch_size 512, a larger KV cache), as a share of (a)'s;
- ``training_mfu``: one bf16 ZeRO-2 trainer, 256 rollouts of 20-40 + 256 tokens, the update's forward and
  backward and the old log-probs' forward as MFU under each setting (tests/helpers/train_pace: packing
  budget and so micro-batch count, attention implementation, activation checkpointing, logits_to_keep);
- ``pipeline`` (d): 3 `rlx fit` steps with LMDeploy rollouts and bf16 ZeRO-2, each step's time split into
  its parts (``time/step/*``, with ``other``, the share no part measured), MFU, peak GPU memory and
  ``perf/throughput`` as verl logs it (prompt plus response tokens of the step, per second, per GPU);
- ``pipeline_one_worker``: (d) on a Ray worker group of one (skipped without Ray, which travels in a
  device call of its own: ``RLX_GPU_CHECK_SELECT=fit_steps_with or one_worker``, with the Ray bundle).

The two sweeps start a setting only while the check is within its budget (``SWEEP_STARTS_BY``,
``TRAINING_STARTS_BY`` seconds in), so that (d) always runs within the script's 9 minutes; a setting left
out is reported as skipped. Not run by default (``scripts/gpu_check.sh`` deselects "lora" and "agent";
run them with ``RLX_GPU_CHECK_SELECT=lora`` or ``=agent``): the same weight sync for a LoRA policy sent
as merged weights, and 3 `rlx fit` steps training a rank-16 LoRA adapter; ``agent``: 2 `rlx fit` steps of
agent rollouts on LMDeploy (a two-layer model of Qwen2.5-0.5B's layer shape, taught to call a tool), the
tool tokens' mask and the model tokens' log-prob mismatch checked.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch

from conftest import child_env, make_project
from helpers import engine_pace, train_pace
from rlx import config
from rlx.algo.correction import mismatch_metrics
from rlx.config import SampleParams
from rlx.store.layout import RunLayout
from rlx.tokens import prompt_ids
from rlx.training.flops import device_peak
from rlx.training.loading import load_policy
from rlx.training.trainer import TokenBatch, token_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("lmdeploy") is None, reason="needs the gpu extra (LMDeploy)"),
]

STARTED = time.monotonic()
SWEEP_STARTS_BY, TRAINING_STARTS_BY = 240, 330  # seconds into the check; (d) needs about 150 after
REPORT: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "elapsed_s": {}}
QWEN25_05B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
)  # fmt: skip
HELD: dict = {}  # what parts share: the LMDeploy sampler of (a)-(c) (one engine start), the sweep's trainer


@pytest.fixture(autouse=True)
def report(request, tmp_path_factory):
    """The report so far, written after every test: a part that hangs past the script's limit loses
    only its own figures."""
    yield REPORT
    REPORT["elapsed_s"][request.node.name] = time.monotonic() - STARTED
    path = Path(os.environ.get("RLX_GPU_REPORT", tmp_path_factory.getbasetemp() / "gpu_check.json"))
    path.write_text(json.dumps(REPORT, indent=2) + "\n")
    print(f"\nGPU check report ({path}), after {request.node.name}")


def within_budget(limit: float, part: str, name: str) -> None:
    """Skip (and report) a sweep's setting that would start past ``limit`` seconds into the check."""
    elapsed = time.monotonic() - STARTED
    if elapsed > limit:
        REPORT.setdefault(part, {})[name] = {"skipped": f"{elapsed:.0f} s into the check, past its {limit} s budget"}
        pytest.skip(REPORT[part][name]["skipped"])


@pytest.fixture(scope="module")
def qwen_shaped(untrained_model, tmp_path_factory):
    """The demo's data and tokenizer with a random Qwen2.5-0.5B-shaped model in bf16, as ``tiny_model`` gives
    them."""
    from transformers import AutoTokenizer

    cfg, metrics = untrained_model
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir, padding_side="left")
    return with_random_qwen(cfg, tokenizer, tmp_path_factory.mktemp("qwen2.5-0.5b-shaped")), metrics, tokenizer


def with_random_qwen(cfg, tokenizer, folder: Path, **shape):
    """``cfg`` with its model a random Qwen2.5-0.5B-shaped one (``shape`` changing some of it) in bf16, saved
    to ``folder``; its random weights drawn on the GPU (seconds, where the CPU takes tens)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        **(QWEN25_05B | shape), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return cfg.model_copy(update={"tiny_model": cfg.tiny_model.model_copy(update={"output_dir": folder})})


def lmdeploy_sampler(folder, tokenizer):
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    if "sampler" not in HELD:
        HELD["sampler"] = LMDeploySampler(folder, tokenizer, engine_pace.rollout_config())
    return HELD["sampler"]


def closed(sampler) -> None:
    sampler.sleep()
    sampler.pipe.close()
    torch.cuda.empty_cache()


def close_engine() -> None:
    sampler = HELD.pop("sampler", None)
    if sampler is not None:
        closed(sampler)


def release_gpu() -> None:
    """Give the GPU back (the shared engine, the sweep's trainer) before a part starts its own."""
    close_engine()
    trainer = HELD.pop("trainer", None)
    if trainer is not None:
        trainer.engine.destroy()
        del trainer
        gc.collect()
        torch.cuda.empty_cache()
        REPORT["gpu_memory_allocated_after_release_gib"] = torch.cuda.memory_allocated() / 2**30


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


def test_rollout_against_lmdeploys_own_batch_inference(qwen_shaped):
    """(a): rlx's rollout and LMDeploy's ``Pipeline.infer`` on one engine, the same requests."""
    cfg, _, tokenizer = qwen_shaped
    sampler, start_s = engine_pace.timed(lambda: lmdeploy_sampler(cfg.tiny_model.output_dir, tokenizer))
    prompts, params = questions(tokenizer, engine_pace.PROMPTS), engine_pace.sampling()
    sampler.generate(prompts[:8], params, seed=0)  # warm-up: kernels, caches
    REPORT["rollout"] = {"engine": engine_pace.BASE, "engine_start_s": start_s, "new_tokens": engine_pace.NEW_TOKENS}
    REPORT["rollout"].update(engine_pace.pace(sampler, prompts, params, seed=1))
    REPORT["rollout"]["target_met"] = REPORT["rollout"]["rlx_over_lmdeploy"] >= 0.9
    assert REPORT["rollout"]["generated_tokens"]["rlx"] == engine_pace.PROMPTS * engine_pace.NEW_TOKENS


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


def long_questions(tokenizer, count: int) -> list[list[int]]:
    """Prompts of at least 129 tokens (two of LMDeploy's 64-token blocks and more), each different from its
    first block on, so that none is served from another's cache."""
    texts = [" ".join([f"What is {a} + {a + 1}?"] * 16) for a in range(count)]
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": text}]) for text in texts]
    assert min(len(ids) for ids in prompts) >= 129
    return prompts


def test_no_prefix_cached_before_a_weight_sync_is_served_after_it(qwen_shaped):
    """Prefix caching on (as for agent rollouts): the same long prompts before and after one bf16 update,
    sent as `rlx fit` sends it. After the sync no token comes from the cache of the old weights (LMDeploy
    #4917; rlx.samplers.lmdeploy_backend.drop_prefix_cache) and the log-probs agree with the trainer's."""
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    cfg, _, tokenizer = qwen_shaped
    folder = cfg.tiny_model.output_dir
    release_gpu()
    sampler = LMDeploySampler(folder, tokenizer, engine_pace.rollout_config(), agent=True)
    try:
        policy, prompts = load_policy(folder, "bfloat16"), long_questions(tokenizer, 16)
        greedy = SampleParams(max_tokens=16, temperature=0.0, do_sample=False)
        before = sampler.generate(prompts, greedy, seed=0)
        batch = TokenBatch.from_ids(prompts, [g.response_ids for g in before], tokenizer.pad_token_id)
        loss = -(token_logprobs(policy, batch)[0] * batch.mask).sum() / batch.mask.sum()
        loss.backward()
        torch.optim.AdamW(policy.parameters(), lr=1e-3).step()
        sampler.load_weights(policy.state_dict().items())
        trie = sampler.engine.engine.scheduler.block_trie
        trie.stats.reset()
        synced = agreement(policy, sampler.generate(prompts, greedy, seed=0), tokenizer.pad_token_id)
        hits = trie.stats.num_hit_tokens
    finally:
        closed(sampler)
    REPORT["prefix_cache_after_sync"] = {"hit_tokens": hits, "after_sync": synced}
    assert hits == 0 and synced["mismatch/k3_kl"] < 1e-2


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


@pytest.mark.parametrize("setting", list(engine_pace.ENGINE_SWEEP))
def test_rollout_under_each_engine_setting(qwen_shaped, setting):
    """rlx's rollout of (a) on a fresh engine with one setting changed (LMDeploy reads its engine config
    once, when it starts: a restart per setting, in this process)."""
    from rlx.samplers.lmdeploy_backend import LMDeploySampler

    within_budget(SWEEP_STARTS_BY, "engine_settings", setting)
    release_gpu()
    cfg, _, tokenizer = qwen_shaped
    fields = engine_pace.ENGINE_SWEEP[setting]
    make = lambda: LMDeploySampler(cfg.tiny_model.output_dir, tokenizer, engine_pace.rollout_config(**fields))  # noqa: E731
    sampler, start_s = engine_pace.timed(make)
    try:
        prompts, params = questions(tokenizer, engine_pace.PROMPTS), engine_pace.sampling()
        sampler.generate(prompts[:8], params, seed=0)
        outputs, seconds = engine_pace.timed(lambda: sampler.generate(prompts, params, seed=1))
    finally:
        closed(sampler)
    rate = sum(len(out.response_ids) for out in outputs) / seconds
    default = REPORT.get("rollout", {}).get("rlx_tokens_per_s")
    REPORT.setdefault("engine_settings", {})[setting] = {
        "fields": fields,
        "engine_start_s": start_s,
        "rlx_tokens_per_s": rate,
        "over_default_engine": rate / default if default else None,
    }


@pytest.mark.parametrize("setting", list(train_pace.SETTINGS))
def test_training_mfu_under_each_setting(qwen_shaped, setting):
    """One bf16 ZeRO-2 trainer (made once), the same 256 rollouts, one setting changed at a time."""
    from rlx.training.trainer import PolicyTrainer

    within_budget(TRAINING_STARTS_BY, "training_mfu", setting)
    close_engine()
    cfg, _, tokenizer = qwen_shaped
    folder = cfg.tiny_model.output_dir
    if "trainer" not in HELD:
        gpu = ["resources.accelerator=GPU", "train_worker_cfg.deepspeed.precision=bf16"]
        worker = config.load(None, [*gpu, "train_worker_cfg.deepspeed.zero_stage=2"]).train_worker_cfg
        HELD["trainer"], seconds = engine_pace.timed(lambda: PolicyTrainer(worker, folder, folder / "no-state", 100))
        HELD["rollouts"] = train_pace.synthetic_rollouts(256, engine_pace.NEW_TOKENS, vocab=len(tokenizer))
        REPORT.setdefault("training_mfu", {})["trainer_start_s"] = seconds
    trainer = HELD["trainer"]
    peak = device_peak(trainer.module.device)
    REPORT["training_mfu"]["peak_flops"] = peak
    measured = train_pace.measure(
        trainer, HELD["rollouts"], tokenizer.pad_token_id, train_pace.SETTINGS[setting], peak or float("nan")
    )
    REPORT["training_mfu"][setting] = measured


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
STEP_KEYS = (
    "time/",
    "perf/",
    "mismatch/",
    "train/trainable_params",
    "train/optimizer_state_bytes",
    "train/world_size",
    "checkpoint/",
    "agent/",
)
SHOWN = ("rollout", "weight_sync", "old_logprob", "update", "checkpoint", "record", "other")  # of time/step/*


def fit_on_gpu(tmp_path, qwen_shaped, overrides: list[str]) -> dict:
    """`rlx fit` of the demo project with the Qwen2.5-0.5B-shaped model: each step's times and sizes."""
    from rlx.run.fit import fit

    release_gpu()
    cfg, metrics, _ = qwen_shaped
    project = make_project(tmp_path, (cfg, metrics))
    torch.cuda.reset_peak_memory_stats()
    held_before = torch.cuda.memory_allocated() / 2**30
    with contextlib.chdir(project):
        history = fit(project / "params.yaml", overrides)
        layout = RunLayout(config.load(project / "params.yaml", overrides).work_dir.resolve())
    return {
        "work_dir": str(layout.work_dir),
        "gpu_memory_allocated_before_gib": held_before,  # by this process, left by the parts before
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


def breakdown_table(steps: list[dict]) -> str:
    """Each step's seconds by part (the other named parts of time/step/* summed as "rest"), other's share, throughput."""
    rows = ["step  total  " + "  ".join(SHOWN) + "  rest(named)  other%  tokens/s/GPU  MFU(fwd+bwd)"]
    for number, m in enumerate(steps, start=1):
        parts = {k.removeprefix("time/step/"): v for k, v in m.items() if k.startswith("time/step/")}
        rest = sum(v for k, v in parts.items() if k not in SHOWN)
        shown = "  ".join(f"{parts.get(name, 0.0):.2f}" for name in SHOWN)
        mfu = m.get("perf/mfu/forward_backward", float("nan"))
        share = 100 * parts["other"] / m["time/step"]
        rows.append(
            f"{number}  {m['time/step']:.2f}  {shown}  {rest:.2f}  {share:.1f}  {m['perf/throughput']:.0f}  {mfu:.3f}"
        )
    return "\n".join(rows)


def test_three_fit_steps_with_lmdeploy_and_bf16_zero2(tmp_path, qwen_shaped):
    """(d): 3 `rlx fit` steps (checkpoints at 2, in the background, and at 3, the last), where each step's
    time went; what no part measured ("other") should stay under 5 % of a step."""
    REPORT["pipeline"] = fit_on_gpu(tmp_path, qwen_shaped, [*PIPELINE, "rollout_steps=3"])
    steps = REPORT["pipeline"]["steps"]
    print("\n" + breakdown_table(steps))
    assert len(steps) == 3
    assert all(
        sum(v for k, v in m.items() if k.startswith("time/step/")) == pytest.approx(m["time/step"]) for m in steps
    )
    assert device_peak(torch.device("cuda")) is None or all("perf/mfu/forward_backward" in m for m in steps)


@pytest.fixture
def one_gpu_node():
    """A Ray cluster of one node holding this machine's GPU, as `ray start --head` would start it."""
    pytest.importorskip("ray", reason="needs Ray: its bundle travels in a call of its own (scripts/gpu_bundle.py)")
    from ray.cluster_utils import Cluster

    node = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": 1, "include_dashboard": False})
    yield node.address
    node.shutdown()


def test_three_fit_steps_on_a_one_worker_group(tmp_path, qwen_shaped, one_gpu_node):
    """(d) again, its policy, trainer and LMDeploy engine in a Ray actor holding the GPU (rlx.workers, NCCL
    among one rank): its figures should be (d)'s within noise, and the driver holds no GPU memory."""
    group = [f"resources.ray_address={one_gpu_node}", "resources.num_cpus_per_worker=4"]
    REPORT["pipeline_one_worker"] = fit_on_gpu(tmp_path, qwen_shaped, [*PIPELINE, "rollout_steps=3", *group])
    steps = REPORT["pipeline_one_worker"]["steps"]
    print("\n" + breakdown_table(steps))
    assert len(steps) == 3 and all(m["train/world_size"] == 1 and m["time/workers"] > 0 for m in steps)
    held = REPORT["pipeline_one_worker"]
    assert held["peak_gpu_memory_allocated_gib"] == held["gpu_memory_allocated_before_gib"]  # all of it the worker's


def test_three_lora_fit_steps_with_lmdeploy_and_bf16_zero2(tmp_path, qwen_shaped):
    """The same run with a rank-16 LoRA adapter: LMDeploy starts from the base and gets merged weights."""
    lora = ["train_worker_cfg.lora={rank: 16, alpha: 32.0}", "train_worker_cfg.optim_cfg.lr=1e-5"]
    REPORT["lora_pipeline"] = fit_on_gpu(tmp_path, qwen_shaped, [*PIPELINE, *lora, "rollout_steps=3"])
    steps = REPORT["lora_pipeline"]["steps"]
    assert len(steps) == 3 and 0 < steps[0]["train/trainable_params"] < 5e7


@pytest.fixture(scope="module")
def agent_taught(untrained_model, tmp_path_factory):
    """An agent run's inputs (helpers.teaching.agent_inputs): a random two-layer Qwen2.5-0.5B-shaped model
    (its vocabulary and layer shape, two layers) taught on the GPU to call ``ping`` and then answer, eight
    problems. A model this size learns the conversation by heart in 60 steps at lr 1e-3 (measured on
    CPU in float32: loss 0.016, and 60 of 64 calls sampled at temperature 1 exact)."""
    from transformers import AutoTokenizer

    from helpers.teaching import agent_inputs

    cfg, metrics = untrained_model
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir, padding_side="left")
    base = tmp_path_factory.mktemp("agent")
    shaped = with_random_qwen(cfg, tokenizer, base / "random", num_hidden_layers=2)
    taught, metrics = agent_inputs((shaped, metrics), base / "inputs", lr=1e-3)
    torch.cuda.empty_cache()
    return taught, metrics, tokenizer


def test_two_agent_fit_steps_with_lmdeploy(tmp_path, agent_taught, monkeypatch):
    """Issue 30's GPU part (``RLX_GPU_CHECK_SELECT=agent``): 2 `rlx fit` steps of agent rollouts on LMDeploy
    (each rollout its own chain of requests, prefix caching on), bf16 ZeRO-2. In every rollout the tool's
    tokens are masked, have no log-prob, and are the chat template's rendering of the results shown;
    the model's tokens' log-probs from the engine agree with the trainer's (``mismatch/*``, mask only)."""
    import pyarrow.parquet as pq

    from helpers.teaching import AGENT_RUN, check_tool_tokens

    tokenizer = agent_taught[2]
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])  # the tool (helpers.agents) in any child too
    overrides = [*PIPELINE, *AGENT_RUN, "dataflow_config.global_batch_size=8", "rollout_steps=2"]
    REPORT["agent"] = fit_on_gpu(tmp_path, agent_taught, [*overrides, "evaluator_config.enable_evaluate=false"])
    layout = RunLayout(Path(REPORT["agent"]["work_dir"]))
    rows = [row for step in (1, 2) for row in pq.read_table(layout.step(step).rollouts).to_pylist()]
    calling = check_tool_tokens(rows, tokenizer)
    REPORT["agent"]["rollouts"] = {"rows": len(rows), "with_calls": calling}
    assert calling > len(rows) // 2, "the taught model should call its tool in most rollouts"
    for step in REPORT["agent"]["steps"]:
        assert step["mismatch/k3_kl"] < 1e-2 and step["agent/tool_calls"] > 0
