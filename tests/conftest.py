"""Shared fixtures: the demo task and the tiny model are built once per session, in a temp folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from rlx import config  # noqa: E402
from rlx.tasks import gsm8k, math500  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
DATA = ROOT / "data"


# `make test` runs the suite on two pytest-xdist workers: each test file goes to one worker whole, so its
# module fixtures (a finished run, mostly) are made once, and the files that start a Ray instance go to
# one worker together, so one runs at a time (they check that their runs leave no Ray process behind).
RAY_FILES = {"test_async.py", "test_distributed.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "ray" if Path(file).name in RAY_FILES else file

    return ByFile(config, log)


# The files whose runs take longest (`pytest --durations`) go first, so that no worker is left with a
# long file at the end while the other idles; but while the first of them builds the tiny model (minutes),
# then the run it shares with test_shared_repo (two_step_run), the files that never need them go to the
# other worker, then test_pipeline and test_readme, which need the model only, then the Ray files (8 minutes together).
SLOWEST_FIRST = [
    "test_resume.py", "test_pipeline.py", "test_readme.py", *sorted(RAY_FILES), "test_shared_repo.py", "test_notebooks.py"
]  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    needs_model = {item.path.name for item in items if "tiny_model" in item.fixturenames}
    order = [SLOWEST_FIRST[0], *sorted({item.path.name for item in items} - needs_model), *SLOWEST_FIRST[1:]]
    rank = {name: index for index, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def demo_config(base: Path, *overrides: str):
    """The demo's params with every output under ``base``."""
    return config.load(
        PARAMS,
        [
            f"synthetic_task.output_dir={base / 'arith'}",
            f"tiny_model.output_dir={base / 'tiny-qwen3'}",
            f"tiny_model.metrics_path={base / 'warm_start.json'}",
            *overrides,
        ],
    )


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory):
    from rlx.tasks.arith import write_dataset

    cfg = demo_config(tmp_path_factory.mktemp("demo"))
    write_dataset(cfg.synthetic_task)
    return cfg


BUILD_INPUTS = [
    "src/rlx/tasks/tiny_model.py",
    "src/rlx/tasks/arith.py",
    "src/rlx/tasks/rows.py",
    "src/rlx/tasks/data.py",
    "params.yaml",
]


def build_key() -> str:
    """What the tiny model's build depends on: its code, the demo params and the library versions."""
    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    for name in BUILD_INPUTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_model(demo_data, request, tmp_path_factory):
    """The demo's base model, built exactly as `rlx init-model params.yaml` builds it. The build is
    deterministic, so a local rerun reuses the last one from pytest's cache while its inputs are
    unchanged (a clean checkout, as in CI, always builds), and of the suite's parallel workers only the
    first builds it: the others wait for it and copy it."""
    from filelock import FileLock

    from rlx.tasks.tiny_model import build

    stored = model_store(request, tmp_path_factory)
    model, metrics = demo_data.tiny_model.output_dir, demo_data.tiny_model.metrics_path
    with FileLock(f"{stored}.lock") if stored else contextlib.nullcontext():
        if stored and (stored / "metrics.json").is_file():
            shutil.copytree(stored / "model", model)
            shutil.copy2(stored / "metrics.json", metrics)
            return demo_data, json.loads(metrics.read_text())
        built = build(demo_data)
        if stored:
            shutil.copytree(model, stored / "model", dirs_exist_ok=True)
            shutil.copy2(metrics, stored / "metrics.json")  # last: marks the copy complete
    return demo_data, built


def model_store(request, tmp_path_factory) -> Path | None:
    """Where the built tiny model is kept for reuse: pytest's cache, else (pytest-xdist without a cache)
    the folder the workers' temp folders share; None for a lone process without a cache."""
    cache = getattr(request.config, "cache", None)
    if cache:
        return cache.mkdir(f"tiny-model-{build_key()}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.getbasetemp().parent / f"tiny-model-{build_key()}"
    return None


@pytest.fixture(scope="session")
def untrained_model(tmp_path_factory):
    """The demo's inputs in seconds, shaped like ``tiny_model``: 400 problems and a small Qwen3 with its
    tokenizer, not warm-started. For tests of plumbing and error paths, where learning does not matter."""
    from rlx.tasks.arith import write_dataset
    from rlx.tasks.data import load_rows
    from rlx.tasks.tiny_model import chat_text, create_model, save, train_tokenizer

    cfg = demo_config(
        tmp_path_factory.mktemp("untrained"),
        *("synthetic_task.train_size=400", "synthetic_task.test_size=20", "tiny_model.sft_steps=0"),
        *("tiny_model.hidden_size=32", "tiny_model.intermediate_size=64", "tiny_model.num_hidden_layers=1"),
        *("tiny_model.num_attention_heads=2", "tiny_model.num_key_value_heads=1"),
    )
    write_dataset(cfg.synthetic_task)
    rows = load_rows(cfg.synthetic_task.output_dir / "train.parquet")
    tokenizer = train_tokenizer(
        [text for row in rows for text in (chat_text(row["prompt"]), row["extra_info"]["solution"])],
        cfg.tiny_model.vocab_size,
    )
    save(create_model(cfg.tiny_model, tokenizer), tokenizer, cfg.tiny_model.output_dir)
    metrics = {"held_out_accuracy": 0.0, "vocab_size": len(tokenizer)}
    cfg.tiny_model.metrics_path.write_text(json.dumps(metrics) + "\n")
    return cfg, metrics


# ---- throwaway projects for pipeline tests -----------------------------------------------------

SHORT_RUN = [
    "run.step=1",  # the repo's params.yaml may point at a later step after a local `make fit`
    "run.prev=0",
    "run.rollout_policy=0",
    "run.checkpoint=0",
    "rollout_steps=3",
    "dataflow_config.global_batch_size=4",
    "dataflow_config.prompt_repeat_k=4",
    "evaluator_config.evaluate_step=2",
    "evaluator_config.eval_sample_ratio=0.1",
    "checkpoint_interval=2",
    "checkpoint_maxkeep=1",
    "hf_interval=2",
]


def make_project(base: Path, tiny_model) -> Path:
    """A fresh project: the repo's pipeline and code, the session's demo data and model, committed to DVC."""
    cfg, _ = tiny_model
    project = base / "project"
    project.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".dvcignore"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(cfg.synthetic_task.output_dir, project / "data" / "arith")
    shutil.copytree(cfg.tiny_model.output_dir, project / "data" / "tiny-qwen3")
    shutil.copy2(cfg.tiny_model.metrics_path, project / "data" / "warm_start.json")
    for public in ("gsm8k/train", "gsm8k/test", "math500/test"):
        (project / "data" / public).parent.mkdir(exist_ok=True)
        shutil.copy2(DATA / f"{public}.jsonl", project / "data" / f"{public}.jsonl")
    gsm8k.convert(DATA / "gsm8k/train.jsonl", project / "data/gsm8k/train.parquet", "train")
    gsm8k.convert(DATA / "gsm8k/test.jsonl", project / "data/gsm8k/test.parquet", "test")
    math500.convert(DATA / "math500/test.jsonl", project / "data/math500/test.parquet")
    has_git = shutil.which("git") is not None  # the lent GPU machine may lack it: DVC then runs without SCM
    if has_git:
        run(["git", "init", "-q"], project)
    run([sys.executable, "-m", "dvc", "init", "-q", *([] if has_git else ["--no-scm"])], project)
    run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], project)
    # The data and model were made by the same code outside DVC: record them as its stages' outputs.
    stages = ["init_data", "init_model", "convert_gsm8k@train", "convert_gsm8k@test", "convert_math500"]
    run([sys.executable, "-m", "dvc", "commit", "-f", "-q", *stages], project)
    from rlx.lineage.record import edit_params

    edit_params(project / "params.yaml", SHORT_RUN)
    return project


@pytest.fixture(scope="session")
def two_step_run(tiny_model, tmp_path_factory) -> tuple[Path, Path]:
    """The demo's project set to 2 steps without W&B: as made (pristine) and after an uninterrupted `rlx fit`
    (finished), the start and the reference of test_resume and test_shared_repo. Made once for the whole
    suite: the first worker to ask makes it, the other waits for it. Copy them before changing anything."""
    from filelock import FileLock

    from rlx.lineage.record import edit_params

    base = tmp_path_factory.getbasetemp()
    store = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "two-step-run"
    pristine, finished = store / "pristine" / "project", store / "finished" / "project"
    with FileLock(f"{store}.lock"):
        if not (store / "done").is_file():
            shutil.rmtree(store, ignore_errors=True)
            (store / "pristine").mkdir(parents=True)
            make_project(store / "pristine", tiny_model)
            edit_params(pristine / "params.yaml", ["rollout_steps=2", "wandb.enabled=false"])
            (store / "finished").mkdir()
            fitted_copy(pristine, store / "finished")
            (store / "done").touch()  # last: marks it complete
    return pristine, finished


@pytest.fixture(scope="session")
def agent_project(untrained_model, tmp_path_factory) -> Path:
    """A project for a 2-step agent run (configs/agent_calculator.yaml's loop, helpers.teaching.AGENT_RUN) of the
    untrained model taught to call ``helpers.agents:logged_add``, without evaluation. Not run: copy it."""
    from helpers.teaching import AGENT_RUN, agent_inputs
    from rlx.lineage.record import edit_params

    base = tmp_path_factory.mktemp("agent")
    project = make_project(base, agent_inputs(untrained_model, base / "inputs"))
    settings = ["rollout_steps=2", "wandb.enabled=false", "evaluator_config.enable_evaluate=false"]
    edit_params(project / "params.yaml", [*AGENT_RUN, *settings])
    return project


@pytest.fixture(scope="session")
def agent_run(agent_project, tmp_path_factory) -> Path:
    """A copy of ``agent_project`` run by `rlx fit` to its end, uninterrupted."""
    return fitted_copy(agent_project, tmp_path_factory.mktemp("agent-run"))


def fitted_copy(project: Path, base: Path) -> Path:
    """A copy of ``project`` under ``base``, run by `rlx fit` to its end, uninterrupted."""
    copy = Path(shutil.copytree(project, base / "project", symlinks=True))
    done = fit(copy)
    assert done.returncode == 0, done.stderr[-3000:]
    return copy


RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # set by this process's DeepSpeed


def child_env() -> dict:
    """This process's environment for a child rlx, without the rendezvous of this process's DeepSpeed."""
    env = {name: value for name, value in os.environ.items() if name not in RENDEZVOUS}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    # the test helpers importable, so a run's config may name their tools as a user names their own
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH")]))
    return env


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def dvc_status(project: Path) -> dict:
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        return repo.status()


def fit(project: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    """`rlx fit params.yaml` in a process of its own, killed at ``fault`` (rlx.store.faults) if given."""
    env = child_env() | ({"RLX_FAULT": fault} if fault else {})
    return subprocess.run(
        [sys.executable, "-m", "rlx", "fit", "params.yaml"], cwd=project, env=env, capture_output=True, text=True
    )


def killed_and_resumed(project: Path, faults: list[str], steps: int) -> str:
    """Kill `rlx fit` at each of ``faults`` in turn, then finish the run of ``steps`` steps; what went wrong,
    if anything, else "resumed to the reference"."""
    from rlx.run.tracking import read_tracker

    for number, fault in enumerate(faults):
        killed = fit(project, fault)
        if killed.returncode != -9:
            return f"RLX_FAULT={fault} did not kill the run:\n{killed.stderr[-3000:]}"
        if number and "taking over from rlx fit" not in killed.stderr:
            return f"RLX_FAULT={fault}: the killed run's lock was not noticed"
    done = fit(project)
    if done.returncode != 0:
        return done.stderr[-3000:]
    if [r["step"] for r in read_tracker(project / "runs/demo/tracker.jsonl")] != list(range(steps + 1)):
        return "the tracker does not hold every step once"
    if list((project / "runs/demo").glob("**/.*.tmp-*")):
        return "a killed writer's temporary was left behind"
    if status := dvc_status(project):
        return f"dvc status: {status}"
    return "resumed to the reference"
