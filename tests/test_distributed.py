"""Data-parallel training through DeepSpeed's launcher: two CPU ranks over gloo equal one process."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import dvc_status, make_project
from rlx import config as rlx_config
from rlx.engines import Engines
from rlx.errors import UserError
from rlx.run.fit import fit
from rlx.stages import run_stage
from rlx.stages.train import replay
from rlx.training import distributed, launcher


def test_deal_gives_every_rank_the_same_number_of_micro_batches():
    items = ["a", "b", "c", "d", "e"]
    assert distributed.deal(items, 2, 0) == ["a", "c", "e"]
    assert distributed.deal(items, 2, 1) == ["b", "d", "a"]  # the repeat keeps rank 1 in step
    assert distributed.deal(items, 1, 0) == items
    assert distributed.deal(["a"], 4, 3) == ["a"]


def test_hostfile_slots_are_counted_and_bad_lines_named(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes\nnode-a slots=8\nnode-b slots=4  # smaller\n\n")
    assert launcher.hostfile_slots(hostfile) == 12
    hostfile.write_text("node-a slots=8\nnode-b\n")
    with pytest.raises(UserError, match=r"hostfile .*, line 2: expected 'HOST slots=N', got 'node-b'"):
        launcher.hostfile_slots(hostfile)
    with pytest.raises(UserError, match="no such file"):
        launcher.hostfile_slots(tmp_path / "missing")


def test_launch_command_uses_deepspeed_on_this_host_or_the_hostfile(tmp_path):
    local = launcher.launch_command(2, None, 29999, ["train", "c.yaml", "1", "r.json"])
    assert local[0].endswith("deepspeed") and local[1:3] == ["--num_gpus", "2"]
    assert local[-6:] == ["--module", "rlx.run.rank", "train", "c.yaml", "1", "r.json"]
    remote = launcher.launch_command(16, tmp_path / "hosts", 29999, ["train"])
    assert remote[1:3] == ["--hostfile", str(tmp_path / "hosts")]


def rolled_out_project(base, tiny_model):
    """A project whose step 1 is rolled out and judged, ready for its train stage."""
    base.mkdir()
    project = make_project(base, tiny_model)
    with contextlib.chdir(project):
        config = rlx_config.load(project / "params.yaml")
        engines = Engines(config, replay)
        for name in ("base", "prepare", "rollout", "judge"):
            run_stage(name, config, 1, engines)
    return project


def train_step_one(project, *overrides):
    """Step 1's update, then its checkpoint (the ranks of a launch write it themselves)."""
    with contextlib.chdir(project):
        config = rlx_config.load(project / "params.yaml", [*overrides, "checkpoint_interval=1"])
        engines = Engines(config, replay)
        metrics = run_stage("train", config, 1, engines)
        run_stage("checkpoint", config, 1, engines)
        weights = load_file(project / "runs/demo/step-1/policy/model.safetensors")
    return metrics, weights


def test_two_ranks_end_identical_and_equal_one_process(tmp_path, tiny_model):
    """Same global batch, same loss and the same update whether one process or two ranks train it
    (up to float summation order); the ranks check among themselves that their weights are identical."""
    one = rolled_out_project(tmp_path / "one", tiny_model)
    two = tmp_path / "two"
    shutil.copytree(one, two)
    # mini-batches of 2 micro-batches each, so each rank gets real work
    overrides = ["train_worker_cfg.pack_max_length=256", "train_worker_cfg.optimizer_steps=2"]
    single, single_weights = train_step_one(one, *overrides)
    double, double_weights = train_step_one(two, *overrides, "resources.num_workers=2")

    assert single["train/world_size"] == 1 and double["train/world_size"] == 2
    assert double["train/rank_weight_spread"] == 0.0
    clip = [f"train/clipfrac{part}" for part in ("", "_low", "_high", "_dual")]
    for name in ("train/loss", "train/pg_loss", "train/entropy", *clip, "mismatch/k3_kl"):
        assert double[name] == pytest.approx(single[name], rel=1e-5, abs=1e-7), name
    assert single_weights.keys() == double_weights.keys()
    changed = 0
    for name, tensor in single_weights.items():
        torch.testing.assert_close(double_weights[name], tensor, rtol=1e-5, atol=1e-6)
        changed += int(not torch.equal(tensor, load_file(one / "data/tiny-qwen3/model.safetensors")[name]))
    assert changed > 0  # the update really moved the weights
    assert (two / "runs/demo/step-1/trainer_state/state/zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()


def test_fit_with_two_workers_resumes_their_sharded_state(tmp_path, tiny_model):
    """`rlx fit` launches the ranks every step (the optimizer state of step N, sharded over two
    ranks, is what step N+1's ranks load) and leaves the pipeline clean."""
    project = make_project(tmp_path, tiny_model)
    history = fit(project / "params.yaml", ["resources.num_workers=2", "rollout_steps=2"])
    assert [m["train/world_size"] for m in history] == [2, 2]
    assert all(m["train/rank_weight_spread"] == 0.0 for m in history)
    assert dvc_status(project) == {}
