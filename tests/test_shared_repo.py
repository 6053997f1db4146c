"""Faults of a shared repository and a changed run, through real `rlx fit` processes: a second run in
the same repository, a configuration edited between a kill and the rerun, a step folder deleted, and
inputs that must be refused before anything is written (params.yaml and the work_dir left as they were).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import child_env, dvc_status, make_project
from rlx.cli import main
from rlx.layout import RunLayout
from rlx.record import edit_params
from rlx.tracking import read_tracker

pytestmark = pytest.mark.slow

FIT = [sys.executable, "-m", "rlx", "fit", "params.yaml"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_model) -> Path:
    project = make_project(tmp_path_factory.mktemp("shared"), tiny_model)
    edit_params(project / "params.yaml", ["rollout_steps=2", "wandb.enabled=false"])
    return project


@pytest.fixture(scope="module")
def finished(pristine, tmp_path_factory) -> Path:
    project = copy(pristine, tmp_path_factory.mktemp("finished"))
    done = fit(project)
    assert done.returncode == 0, done.stderr[-3000:]
    return project


def copy(project: Path, base: Path) -> Path:
    return Path(shutil.copytree(project, base / "project", symlinks=True))


def fit(project: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [*FIT, *(part for o in overrides for part in ("-S", o))]
    return subprocess.run(command, cwd=project, env=child_env(), capture_output=True, text=True)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return " ".join(done.stderr.split())  # the console wraps long lines


def test_a_second_run_in_the_repository_is_refused_and_the_first_goes_on(pristine, tmp_path):
    project = copy(pristine, tmp_path)
    first = subprocess.Popen(
        [*FIT, "-S", "work_dir=runs/a"], cwd=project, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lock = project / ".dvc" / "tmp" / "rlx-fit.lock"
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    second = one_line_error(fit(project, "work_dir=runs/b", "seed=7"))
    assert f"error: the repository {project.resolve()} is in use by rlx fit params.yaml -S work_dir=runs/a (pid " in (
        second
    )
    assert "run the second experiment in a git worktree or clone of its own" in second
    params = (project / "params.yaml").read_text()
    assert "runs/b" not in params and "seed: 7" not in params and not (project / "runs/b").exists()
    _, errors = first.communicate(timeout=600)
    assert first.returncode == 0, errors[-3000:]
    assert dvc_status(project) == {}


def test_a_configuration_changed_since_the_run_started_is_refused(finished, tmp_path):
    project = copy(finished, tmp_path)
    edit_params(project / "params.yaml", ["train_worker_cfg.optim_cfg.lr=2e-4"])  # edited by hand after the run
    error = one_line_error(fit(project))
    assert (
        "error: work_dir runs/demo holds a run made with another configuration (runs/demo/config.yaml): "
        "train_worker_cfg.optim_cfg.lr: 0.0001 -> 0.0002; put the recorded values back to resume it, or start a "
        "new run in another work_dir"
    ) in error
    edit_params(project / "params.yaml", ["train_worker_cfg.optim_cfg.lr=1.0e-4"])
    params = (project / "params.yaml").read_bytes()
    error = one_line_error(fit(project, "dataflow_config.sample_params.temperature=0.5"))
    assert "dataflow_config.sample_params.temperature: 1.0 -> 0.5" in error
    assert (project / "params.yaml").read_bytes() == params  # the override was not written
    assert fit(project, "checkpoint_maxkeep=2").returncode == 0  # retention changes no step
    assert dvc_status(project) == {}


def test_a_deleted_step_is_made_again_as_it_was(finished, tmp_path):
    project = copy(finished, tmp_path)
    layout = RunLayout(project / "runs/demo")
    kept = {name: (layout.step(1).dir / name).read_bytes() for name in ("fingerprint.json", "judged.parquet")}
    logged = read_tracker(layout.tracker)
    shutil.rmtree(layout.step(1).dir)
    done = fit(project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1 missing; making it again" in done.stderr
    assert {name: (layout.step(1).dir / name).read_bytes() for name in kept} == kept
    assert layout.completed_steps() == [1, 2] and read_tracker(layout.tracker) == logged
    assert dvc_status(project) == {}


def broken_rows(project: Path) -> str:
    (project / "bad.jsonl").write_text('{"data_source": "rlx/arith", "reward_model": {"ground_truth": "4"}}\n')
    return "replay_buffer_config.dataset_cfg.0.anno_path=bad.jsonl"


def truncated_model(project: Path) -> str:
    shutil.copytree(project / "data/tiny-qwen3", project / "models/cut")
    weights = project / "models/cut/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return "load_from=models/cut"


def a_file(project: Path) -> str:
    (project / "runs").mkdir()
    (project / "runs/new").write_text("not a folder")
    return "work_dir=runs/new"


REFUSED = {
    "broken dataset row": (broken_rows, "bad.jsonl: row 0: missing column 'prompt'"),
    "truncated weights": (
        truncated_model,
        "load_from models/cut: model.safetensors is damaged (Error while deserializing header",
    ),
    "work_dir in a stage output": (
        lambda _: "work_dir=data/arith/run",
        "work_dir data/arith/run overlaps data/arith, which a pipeline stage writes (see dvc.yaml)",
    ),
    "load_from inside work_dir": (
        lambda _: "load_from=runs/new/step-0/policy",
        "load_from runs/new/step-0/policy is inside work_dir runs/new: the run would train from its own outputs",
    ),
    "work_dir is a file": (a_file, "work_dir runs/new: is a file; give a folder"),
}


@pytest.mark.parametrize("case", REFUSED, ids=REFUSED)
def test_a_refused_run_writes_nothing(case, pristine, tmp_path, capsys, monkeypatch):
    project = copy(pristine, tmp_path)
    make, message = REFUSED[case]
    override = make(project)
    params, lock = (project / "params.yaml").read_bytes(), (project / "dvc.lock").read_bytes()
    before = {p for p in project.rglob("*") if ".dvc" not in p.parts}
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as exited:
        main(["fit", "params.yaml", "-S", "work_dir=runs/new", "-S", override])
    error = " ".join(capsys.readouterr().err.split())
    assert exited.value.code == 2 and message in error and "Traceback" not in error, error
    assert (project / "params.yaml").read_bytes() == params and (project / "dvc.lock").read_bytes() == lock
    assert {p for p in project.rglob("*") if ".dvc" not in p.parts} == before
