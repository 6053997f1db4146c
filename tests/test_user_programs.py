"""A user's own program runs ``RLTrainer(...).fit()`` to the end however it is started (a script without a
``__main__`` guard, stdin, ``-c``, IPython), and rlx never executes that program a second time: the
processes rlx starts (the DVC recorder, the judgers' pool) must not re-import the user's ``__main__``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env, dvc_status, make_project

pytestmark = pytest.mark.slow

# No guard, as the README's examples are written: everything at the top level. Each start adds one step
# Each execution of the program's top level adds a line to ran.txt, and each start makes a one-step run of its own.
PROGRAM = """\
from pathlib import Path

with Path("ran.txt").open("a") as ran:
    ran.write("ran\\n")

from rlx import RLTrainer

starts = len(Path("ran.txt").read_text().splitlines())
trainer = RLTrainer(work_dir=f"runs/start-{{starts}}", rollout_steps=1, wandb={{"enabled": False}}{judging})
run = trainer.fit()
print("steps:", run.steps())
"""
# A judger that may hang runs in the judgers' worker pool, the other processes rlx starts besides the recorder
# (the other starts keep the demo's judger, which runs in the run's process).
POOLED_JUDGERS = {
    "reward_judger_configs": [
        {"judger_name": "math", "data_source": ["rlx/arith"]},
    ]
}


@pytest.fixture(scope="module")
def project(untrained_model, tmp_path_factory) -> Path:
    from rlx.lineage.record import edit_params

    project = make_project(tmp_path_factory.mktemp("user-programs"), untrained_model)
    edit_params(project / "params.yaml", ["evaluator_config.enable_evaluate=false", "hf_interval=-1"])
    return project


def started(how: str, text: str, project: Path) -> subprocess.CompletedProcess:
    """``text`` run as a user's program, started ``how``."""
    program = project / "train.py"
    program.write_text(text)
    python = [sys.executable]
    commands = {
        "script": ([*python, str(program)], None),
        "stdin": ([*python, "-"], text),
        "-c": ([*python, "-c", text], None),
        "ipython": ([*python, "-m", "IPython", "--no-banner", "--quick", str(program)], None),
    }
    command, stdin = commands[how]
    return subprocess.run(
        command, cwd=project, env=child_env(), input=stdin, capture_output=True, text=True, timeout=600
    )


def test_a_program_without_a_guard_runs_once_however_it_is_started(project):
    for number, how in enumerate(["script", "stdin", "-c", "ipython"], start=1):
        judging = f", judger_config={POOLED_JUDGERS}" if how == "stdin" else ""  # the pool is slow to start: once
        done = started(how, PROGRAM.format(judging=judging), project)
        assert done.returncode == 0, f"{how}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "steps: [1]" in done.stdout, f"{how}: {done.stdout[-2000:]}"
        assert (project / "ran.txt").read_text().splitlines() == ["ran"] * number, f"{how} ran the program again"


def test_a_run_names_what_differs_from_the_committed_params_and_rlx_reset_returns_to_it(untrained_model, tmp_path):
    project = make_project(tmp_path, untrained_model)
    committed = (project / "params.yaml").read_text()
    git = ["git", "-c", "user.name=rlx", "-c", "user.email=rlx@localhost"]
    for command in (["add", "params.yaml", "dvc.yaml", "dvc.lock", ".dvc/config"], ["commit", "-qm", "the demo"]):
        subprocess.run([*git, *command], cwd=project, check=True)
    rlx = [sys.executable, "-m", "rlx"]
    changes = ["-S", "rollout_steps=1", "-S", "wandb.enabled=false", "-S", "evaluator_config.enable_evaluate=false"]
    done = subprocess.run([*rlx, "fit", "params.yaml", *changes], cwd=project, env=child_env(), capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "params.yaml differs from its committed version in 3 field(s): evaluator_config.enable_evaluate True -> "
        "False, rollout_steps 3 -> 1, wandb.enabled True -> False; `rlx reset` puts the committed one back"
    ) in " ".join(done.stdout.split())
    (project / "data/arith/test.parquet").unlink()  # data the committed dvc.lock records
    reset = subprocess.run([*rlx, "reset"], cwd=project, env=child_env(), capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr[-3000:]
    assert "put back as committed: params.yaml, dvc.lock; data checked out" in " ".join(reset.stdout.split())
    assert (project / "params.yaml").read_text() == committed and (project / "data/arith/test.parquet").is_file()
    recorded = ("init_data", "init_model", "convert_gsm8k@train", "convert_gsm8k@test", "convert_math500")
    assert not [stage for stage in dvc_status(project) if stage.rsplit(":", 1)[-1] in recorded]


def test_a_notebook_runs_fit_with_its_cells_executed_once_and_a_rerun_cell_returns_the_run(project, tmp_path):
    """A notebook's kernel is the user's program: its cells run once, and fit() runs to the end; the fit cell
    run again says that it returns the finished run."""
    import os
    from unittest import mock

    import nbformat
    from nbclient import NotebookClient

    setup = f"import os\nos.chdir({str(project)!r})\n"
    program = PROGRAM.format(judging=f", judger_config={POOLED_JUDGERS}").replace("start-{starts}", "notebook")
    cells = [setup, program, "run = trainer.fit()"]  # the last: the fit cell run again
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    before = (project / "ran.txt").read_text().count("ran") if (project / "ran.txt").exists() else 0
    with mock.patch.dict(os.environ, child_env(), clear=True):
        NotebookClient(book, timeout=600, kernel_name="python3").execute()
    printed = "".join(o.get("text", "") for cell in book.cells for o in cell.outputs)
    assert "steps: [1]" in printed, printed[-2000:]
    assert "runs/notebook holds every step of this run (1) already" in " ".join(printed.split()), printed[-2000:]
    assert (project / "ran.txt").read_text().count("ran") == before + 1
