"""Several workers on Ray (rlx.workers): two CPU ranks over gloo equal one process, on two simulated
nodes; a killed worker or a killed driver loses nothing and leaves no Ray process behind.

One small Ray cluster of two nodes (one CPU each, no dashboard) serves the module; the runs that must
start their own Ray instance (the fault tests) are `rlx fit` processes of their own."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import PARAMS, child_env, dvc_status, make_project
from rlx import config as rlx_config
from rlx.errors import UserError
from rlx.lineage.record import edit_params
from rlx.stages import run_stage
from rlx.store.artifacts import read_json, read_rows
from rlx.training import distributed
from rlx.training.loading import load_policy
from rlx.training.trainer import PolicyTrainer
from rlx.workers import cluster, group, reaper
from rlx.workers.actors import Actor, ActorGroup
from rlx.workers.home import InProcess

ray = pytest.importorskip("ray")
FIT = [sys.executable, "-m", "rlx", "fit", "params.yaml"]
STEPS = 2  # the last step writes its checkpoint in the background


@pytest.fixture(scope="module")
def two_nodes():
    """A Ray cluster of two nodes on this machine, each with its own raylet and one CPU."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes.address
    nodes.shutdown()


def test_deal_gives_every_rank_the_same_number_of_micro_batches():
    items = ["a", "b", "c", "d", "e"]
    assert distributed.deal(items, 2, 0) == ["a", "c", "e"]
    assert distributed.deal(items, 2, 1) == ["b", "d", "a"]  # the repeat keeps rank 1 in step
    assert distributed.deal(items, 1, 0) == items
    assert distributed.deal(["a"], 4, 3) == ["a"]


def test_prompts_are_dealt_in_whole_groups_of_about_equal_work():
    groups = [[1, 2]] * 4 + [[3] * 10] * 4 + [[4]] * 4  # three groups of four samples, of uneven length
    assert group.shares(groups, 2, 1) == [(0, 12)]
    assert group.shares(groups, 2, 2) == [(0, 4), (4, 12)] or group.shares(groups, 2, 2) == [(0, 8), (8, 12)]
    assert group.shares(groups, 2, 3) == [(0, 4), (4, 8), (8, 12)]
    assert group.shares(groups, 2, 5)[-1][1] == 12  # more engines than groups: some get nothing
    assert all(start in (0, 4, 8, 12) for start, _ in group.shares(groups, 2, 5))


def test_zero3_weights_are_read_whole_a_bucket_at_a_time(untrained_model, tmp_path, monkeypatch):
    """Under ZeRO-3 the trainer's module holds pieces only; its weights read whole, in buckets of a bounded
    size (one gather each), are the policy it loaded, tied weights and all, in ``state_dict``'s order."""
    import deepspeed

    folder = untrained_model[0].tiny_model.output_dir
    worker = rlx_config.load(None, ["train_worker_cfg.deepspeed.zero_stage=3"]).train_worker_cfg
    trainer = PolicyTrainer(worker, folder, tmp_path / "none", 4, base_dir=folder)
    assert trainer.partitioned and trainer.module.get_input_embeddings().weight.numel() == 0
    gathers, gather = [], deepspeed.zero.GatheredParameters
    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", lambda ps: gathers.append(len(ps)) or gather(ps))
    whole = dict(trainer.gathered_weights(limit=32 * 64 * 4))  # an MLP projection's bytes a bucket
    expected = load_policy(folder).state_dict()
    assert list(whole) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(whole[name], tensor), name
    assert len(gathers) > 3 and sum(gathers) <= len(list(trainer.module.parameters())) + 1  # a tied weight twice


def test_a_request_the_cluster_cannot_hold_is_named():
    config = rlx_config.load(
        PARAMS, ["resources.num_workers=4", "resources.num_cpus_per_worker=2", "resources.accelerator=GPU"]
    )
    problem = cluster.shortfall(cluster.wanted(config), {"CPU": 2.0, "memory": 64 * 2**30})
    assert problem.startswith("8 CPU (resources.num_cpus_per_worker x num_workers) but the cluster has 2")
    assert "4 GPU (resources.num_accelerators_per_worker x num_workers) but the cluster has 0" in problem


def test_one_worker_imports_no_ray():
    """The default (`resources.num_workers: 1`, no `ray_address`, no `cpu_resources`) runs in the driver."""
    script = (
        "import sys; from rlx.config import load; from rlx.workers.group import warm_engines\n"
        f"with warm_engines(load({str(PARAMS)!r})) as engines: assert type(engines.home).__name__ == 'InProcess'\n"
        "assert 'ray' not in sys.modules, 'ray was imported'"
    )
    done = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_without_ray_several_workers_are_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray gives `import ray`
    with pytest.raises(
        UserError, match=r"^resources: workers on Ray, and Ray is not installed here: pip install 'ray=="
    ):
        cluster.import_ray()


class Latch(Actor):
    """An actor waiting, in one call, for another call to release it."""

    def __init__(self, *arguments):
        super().__init__(*arguments)
        self.released = threading.Event()

    def wait_released(self) -> bool:
        return self.released.wait(timeout=60)

    def release(self) -> None:
        self.released.set()


def test_a_background_call_leaves_the_actors_free_for_the_next_calls(two_nodes, tmp_path):
    """What a worker's checkpoint write relies on: the driver waits for it in the actors' background
    concurrency group while their other calls go on."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Latch: this module is not on the nodes' path
    config = rlx_config.load(PARAMS)
    with ray_connected(two_nodes):
        latches = ActorGroup(ray, Latch, "latch", {"CPU": 0.1}, 2, "SPREAD", lambda rank: (config, str(tmp_path)))
        try:
            with ThreadPoolExecutor(1) as pool:
                waited = pool.submit(latches.call, "wait_released", what="waiting", background=True)
                latches.call("release", what="releasing")
                assert waited.result(timeout=120) == [True, True]  # else each wait blocked its actor: False
        finally:
            latches.stop()


@contextlib.contextmanager
def ray_connected(address: str):
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def rolled_out_project(base, tiny_model):
    """A project whose step 1 is prepared (one process), ready for its rollout."""
    base.mkdir()
    project = make_project(base, tiny_model)
    with contextlib.chdir(project):
        config = rlx_config.load(project / "params.yaml")
        engines = group.engines_here(config)
        for name in ("base", "checkpoint", "prepare"):
            run_stage(name, config, 0 if name == "checkpoint" else 1, engines)
    return project


def roll_out_and_train(project, *overrides):
    """Step 1's rollout, judge, update and checkpoint, in one process or on the workers ``overrides`` ask for;
    then what the policies before and after the update, as the engines hold them, sample for step 1's prompts
    from one seed."""
    with contextlib.chdir(project):
        config = rlx_config.load(project / "params.yaml", [*overrides, "checkpoint_interval=1"])
        with group.warm_engines(config) as engines:
            places = [] if isinstance(engines.home, InProcess) else engines.home.places
            base = engines.home.base_fingerprint()  # with workers worker 0's: the driver loads no model
            assert base == read_json(project / "runs/demo/step-0/fingerprint.json")
            metrics = {
                name: run_stage(name, config, 1, engines) for name in ("rollout", "judge", "train", "checkpoint")
            }
            rollouts = read_rows(project / "runs/demo/step-1/rollouts.parquet")
            prompts, params = [r["prompt_ids"] for r in rollouts], config.dataflow_config.sample_params
            sampled = [
                [g.response_ids for g in engines.home.sampler(k).generate(prompts, params, seed=1)] for k in (1, 0)
            ]
    policy = load_file(project / "runs/demo/step-1/policy/model.safetensors")
    return metrics["train"], policy, [rollouts, sampled], places


def test_two_workers_on_two_nodes_sample_and_train_as_one_process(tmp_path, tiny_model, two_nodes):
    """Prompts dealt to two engines sample the same responses as one engine; two judge actors give the
    verdicts the driver gives; the same global batch gives the same loss and update on two ranks as in
    one process (up to float summation order), and the updated policy samples as one process's does.
    So under ZeRO-1 and under ZeRO-3, where each rank holds a piece of every weight and samples from a
    whole copy gathered in buckets."""
    one = rolled_out_project(tmp_path / "one", tiny_model)
    pairs = {stage: Path(shutil.copytree(one, tmp_path / f"zero-{stage}")) for stage in (1, 3)}
    # mini-batches of 2 micro-batches each, so each rank gets real work
    overrides = ["train_worker_cfg.pack_max_length=256", "train_worker_cfg.optimizer_steps=2"]
    single, single_weights, (single_rollouts, (single_after, _)), _ = roll_out_and_train(one, *overrides)
    workers = [
        f"resources.ray_address={two_nodes}",
        "resources.num_workers=2",
        "resources.pg_pack_strategy=STRICT_SPREAD",
        "resources.num_cpus_per_worker=0.5",
        "cpu_resources={num_workers: 2, num_cpus_per_worker: 0.5}",  # and the judging in two CPU actors
    ]
    for stage, two in pairs.items():
        zero = f"train_worker_cfg.deepspeed.zero_stage={stage}"
        double, double_weights, (rollouts, (after, before)), places = roll_out_and_train(
            two, *overrides, *workers, zero
        )
        assert read_rows(two / "runs/demo/step-1/judged.parquet") == read_rows(one / "runs/demo/step-1/judged.parquet")

        assert len({place["node_id"] for place in places}) == 2  # one worker on each node
        assert [r["response_ids"] for r in rollouts] == [r["response_ids"] for r in single_rollouts]
        assert after == single_after and after != before  # sampled from the updated policy
        assert single["train/world_size"] == 1 and double["train/world_size"] == 2
        assert double["train/rank_weight_spread"] == 0.0
        clip = [f"train/clipfrac{part}" for part in ("", "_low", "_high", "_dual")]
        for name in ("train/loss", "train/pg_loss", "train/entropy", *clip, "mismatch/k3_kl"):
            assert double[name] == pytest.approx(single[name], rel=1e-5, abs=1e-7), (stage, name)
        changed = 0
        for name, tensor in single_weights.items():
            torch.testing.assert_close(double_weights[name], tensor, rtol=1e-5, atol=1e-6)
            changed += int(not torch.equal(tensor, load_file(one / "data/tiny-qwen3/model.safetensors")[name]))
        assert changed > 0  # the update really moved the weights
        assert (two / "runs/demo/step-1/trainer_state/state/zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()


def fit(project: Path, fault: str | None = None, *overrides: str) -> subprocess.CompletedProcess:
    env = child_env() | ({"RLX_FAULT": fault} if fault else {})
    return subprocess.run([*FIT, *overrides], cwd=project, env=env, capture_output=True, text=True)


def final_policy(project: Path) -> bytes:
    return (project / f"runs/demo/step-{STEPS}/policy/model.safetensors").read_bytes()


def test_a_killed_worker_and_a_killed_driver_lose_nothing_and_leave_no_ray_behind(tmp_path, tiny_model, two_nodes):
    """Two workers, two steps. A worker killed in step 2's update stops the run in one line naming it;
    the driver killed as step 2 evaluates leaves no process of the Ray instance it started; the rerun
    (joining a running cluster) ends bitwise where an uninterrupted run ends, and the pipeline is clean."""
    (tmp_path / "a").mkdir()
    base = make_project(tmp_path / "a", tiny_model)
    edit_params(base / "params.yaml", [f"rollout_steps={STEPS}", "wandb.enabled=false", "resources.num_workers=2"])
    interrupted = Path(shutil.copytree(base, tmp_path / "b" / "project", symlinks=True))
    local = ["-S", "resources.num_cpus_per_worker=0.5", "-S", "resources.cpu_memory_per_worker=0"]
    joined = ["-S", f"resources.ray_address={two_nodes}"]

    worker_killed = fit(interrupted, "train.optimizer_step@2", *local)
    assert worker_killed.returncode == 2, worker_killed.stderr[-3000:]
    assert "died during stage train of step 2; rerun `rlx fit` to resume" in worker_killed.stderr
    driver = subprocess.Popen(
        [*FIT, *local], cwd=interrupted, env=child_env() | {"RLX_FAULT": "evaluate.start"}, stderr=subprocess.PIPE
    )
    assert driver.wait(timeout=600) == -9, driver.stderr.read()[-3000:]
    deadline = time.monotonic() + 30
    while reaper.marked(f"{driver.pid}-") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert reaper.marked(f"{driver.pid}-") == []

    assert fit(interrupted, None, *joined).returncode == 0
    assert fit(base, None, *joined).returncode == 0
    assert final_policy(interrupted) == final_policy(base)
    assert dvc_status(interrupted) == {}
    assert reaper.marked("") == []  # nor did the run whose worker was killed

    # an unsaved step re-created by replay on as many workers as trained it (its fingerprint checked)
    materialized = subprocess.run(
        [*FIT[:3], "materialize", "runs/demo", "--step", "1"], cwd=base, env=child_env(), capture_output=True, text=True
    )
    assert materialized.returncode == 0, materialized.stderr[-3000:]
    assert (base / "runs/demo/materialized/step-1/model.safetensors").is_file()


def test_a_ray_address_nothing_answers_is_one_line_not_a_wait():
    config = rlx_config.load(
        PARAMS, ["resources.num_workers=2", f"resources.ray_address=127.0.0.1:{distributed.free_port()}"]
    )
    with pytest.raises(UserError, match=r"^resources.ray_address '127.0.0.1:\d+': no Ray cluster answers there \(Conn"):
        with cluster.ray_instance(config):
            pass


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch, caplog):
    """A process killed while DeepSpeed built its CPU collectives leaves torch's build lock, on which every
    later DeepSpeed start on CPU waited forever."""
    import os

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / distributed.CPU_COMM_OP / "lock"
    lock.parent.mkdir()
    lock.touch()
    distributed.clear_stale_build_lock(distributed.CPU_COMM_OP)
    assert lock.exists()  # a build may be under way
    old = time.time() - distributed.STALE_BUILD_SECONDS - 60
    os.utime(lock, (old, old))
    distributed.clear_stale_build_lock(distributed.CPU_COMM_OP)
    assert not lock.exists() and "that never finished" in caplog.text
    distributed.clear_stale_build_lock(distributed.CPU_COMM_OP)  # none: nothing to do
