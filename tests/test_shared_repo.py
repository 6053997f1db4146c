"""Faults of a shared repository and a changed run, through real `rlx fit` processes: a second run in
the same repository, a configuration edited between a kill and the rerun, a step folder deleted, and
inputs that must be refused before anything is written (params.yaml and the work_dir left as they were).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import child_env, dvc_status
from rlx.cli import main
from rlx.lineage.record import edit_params
from rlx.run.tracking import read_tracker
from rlx.store.layout import RunLayout

pytestmark = pytest.mark.slow

FIT = [sys.executable, "-m", "rlx", "fit", "params.yaml"]


@pytest.fixture(scope="module")
def pristine(two_step_run) -> Path:
    return two_step_run[0]


@pytest.fixture(scope="module")
def finished(two_step_run) -> Path:
    return two_step_run[1]


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
    edit_params(project / "params.yaml", ["train_worker_cfg.optim_cfg.lr=2.0e-4"])  # edited by hand after the run
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
    logged = read_tracker(layout.work_dir / "tracker.jsonl")
    shutil.rmtree(layout.step(1).dir)
    done = fit(project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1 missing; making it again" in done.stderr
    assert {name: (layout.step(1).dir / name).read_bytes() for name in kept} == kept
    assert layout.completed_steps() == [1, 2] and read_tracker(layout.work_dir / "tracker.jsonl") == logged
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


def edited_command(project: Path) -> str:
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(
        dvc_yaml.read_text().replace("rlx stage train params.yaml", "rlx stage train params.yaml -S seed=7")
    )
    return "seed=42"


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
    "work_dir outside the project": (
        lambda project: f"work_dir={project.parent / 'elsewhere'}",
        "elsewhere: outside the DVC project",
    ),
    "a stage's command edited in dvc.yaml": (
        edited_command,
        "dvc.yaml: stage train runs `rlx stage train params.yaml -S seed=7`; rlx runs it as `rlx stage train "
        "params.yaml` in the project's folder, so that what DVC records is what ran",
    ),
    "unknown judger": (
        lambda _: "judger_config.reward_judger_configs.0.judger_name=nope",
        "unknown judger 'nope'; available: arith, custom, environment, format, gsm8k, math, reward_model",
    ),
    "judger option it does not take": (
        lambda _: "judger_config.reward_judger_configs.0.options={nonsense: 1}",
        "judger 'arith': bad options {'nonsense': 1}",
    ),
    "a format judger's pattern that is no regex": (
        lambda _: (
            'judger_config.reward_judger_configs=[{"judger_name": "format", "data_source": ["rlx/arith"], '
            '"options": {"pattern": "(unclosed"}}]'
        ),
        "judger 'format': pattern '(unclosed' is not a regular expression (missing ), unterminated subpattern",
    ),
    "data_source no judger scores": (
        lambda _: "judger_config.reward_judger_configs.0.data_source=[someone/else]",
        "no judger scores data_source 'rlx/arith'; judger_config.reward_judger_configs covers ['someone/else']",
    ),
    "fewer prompts than a batch": (
        lambda _: "dataflow_config.global_batch_size=100000",
        "longer than replay_buffer_config.max_prompt_length), fewer than dataflow_config.global_batch_size=100000",
    ),
    "LoRA rank past any layer's": (
        lambda _: "train_worker_cfg.lora.rank=1000000000",
        "train_worker_cfg.lora.rank: 1000000000 exceeds the rank any adapted layer of the model in load_from "
        "data/tiny-qwen3 can have",
    ),
    "a million responses per prompt": (
        lambda _: "dataflow_config.prompt_repeat_k=1000000",
        "dataflow_config.prompt_repeat_k: Input should be less than or equal to 1024; got 1000000",
    ),
    "a step past the machine's memory": (
        lambda _: "dataflow_config.global_batch_size=1000000000",
        "dataflow_config: a step of 1000000000 prompts x 4 responses (prompt_repeat_k) of up to 160 tokens needs "
        "about 9,537 GiB to hold its rollouts, more than this machine's",
    ),
    "responses past the model's context": (
        lambda _: "dataflow_config.sample_params.max_tokens=100000",
        "dataflow_config.sample_params.max_tokens: 100000 new tokens after a prompt of up to "
        "replay_buffer_config.max_prompt_length=128 exceed the model's context of 256 tokens",
    ),
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


def run_files(project: Path) -> dict[str, bytes]:
    """The run's files and the DVC record: what a refused stage must leave exactly as they were."""
    files = {str(p.relative_to(project)): p.read_bytes() for p in (project / "runs").rglob("*") if p.is_file()}
    return files | {name: (project / name).read_bytes() for name in ("dvc.lock", "params.yaml")}


def dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=project, env=child_env(), capture_output=True, text=True
    )


def test_dvc_repro_of_a_run_with_an_edited_configuration_is_refused_and_changes_nothing(finished, tmp_path):
    """`dvc repro` runs `rlx stage`, which makes `rlx fit`'s checks: the run's steps were made with another
    learning rate, so its train stage refuses; DVC, told the outputs persist, deleted none of them."""
    project = copy(finished, tmp_path)
    edit_params(project / "params.yaml", ["train_worker_cfg.optim_cfg.lr=0.05"])
    before = run_files(project)
    done = dvc(project, "repro")
    error = " ".join(done.stderr.split())
    assert done.returncode != 0 and "Traceback" not in error, error
    assert "error: work_dir runs/demo holds a run made with another configuration (runs/demo/config.yaml): " in error
    assert "train_worker_cfg.optim_cfg.lr: 0.0001 -> 0.05" in error and "failed to reproduce 'train'" in error
    assert run_files(project) == before


REPOSITORY_HOLDER = """
import sys, time
from pathlib import Path
from rlx.run.worklock import hold_repository
with hold_repository(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_stage_run_while_rlx_fit_holds_the_repository_is_refused_and_changes_nothing(finished, tmp_path, capsys):
    project = copy(finished, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", REPOSITORY_HOLDER, str(project)], env=child_env(), stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline() == b"held\n"
        before = run_files(project)
        done = dvc(project, "repro", "--force", "--single-item", "export")
        assert done.returncode != 0 and f"the repository {project.resolve()} is in use by " in " ".join(
            done.stderr.split()
        ), done.stderr[-3000:]
        assert run_files(project) == before
    finally:
        holder.kill()
        holder.wait()


def experiments(shown) -> dict[str, dict]:
    """``dvc exp show --json``'s experiments by name: their params and metrics."""
    found = {}
    if isinstance(shown, dict):
        if shown.get("name") and isinstance(shown.get("data"), dict):
            found[shown["name"]] = shown["data"]
        for value in shown.values():
            found |= experiments(value)
    elif isinstance(shown, list):
        for value in shown:
            found |= experiments(value)
    return found


def test_finished_runs_are_dvc_experiments_side_by_side(finished, tmp_path):
    project = copy(finished, tmp_path)
    (project / ".gitignore").write_text("runs/\nmetrics.json\n")  # as the repository's own
    git = ["git", "-c", "user.name=rlx tests", "-c", "user.email=tests@rlx"]
    for command in (["add", "-A"], ["commit", "-q", "-m", "the project"]):
        subprocess.run([*git, *command], cwd=project, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout
    demo, b = (f"{folder}-{head[:7]}" for folder in ("demo", "b"))  # unique across commits, still readable
    assert f"saved as DVC experiment {demo}" in fit(project).stdout  # finished already: recorded again, and saved
    second = fit(project, "work_dir=runs/b", "train_worker_cfg.optim_cfg.lr=2.0e-4")
    assert second.returncode == 0 and f"saved as DVC experiment {b}" in second.stdout, second.stderr[-3000:]
    shown = experiments(json.loads(dvc(project, "exp", "show", "--json").stdout))
    shown = {name: data for name, data in shown.items() if name in {demo, b}}  # not the baseline row
    lr = {name: shown[name]["params"]["params.yaml"]["data"]["train_worker_cfg"]["optim_cfg"]["lr"] for name in shown}
    assert lr == {demo: 1e-4, b: 2e-4}
    summaries = {name: shown[name]["metrics"]["metrics.json"]["data"] for name in shown}
    assert {name: summary["step"] for name, summary in summaries.items()} == {demo: 2, b: 2}
    assert summaries[demo] == json.loads((finished / "metrics.json").read_text())
    diff = dvc(project, "exp", "diff", "--all", demo, b).stdout
    assert "train_worker_cfg.optim_cfg.lr" in diff and "response/rewards/mean" in diff
    assert subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout == head
    assert dvc_status(project) == {}


def test_experiment_names_are_unique_across_commits_and_work_dirs(tmp_path):
    from rlx.lineage.experiment import experiment_name

    commit, other = "6c7da9c1" + "0" * 32, "79469cf5" + "0" * 32
    assert experiment_name(Path("runs/demo"), tmp_path, commit) == "demo-6c7da9c"
    assert experiment_name(Path("runs/demo"), tmp_path, other) == "demo-79469cf"  # another commit's demo run
    assert experiment_name(Path("runs/sweep/lr2e-4"), tmp_path, commit) == "sweep-lr2e-4-6c7da9c"
    assert experiment_name(tmp_path / "runs/x/demo", tmp_path, commit) == "x-demo-6c7da9c"
    assert experiment_name(Path("/elsewhere/demo"), tmp_path, commit) == "demo-6c7da9c"
