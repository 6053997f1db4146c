"""The GPU check (``make gpu-check``): LMDeploy rollouts and bf16 DeepSpeed on one CUDA GPU.

Skipped where there is no GPU or no LMDeploy (``pip install -e '.[gpu]'``). It prints, and writes to
``$RLX_GPU_REPORT`` (default ``gpu_check.json`` in the pytest temp folder), the rollout tokens/s of
LMDeploy and of the transformers backend on the same prompts, and the rewards of a few pipeline
steps run with LMDeploy and bf16 DeepSpeed.
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
from transformers import AutoTokenizer

from conftest import dvc_status, make_project
from rlx.config import RolloutConfig, SampleParams
from rlx.data import prompt_ids
from rlx.engines import load_policy
from rlx.fit import fit
from rlx.rollout import TransformersSampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("lmdeploy") is None, reason="needs the gpu extra (LMDeploy)"),
]

REPORT: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


@pytest.fixture(scope="module", autouse=True)
def report(tmp_path_factory):
    yield REPORT
    path = Path(os.environ.get("RLX_GPU_REPORT", tmp_path_factory.getbasetemp() / "gpu_check.json"))
    path.write_text(json.dumps(REPORT, indent=2) + "\n")
    print(f"\nGPU check report ({path}):\n{json.dumps(REPORT, indent=2)}")


def tokens_per_second(sampler, prompts, params) -> float:
    sampler.generate(prompts[:8], params, seed=0)  # warm-up: kernels, caches
    started = time.perf_counter()
    outputs = sampler.generate(prompts, params, seed=1)
    return sum(len(out.response_ids) for out in outputs) / (time.perf_counter() - started)


def test_lmdeploy_and_transformers_rollout_throughput(tiny_model):
    from rlx.rollout.lmdeploy_backend import LMDeploySampler

    cfg, _ = tiny_model
    folder = cfg.tiny_model.output_dir
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    questions = [f"What is {a} + {b}?" for a in range(16) for b in range(32)]
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    params = SampleParams(max_tokens=128, min_tokens=128, temperature=1.0)  # equal lengths on both sides
    config = RolloutConfig(backend="transformers", rollout_max_batch_size=512)
    hf = tokens_per_second(TransformersSampler(load_policy(folder), tokenizer, config), prompts, params)
    lmdeploy = LMDeploySampler(folder, tokenizer, config.model_copy(update={"backend": "lmdeploy"}))
    fast = tokens_per_second(lmdeploy, prompts, params)
    REPORT["rollout"] = {
        "prompts": len(prompts),
        "new_tokens": 128,
        "transformers_tokens_per_s": hf,
        "lmdeploy_tokens_per_s": fast,
        "ratio": fast / hf,
    }
    lmdeploy.load_weights(load_policy(folder).state_dict())  # the warm path's update: sleep, update, wake
    assert all(out.response_ids for out in lmdeploy.generate(prompts[:4], params, seed=2))


def test_pipeline_with_lmdeploy_and_bf16_deepspeed(tmp_path, tiny_model):
    project = make_project(tmp_path, tiny_model)
    overrides = [
        "resources.accelerator=GPU",
        "rollout_config.backend=lmdeploy",
        "rollout_config.gpu_memory_utilization=0.3",
        "train_worker_cfg.deepspeed.precision=bf16",
        "train_worker_cfg.deepspeed.zero_stage=2",
        "rollout_steps=4",
        "dataflow_config.global_batch_size=16",
        "dataflow_config.prompt_repeat_k=8",
    ]
    with contextlib.chdir(project):
        history = fit(project / "params.yaml", overrides)
    REPORT["pipeline"] = [
        {k: m[k] for k in ("response/rewards/mean", "mismatch/k3_kl", "time/rollout", "time/train", "time/step")}
        for m in history
    ]
    assert len(history) == 4 and dvc_status(project) == {}
