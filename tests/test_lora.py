"""LoRA training (``train_worker_cfg.lora``) with the real peft and DeepSpeed on a small Qwen3: only the
adapter learns, the base stays bit for bit, the reference is the base, a merged export is the base
plus the adapter, and a run's checkpoints hold the adapter alone."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import child_env, dvc_status, make_project
from rlx import config as rlx_config
from rlx.cli import main
from rlx.errors import UserError
from rlx.explore import Run
from rlx.lineage import fingerprint as fingerprinting
from rlx.lineage.record import edit_params
from rlx.run.fit import fit
from rlx.store.artifacts import read_json
from rlx.store.layout import RunLayout
from rlx.training.loading import load_policy
from rlx.training.lora import check_model, full_weights, linear_modules, merged
from rlx.training.trainer import PolicyTrainer, TokenBatch, token_logprobs

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def worker(zero_stage: int = 1, **lora):
    overrides = [f"train_worker_cfg.lora={ {**LORA, **lora} }", f"train_worker_cfg.deepspeed.zero_stage={zero_stage}"]
    return rlx_config.load(None, overrides).train_worker_cfg


def tensors_in(state) -> int:
    """How many tensor elements a saved state holds, however deep."""
    if torch.is_tensor(state):
        return state.numel()
    values = state.values() if isinstance(state, dict) else state if isinstance(state, list | tuple) else []
    return sum(tensors_in(value) for value in values)


def a_batch(seed: int = 0) -> TokenBatch:
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 60, (4, 6), generator=generator).tolist()
    responses = torch.randint(3, 60, (4, 5), generator=generator).tolist()
    return TokenBatch.from_ids(prompts, responses, pad_id=0)


def one_update(trainer: PolicyTrainer) -> None:
    """A real optimizer step: raise the log-likelihood of a batch's responses."""
    batch = a_batch()
    logp, _ = token_logprobs(trainer.module, batch)
    loss = -(logp * batch.mask).sum() / batch.mask.sum()
    trainer.backward(loss)
    assert not trainer.optimizer_step(loss.item())["skipped"]


@pytest.fixture(scope="module")
def trained(untrained_model, tmp_path_factory):
    """A LoRA trainer on the small model after one update, and the base model's own weights."""
    cfg, _ = untrained_model
    model = cfg.tiny_model.output_dir
    trainer = PolicyTrainer(worker(), model, tmp_path_factory.mktemp("no-state"), 4, base_dir=model, seed=7)
    before = {name: p.detach().clone() for name, p in trainer.module.named_parameters()}
    one_update(trainer)
    return trainer, before, load_file(model / "model.safetensors"), model


def test_only_the_adapter_changes_and_the_base_stays_bitwise(trained):
    trainer, before, base, _ = trained
    after = dict(trainer.module.named_parameters())
    adapter = {name for name in after if ".lora_" in name}
    assert adapter and {name for name, p in after.items() if p.requires_grad} == adapter
    assert all(not torch.equal(after[name], before[name]) for name in adapter if ".lora_B." in name)
    frozen = [name for name in after if name not in adapter]
    assert all(torch.equal(after[name], before[name]) for name in frozen)
    for name in frozen:  # and equal to the base model's file, element for element
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(after[name].detach(), base[plain]), name
    assert trainer.trainable_parameters == sum(after[name].numel() for name in adapter)
    moments = 2 * 4 * trainer.trainable_parameters  # AdamW's two fp32 moments, over the adapter only
    assert moments <= trainer.optimizer_state_bytes() <= moments + 64


def test_the_reference_is_the_base_with_the_adapter_off(trained):
    trainer, _, _, model = trained
    batch = a_batch(seed=1)
    reference = trainer.reference_logprobs(batch, None, frozen=None)
    with torch.no_grad():
        expected, _ = token_logprobs(load_policy(model), batch)
    assert torch.equal(reference, expected)
    assert not torch.allclose(trainer.logprobs(batch), reference)  # the adapter is on again, and it moved


def test_a_merged_policy_is_the_base_plus_scale_b_a(trained, tmp_path):
    trainer, _, base, model = trained
    trainer.module.save_pretrained(tmp_path, safe_serialization=True)
    adapter = load_file(tmp_path / "adapter_model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    with_adapter = load_policy(tmp_path, base=model)
    full = merged(load_policy(tmp_path, base=model))
    weights = dict(full.named_parameters())
    scale = LORA["alpha"] / LORA["rank"]
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"):
        a = adapter[f"base_model.model.{name}.lora_A.weight"]
        b = adapter[f"base_model.model.{name}.lora_B.weight"]
        assert torch.allclose(weights[f"{name}.weight"], base[f"{name}.weight"] + scale * b @ a, atol=1e-6)
    untouched = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(weights[untouched], base[untouched])
    batch = a_batch(seed=2)
    with torch.no_grad():
        assert torch.allclose(token_logprobs(full, batch)[0], token_logprobs(with_adapter, batch)[0], atol=1e-5)


def test_an_inference_engine_gets_the_merged_weights_by_the_base_models_names(trained, tmp_path):
    """What LMDeploy is sent for a LoRA policy (it takes adapters only when it starts): every weight of
    the base model, by its own name, equal bit for bit to peft's merge, and the policy left unmerged."""
    trainer, _, base, model = trained
    trainer.module.save_pretrained(tmp_path, safe_serialization=True)
    expected = merged(load_policy(tmp_path, base=model)).state_dict()
    sent = dict(full_weights(trainer.module))
    assert list(sent) == list(expected) and set(sent) >= set(base)
    assert all(torch.equal(sent[name], expected[name]) for name in sent)
    assert not torch.equal(
        sent["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert any(".lora_A." in name for name, _ in trainer.module.named_parameters())  # still an adapter


def test_the_updates_mfu_counts_real_tokens_and_no_gradient_for_the_frozen_base(trained):
    """``perf/mfu/*`` (rlx.training.update.utilisation) of a LoRA update: the rows of the micro-batches that
    count (not a repeat that only keeps the ranks in step), at their real lengths, without the base's
    weight gradients; a no-grad pass of the reference before it under a KL loss, none otherwise."""
    from rlx.training.flops import ModelShape, forward_flops, training_flops
    from rlx.training.microbatch import Micro
    from rlx.training.update import Scored, utilisation

    trainer, *_ = trained
    batch = a_batch()
    rollouts = [{"prompt_len": 6, "response_len": length} for length in (5, 3, 4)]
    micros = [Micro(indices, batch, None, batch.mask, None, 1.0, 12, weight) for indices, weight in
              [([0, 1], 1.0), ([2], 1.0), ([0], 0.0)]]  # fmt: skip
    timings = {"time/train/forward_backward": 2.0, "time/train/old_logprob": 0.5}
    scored = Scored(rollouts, [micros], None, None, None, {}, timings)
    shape, sequences = trainer.model_shape, [(11, 5), (9, 3), (10, 4)]
    assert shape == ModelShape.of(trainer.module.get_base_model().config)
    kl_loss = rlx_config.load(None, ["train_worker_cfg.loss_cfg.use_kl_loss=true"])
    assert utilisation(kl_loss, scored, trainer, peak=1e9) == {
        "perf/mfu/forward_backward": training_flops(shape, sequences, weight_gradients=False) / 2e9,
        "perf/mfu/old_logprob": forward_flops(shape, sequences) / 0.5e9,
    }
    assert list(utilisation(rlx_config.load(None, []), scored, trainer, peak=1e9)) == ["perf/mfu/forward_backward"]
    assert utilisation(kl_loss, scored, trainer, peak=None) == {}  # a CPU, or training not in bf16


def test_the_gpu_checks_training_sweep_measures_each_setting_and_puts_the_model_back(trained):
    """The GPU check's training sweep (tests/helpers/train_pace), on CPU with the LoRA trainer: every kind of
    setting runs, reports its micro-batches and MFU, and leaves the model as it found it."""
    from helpers import train_pace

    trainer, *_ = trained
    model, rollouts = trainer.module, train_pace.synthetic_rollouts(6, 5, vocab=60)
    settings = [{"pack": 1}, {"logits_to_keep": False}, {"checkpointing": True}, {"attention": "eager"}]
    reports = [train_pace.measure(trainer, rollouts, 0, setting, peak=1e9) for setting in settings]
    assert [r["micro_batches"] for r in reports] == [6, 1, 1, 1] and all(r["mfu_forward_backward"] > 0 for r in reports)
    assert all(
        r["mfu_old_logprob"] > 0 and r["tokens"] == sum(len(x["prompt_ids"]) + 5 for x in rollouts) for r in reports
    )
    assert model.config._attn_implementation == "sdpa" and not model.is_gradient_checkpointing
    if importlib.util.find_spec("flash_attn") is None:
        flash = train_pace.measure(trainer, rollouts, 0, {"attention": "flash_attention_2"}, 1e9)
        assert flash["skipped"] == "flash_attn is not installed"


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_the_trainer_resumes_from_its_saved_adapter_and_state(untrained_model, tmp_path, zero_stage):
    """A LoRA checkpoint is the adapter and its optimizer state (no base weights, which ZeRO-2 would add
    as frozen fragments): loading it gives the same weights and optimizer, so the next update matches the
    original trainer's bit for bit."""
    model = untrained_model[0].tiny_model.output_dir
    trainer = PolicyTrainer(worker(zero_stage), model, tmp_path / "none", 4, base_dir=model, seed=7)
    one_update(trainer)
    trainer.snapshot(AutoTokenizer.from_pretrained(model)).write(tmp_path / "policy", tmp_path / "state")
    saved = torch.load(tmp_path / "state/state/mp_rank_00_model_states.pt", weights_only=False)
    trainable = {name: p for name, p in trainer.module.named_parameters() if p.requires_grad}
    assert set(saved["module"]) == set(trainable)  # no copy of the frozen base, nor of its tied output head
    assert tensors_in(saved) == trainer.trainable_parameters  # nor frozen fragments
    assert sorted(load_file(tmp_path / "policy/adapter_model.safetensors")) == sorted(
        name.replace(".default.", ".") for name in trainable
    )
    again = PolicyTrainer(worker(zero_stage), tmp_path / "policy", tmp_path / "state", 4, base_dir=model, seed=99)
    assert trainer.fingerprint() == again.fingerprint()
    one_update(trainer)
    one_update(again)
    assert trainer.fingerprint() == again.fingerprint()


def test_the_trainers_fingerprint_reads_the_frozen_base_once(untrained_model, tmp_path, monkeypatch):
    """After the first, a trainer's fingerprint reads the adapter only, and equals one of the whole
    module read afresh, also after an update."""
    model = untrained_model[0].tiny_model.output_dir
    trainer = PolicyTrainer(worker(), model, tmp_path, 4, base_dir=model, seed=3)
    trainer.fingerprint()
    one_update(trainer)
    read = []
    monkeypatch.setattr(fingerprinting, "tensor_sums", lambda tensor: read.append(tensor.numel()) or [0, 0])
    trainer.fingerprint()
    assert sum(read) == trainer.trainable_parameters
    monkeypatch.undo()
    assert trainer.fingerprint() == fingerprinting.fingerprint(trainer.module)


def test_a_new_adapter_is_drawn_from_the_seed(untrained_model, tmp_path):
    model = untrained_model[0].tiny_model.output_dir
    first, second, other = (
        PolicyTrainer(worker(), model, tmp_path, 4, base_dir=model, seed=seed).fingerprint() for seed in (3, 3, 4)
    )
    assert first == second and first != other


def test_a_target_module_the_model_lacks_names_the_field_and_the_modules(untrained_model):
    model = untrained_model[0].tiny_model.output_dir
    lora = rlx_config.load(None, ["train_worker_cfg.lora.target_modules=[q_proj, attn]"]).train_worker_cfg.lora
    names = linear_modules(AutoModelForCausalLM.from_pretrained(model))
    assert names == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]  # tied head left out
    with pytest.raises(UserError) as error:
        check_model(lora, model)
    assert str(error.value) == (
        f"train_worker_cfg.lora.target_modules: attn not among the linear modules of the model in load_from {model}: "
        f"{', '.join(names)} (or all-linear)"
    )


# ---- a LoRA run through the real pipeline -------------------------------------------------------

RUN = [
    "rollout_steps=2",
    "train_worker_cfg.lora={rank: 4, alpha: 8.0, export_adapter: true}",
    "train_worker_cfg.loss_cfg.use_kl_loss=true",  # its reference: the trainer's base, adapter off
    "wandb.enabled=false",
]


def lora_project(base: Path, tiny_model) -> Path:
    project = make_project(base, tiny_model)
    edit_params(project / "params.yaml", RUN)
    return project


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model):
    project = lora_project(tmp_path_factory.mktemp("lora-fit"), tiny_model)
    return project, fit(project / "params.yaml", [])


@pytest.mark.slow
def test_a_lora_run_keeps_adapters_and_exports_a_merged_model(lora_run):
    project, history = lora_run
    layout = RunLayout(project / "runs/demo")
    assert layout.checkpoints() == [0, 2] and len(history) == 2
    base = project / "data/tiny-qwen3"
    policy = layout.step(2).policy
    assert (policy / "adapter_config.json").is_file() and not (policy / "model.safetensors").exists()
    adapter_bytes = (policy / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (base / "model.safetensors").stat().st_size / 5
    total = sum(p.numel() for p in load_policy(base).parameters())
    assert all(0 < m["train/trainable_params"] < total / 10 for m in history)
    assert history[0]["train/kl"] == pytest.approx(0.0, abs=1e-6) and history[1]["train/kl"] > 0
    export = layout.hf_export(2)
    assert "adapter/adapter_model.safetensors" in read_json(layout.step(2).export_record)["files"]
    full = AutoModelForCausalLM.from_pretrained(export)  # a plain HF model: no peft needed to load it
    with torch.no_grad():
        adapted = token_logprobs(load_policy(policy, base=base), a_batch())[0]
        assert torch.allclose(token_logprobs(full, a_batch())[0], adapted, atol=1e-5)
    assert dvc_status(project) == {}


@pytest.mark.slow
def test_any_step_of_a_lora_run_is_materialized_and_evaluated_as_a_full_model(lora_run, capsys):
    """Step 1 has no checkpoint: it is replayed from step 0, whose new adapter is drawn again from the
    run's seed (the replay checks the recorded fingerprint), then merged; step 2's adapter is merged."""
    project, _ = lora_run
    with contextlib.chdir(project), pytest.raises(SystemExit) as exited:
        main(["eval", "runs/demo", "--step", "1", "--data", "data/arith/test.parquet", "--max-tokens", "8"])
    assert exited.value.code in (0, None) and "accuracy" in capsys.readouterr().out
    with contextlib.chdir(project), pytest.raises(SystemExit) as exited:
        main(["show", "runs/demo", "--step", "1", "--rows", "2"])  # the advantages that drove step 1's update
    assert exited.value.code in (0, None) and "step 1: mean reward" in capsys.readouterr().out
    folder = project / "runs/demo/materialized/step-1"
    assert (folder / "model.safetensors").is_file() and (folder / "adapter/adapter_config.json").is_file()
    with contextlib.chdir(project):
        merged_two = Run(Path("runs/demo")).policy(2).resolve()
    assert merged_two == (project / "runs/demo/materialized/step-2").resolve()
    assert (merged_two / "config.json").is_file()


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_same_adapter(lora_run, tmp_path, tiny_model):
    project, _ = lora_run
    resumed = lora_project(tmp_path, tiny_model)
    command = [sys.executable, "-m", "rlx", "fit", "params.yaml"]
    # killed after step 1 trained, before anything of it was checkpointed: the rerun replays it
    killed = subprocess.run(command, cwd=resumed, env=child_env() | {"RLX_FAULT": "checkpoint.start@2"})
    assert killed.returncode == -9
    done = subprocess.run(command, cwd=resumed, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    adapter = "runs/demo/step-2/policy/adapter_model.safetensors"
    assert (resumed / adapter).read_bytes() == (project / adapter).read_bytes()
    assert dvc_status(resumed) == {}
