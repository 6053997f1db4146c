"""The notebooks, executed top to bottom against a real short run (and a second one to compare),
and the terminal views built on the same loaders."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, child_env, dvc_status, make_project
from rlx.cli import main
from rlx.config import load
from rlx.errors import UserError
from rlx.explore import Run, compare
from rlx.run.fit import fit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    project = make_project(tmp_path_factory.mktemp("notebooks"), tiny_model)
    fit(project / "params.yaml", [])
    fit(project / "params.yaml", ["work_dir=runs/other", "train_worker_cfg.optim_cfg.lr=5e-5"])
    return project / "runs" / "demo", project / "runs" / "other"


def execute(name: str, parameters: str, folder: Path) -> None:
    """Run notebook ``name`` top to bottom with its parameters cell replaced; it must draw, not fail, and
    print plain lines (no terminal codes, no libraries' warnings, no bar redrawn hundreds of times)."""
    book = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), "stored with outputs"
    next(cell for cell in book.cells if "parameters" in cell.metadata.get("tags", [])).source = parameters
    client = NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    with mock.patch.dict(os.environ, child_env(), clear=True):  # the kernel starts DeepSpeed's rendezvous afresh
        client.execute()
    outputs = [output for cell in book.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    noise = [mark for mark in ("\x1b[", "cannot find -l", "collect2", "TqdmWarning", "IProgress") if mark in printed]
    assert not noise and len(outputs) < 60, f"{len(outputs)} outputs, with {noise}: {printed[-1500:]!r}"


@pytest.mark.parametrize("name", ["explore_rollouts", "rewards", "training_curves"])
def test_notebook_runs_top_to_bottom_and_draws(name, runs, tmp_path, request):
    """explore_rollouts shows an agent run's turns too (AGENT_RUN; the demo run is none) and a distilled run's
    teacher log-probs (DISTILL_RUN; here the demo run, which says it was not distilled)."""
    agent = request.getfixturevalue("agent_run") / "runs/demo" if name == "explore_rollouts" else None
    parameters = f"RUN = {str(runs[0])!r}\nRUN_B = {str(runs[1])!r}\nSTEP = None\nAGENT_RUN = {str(agent)!r}"
    parameters += "\nDISTILL_RUN = None"  # the demo run, not distilled (test_distill runs it on a distilled one)
    execute(name, parameters, tmp_path)


def test_an_agent_rollout_part_by_part_and_token_by_token_from_anywhere(agent_run, tmp_path, monkeypatch):
    """The turns and the tokens agree on what the loss reads; the run's relative tokenizer_path is found
    from another working directory (a notebook's)."""
    monkeypatch.chdir(tmp_path)
    run = Run(agent_run / "runs/demo")
    samples = run.samples(2)
    chosen = samples[samples["turns"] == 2].iloc[0]
    turns, tokens = (view(2, chosen["group"], chosen["sample"]) for view in (run.turns, run.tokens))
    assert turns["who"].tolist()[:3] == ["model", "tool", "model"] and len(tokens) == chosen["response_len"]
    assert tokens["trained"].sum() == turns.loc[turns["trained"], "tokens"].sum()
    assert tokens["logprob"].isna().tolist() == (~tokens["trained"]).tolist()
    assert turns["calls"][1][0]["tool"] == "ping" and "pong" in turns["text"][1]
    with pytest.raises(UserError, match="no agent rollout of group 99"):
        run.tokens(2, 99, 0)


def test_quickstart_starts_a_run_from_python_and_opens_it(tiny_model, tmp_path):
    """The notebook builds an RLTrainer as XTuner's GRPO tutorial does; its fit writes the parameters into
    params.yaml, which DVC records."""
    project = make_project(tmp_path, tiny_model)
    execute("quickstart", f"PROJECT = {str(project)!r}", tmp_path)
    assert Run(project / "runs" / "quickstart").steps() == [1, 2]
    recorded = load(project / "params.yaml")
    assert (recorded.rollout_steps, recorded.evaluator_config.evaluate_step, recorded.wandb.mode) == (2, 1, "disabled")
    assert dvc_status(project) == {}


def test_loaders_join_rollouts_judgments_and_advantages(runs):
    run = Run(runs[0])
    samples = run.samples(3)
    assert len(samples) == 16 and {"question", "reward", "advantage", "correct", "extracted"} <= set(samples)
    group_sums = samples.groupby("group")["advantage"].sum()
    assert (group_sums.abs() < 1e-4).all()  # GRPO advantages are centred in every group
    history = run.history()
    assert list(history.index) == [0, 1, 2, 3] and history.loc[3, "eval/accuracy"] >= 0
    params, last = compare(run, Run(runs[1]))
    assert params.loc["train_worker_cfg.optim_cfg.lr"].tolist() == [1e-4, 5e-5]
    assert "work_dir" in params.index and "response/rewards/mean" in last.index


def test_show_and_compare_in_the_terminal(runs, capsys, monkeypatch):
    from rlx import cli

    monkeypatch.setattr(cli.console, "width", 80)
    with pytest.raises(SystemExit) as exited:
        main(["show", str(runs[0]), "--step", "2"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "step 2" in shown and "reward" in shown
    lines = shown.rstrip("\n").splitlines()  # the title, the header, then one line a response (4 x 4)
    assert len(lines) == 2 + 16 and max(map(len, lines)) <= 80, shown
    with pytest.raises(SystemExit):
        main(["compare", str(runs[0]), str(runs[1])])
    compared = capsys.readouterr().out
    assert "train_worker_cfg.optim_cfg.lr" in compared
    with pytest.raises(SystemExit) as exited:
        main(["show", str(runs[0].parent)])
    assert exited.value.code == 2 and "not an rlx run" in capsys.readouterr().err
