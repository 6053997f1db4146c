"""The RL iteration as DVC stages and `rlx fit`, on real files with the tiny model, real DVC, DeepSpeed
and W&B (offline). Each test works in its own copy of the project (a git + DVC repository)."""

from __future__ import annotations

import gzip
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import ROOT, SHORT_RUN, child_env, dvc_status, make_project, run
from rlx.lineage.record import edit_params
from rlx.run.fit import fit
from rlx.run.tracking import read_tracker
from rlx.store.artifacts import read_json, read_rows
from rlx.store.layout import RunLayout

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):
    """A project after an uninterrupted short `rlx fit`, its logs in a folder of their own, with finer timings."""
    project = make_project(tmp_path_factory.mktemp("fit"), tiny_model)
    history = fit(project / "params.yaml", ["log_dir=runs/logs", "debug=true"])
    return project, history


def test_fit_trains_logs_every_step_and_leaves_dvc_clean(finished):
    project, history = finished
    layout = RunLayout(project / "runs" / "demo")
    assert layout.completed_steps() == [1, 2, 3] and len(history) == 3
    assert [layout.step_metrics(step) for step in (1, 2, 3)] == history  # done.json + the stages' metrics
    base = load_file(layout.step(0).policy / "model.safetensors")
    last = load_file(layout.step(3).policy / "model.safetensors")
    assert any((base[name] - last[name]).abs().max() > 0 for name in base), "the policy did not change"
    records = read_tracker(project / "runs" / "logs" / "tracker.jsonl")  # log_dir
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all("response/rewards/mean" in r and "train/loss" in r and "time/dvc" in r for r in records[1:])
    for metrics in history:  # the step's parts (rlx.clock) add up to it, none counted twice, little left out
        parts = {name: seconds for name, seconds in metrics.items() if name.startswith("time/step/")}
        named = ("rollout", "old_logprob", "update", "checkpoint", "record", "evaluate", "other")
        assert {f"time/step/{name}" for name in named} <= set(parts)
        assert sum(parts.values()) == pytest.approx(metrics["time/step"])
        assert 0 <= parts["time/step/other"] <= 0.05 * metrics["time/step"], parts
    assert {r["step"] for r in records if "eval/accuracy" in r} == {0, 2, 3}
    finer = {"time/prepare/cpu", "time/train/cpu", "time/train/forward", "time/train/backward"}  # debug
    assert all(finer <= set(r) for r in records[1:])
    assert list((project / "runs" / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not (layout.work_dir / "tracker.jsonl").exists() and not (layout.work_dir / "wandb").exists()
    assert dvc_status(project) == {}, "DVC must record exactly what the run produced"


def test_every_step_is_addressable_and_checkpoints_follow_retention(finished):
    project, _ = finished
    layout = RunLayout(project / "runs" / "demo")
    for step in (1, 2, 3):
        paths = layout.step(step)
        rollouts, judged = read_rows(paths.rollouts), read_rows(paths.judged)
        assert len(rollouts) == len(judged) == 16
        assert all(len(r["rollout_logprobs"]) == r["response_len"] for r in rollouts)
        assert {r["finish_reason"] for r in rollouts} <= {"stop", "length"}
        lineage = gzip.decompress(paths.lock.read_bytes()).decode()
        assert "train:" in lineage and f"step-{step}/judged.parquet" in lineage
        numbers = read_rows(paths.update)
        assert len(numbers) == 16 and [n["reward_used"] for n in numbers] == [j["reward"] for j in judged]
        assert {n["old_logprob_source"] for n in numbers} == {"loss forward"}
        assert read_json(paths.run_length) == {"total_steps": 3}  # prepare's record of the run's length
        assert (
            read_json(paths.weights_fingerprint)["digest"]
            != read_json(layout.step(step - 1).weights_fingerprint)["digest"]
        )
    # checkpoint_interval=2, maxkeep=1: checkpoints at 0 (the base), 2 and 3 (the last); 2 was pruned once 3 was
    # done, and step 1 never wrote its weights.
    assert layout.checkpoints() == [0, 3]
    assert [n for n in range(4) if layout.step(n).policy.exists()] == [0, 3]
    assert (
        "step-2/checkpoint_outputs.json" in gzip.decompress(layout.step(2).lock.read_bytes()).decode()
    )  # recorded by DVC when it was the newest: the list of its files and their hashes
    assert sorted(p.name for p in (layout.work_dir / "hf").iterdir()) == ["step-3"]  # hf_max_keep=1
    assert read_json(layout.step(3).export_record)["exported"] is True


def test_metrics_and_plots_are_visible_to_dvc(finished):
    project, _ = finished
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        metrics = repo.metrics.show()
        plots = repo.plots.show()
    shown = metrics[""]["data"]
    assert "runs/demo/step-3/judge_metrics.json" in shown
    assert "runs/demo/curves/train.csv" in str(plots) and "runs/demo/curves/eval.csv" in str(plots)
    curve = (project / "runs" / "demo" / "curves" / "eval.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in curve[1:]] == ["0", "2", "3"]


def test_dvc_repro_runs_a_step_cold_from_one_without_checkpoint(finished, tmp_path):
    """`dvc repro` (each stage its own process) of step 2 gives what `rlx fit` (warm, one process) gave,
    though step 1, which it starts from, has no checkpoint: each cold stage re-creates it by replay."""
    project, _ = finished
    cold = Path(shutil.copytree(project, tmp_path / "project", symlinks=True))
    step_two = RunLayout(cold / "runs/demo").step(2)
    shutil.rmtree(step_two.dir)
    edit_params(cold / "params.yaml", ["run.step=2", "run.prev=1", "run.checkpoint=0", "run.rollout_policy=1"])
    run([sys.executable, "-m", "dvc", "repro", "-q"], cold)
    assert not RunLayout(cold / "runs/demo").step(1).policy.exists()
    warm = RunLayout(project / "runs/demo").step(2)
    for name in ("rollouts", "judged", "update"):
        assert read_rows(getattr(step_two, name)) == read_rows(getattr(warm, name)), name
    assert read_json(step_two.weights_fingerprint) == read_json(warm.weights_fingerprint)
    assert read_json(step_two.metrics("train"))["train/loss"] == read_json(warm.metrics("train"))["train/loss"]
    assert dvc_status(cold) == {}


def test_editing_code_marks_exactly_the_stages_that_run_it(finished, tmp_path):
    """dvc.yaml's code deps are the stages' import closures: in a copy of the finished run, editing a
    judger changes every stage that judges and no other, the judge stage only itself, a loss only train."""
    project, _ = finished
    copy = Path(shutil.copytree(project, tmp_path / "project", symlinks=True))
    cases = {
        "src/rlx/judgers/numeric.py": {"base", "rollout", "judge", "evaluate"},
        "src/rlx/stages/judge.py": {"judge"},
        "src/rlx/algo/losses.py": {"train"},
    }
    for name, stages in cases.items():
        file = copy / name
        original = file.read_text()
        file.write_text(original + "# edited\n")
        assert {key.rsplit(":", 1)[-1] for key in dvc_status(copy)} == stages, name  # DVC keys: dvc.yaml:NAME
        file.write_text(original)
    assert dvc_status(copy) == {}


def test_killed_fit_resumes_to_the_same_result(finished, tmp_path, tiny_model):
    project, history = finished
    resumed = make_project(tmp_path, tiny_model)
    command = [sys.executable, "-m", "rlx", "fit", "params.yaml"]
    process = subprocess.Popen(
        command, cwd=resumed, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    target = resumed / "runs/demo/step-2/rollouts.parquet"
    deadline = time.monotonic() + 300
    while not target.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (resumed / "runs/demo/step-3/done.json").exists(), "the kill came too late to test resume"
    run(command, resumed)
    final = load_file(resumed / "runs/demo/step-3/policy/model.safetensors")
    expected = load_file(project / "runs/demo/step-3/policy/model.safetensors")
    assert all((final[k] == expected[k]).all() for k in expected), "resumed weights differ"
    assert RunLayout(resumed / "runs/demo").step_metrics(3)["response/rewards/mean"] == pytest.approx(
        history[-1]["response/rewards/mean"]
    )
    assert [r["step"] for r in read_tracker(resumed / "runs/demo/tracker.jsonl")] == [0, 1, 2, 3]
    assert dvc_status(resumed) == {}


# Not here: async (tests/test_async.py runs it), the agent demo's, which build a model of their own in
# minutes (tests/test_agents.py runs their loop on a small model; tests/test_config.py loads them), and the
# distillation demo's, whose teacher is the finished 30-step demo (tests/test_distill.py distills a real run).
PRESETS = sorted(
    p for p in (ROOT / "configs").glob("*.yaml") if p.stem != "async" and not p.stem.startswith(("agent", "distill"))
)


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_each_algorithm_preset_trains_the_demo(preset, tmp_path, tiny_model):
    from rlx.config import load, preset_overrides

    project = make_project(tmp_path, tiny_model)
    overrides = [*preset_overrides(preset), "rollout_steps=2", "evaluator_config.enable_evaluate=false"]
    history = fit(project / "params.yaml", overrides)
    assert len(history) == 2
    config = load(project / "params.yaml")  # the preset was written into params.yaml, for DVC to record
    pointers = ["run.step=2", "run.prev=1", "run.checkpoint=2", f"run.rollout_policy={config.run.rollout_policy}"]
    assert config == load(ROOT / "params.yaml", [*SHORT_RUN, *overrides, *pointers])
    layout = RunLayout(project / "runs" / "demo")
    sets_upper_clip = any(o.startswith("train_worker_cfg.loss_cfg.policy_loss_cfg.cliprange_high=") for o in overrides)
    for metrics in history:
        parts = [metrics[f"train/clipfrac_{side}"] for side in ("low", "high", "dual")]
        assert metrics["train/clipfrac"] == pytest.approx(sum(parts))  # the three never overlap
        if config.train_worker_cfg.optimizer_steps == 1:  # on-policy: the ratio is 1, no clip can act
            assert metrics["train/ratio_mean"] == pytest.approx(1.0) and metrics["train/clipfrac"] == 0
    if sets_upper_clip and config.train_worker_cfg.optimizer_steps > 1:
        # later mini-batches see a policy that moved: the preset's upper bound acts during the run
        assert max(metrics["train/clipfrac_high"] for metrics in history) > 0
    if config.train_worker_cfg.loss_cfg.use_kl_loss:  # step 1 starts at the reference, step 2 has moved off it
        assert history[0]["train/kl"] == pytest.approx(0.0, abs=1e-6) and history[1]["train/kl"] > 0
    if config.advantage_estimator_config.use_kl_in_reward:
        coef = config.advantage_estimator_config.kl_ctrl.kl_coef
        judged, used = read_rows(layout.step(2).judged), read_rows(layout.step(2).update)
        expected = [j["reward"] - coef * u["kl"] for j, u in zip(judged, used, strict=True)]
        assert [u["reward_used"] for u in used] == pytest.approx(expected)
        # a float32 mean of terms of both signs against a float64 sum of them: agree to float32's rounding
        assert history[1]["train/kl_in_reward"] == pytest.approx(sum(u["kl"] for u in used) / len(used), rel=1e-5)
    if config.dataflow_config.enable_dynamic_sampling:
        for step, metrics in enumerate(history, start=1):
            check_dynamic_sampling(config, layout.step(step), metrics)
        for step in (1, 2):  # the judge stage reused the filter's verdicts: both saw the same rewards
            paths = layout.step(step)
            judged = [
                {k: v for k, v in r.items() if k not in ("step", "group", "sample")} for r in read_rows(paths.judged)
            ]
            assert [row["judgment"] for row in read_rows(paths.rollouts)] == judged
    assert dvc_status(project) == {}


def check_dynamic_sampling(config, paths, metrics: dict) -> None:
    """The step's metrics against its artifacts: the kept groups are the rollouts, all informative, and
    the batches drawn are the fewest that held enough of them (or every batch, if none did)."""
    size, k = config.dataflow_config.global_batch_size, config.dataflow_config.prompt_repeat_k
    prompts, rollouts = read_rows(paths.prompts), read_rows(paths.rollouts)
    batch_of = {row["group"]: row["batch"] for row in prompts}
    kept, generated = metrics["filter/kept_groups"], metrics["filter/generated_batches"]
    if kept:
        assert len(rollouts) == kept * k
        assert metrics["response/zero_std_groups_frac"] == 0
    if kept == size:  # the batches before the last drawn held fewer than a batch of informative groups
        assert max(batch_of[row["group"]] for row in rollouts) == generated - 1
    else:
        assert generated == len(set(batch_of.values())) == 1 + config.dataflow_config.max_retry_times
