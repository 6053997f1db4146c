"""The process that records steps in DVC: it yields the CPU to the run, and it never outlives the run
(a rerun must be the only writer of dvc.lock); what it writes is what DVC's own commands write."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from conftest import PARAMS, child_env
from rlx.lineage.record import dvc_commit, edit_params, point_at_step, recorder, replace_run_pointers, write_lock

# A run that starts the recorder, prints the recorder's pid, then waits to be killed.
RUN = """
import os, sys, time
from rlx.lineage.record import recorder
pool = recorder()
print(pool.submit(os.getpid).result(), flush=True)
time.sleep(60)
"""

# Runs `rlx fit`, then prints the policy torch was loaded under and that torch was loaded at all.
READ_POLICY = """
import os, sys
from rlx.cli import main
sys.argv = ["rlx", "fit", sys.argv[1]]
try:
    main()
finally:
    print(os.environ.get("GOMP_SPINCOUNT"), "torch" in sys.modules, flush=True)
"""


def test_recorder_runs_at_the_lowest_priority_as_a_child_of_the_run():
    with recorder() as pool:
        assert pool.submit(os.nice, 0).result() == 19
        assert pool.submit(os.getppid).result() == os.getpid()


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's prctl")
def test_recorder_dies_with_a_killed_run():
    run = subprocess.Popen([sys.executable, "-c", RUN], env=child_env(), stdout=subprocess.PIPE, text=True)
    worker = int(run.stdout.readline())
    os.kill(worker, 0)  # alive while the run is
    run.kill()
    run.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the recorder {worker} outlived its killed run")


def test_rlx_fit_shortens_openmp_spinning_unless_told_otherwise(tmp_path):
    """`rlx fit` sets the spin count before torch loads; the fit itself fails here (no params file)."""
    env = {k: v for k, v in child_env().items() if k != "GOMP_SPINCOUNT"}
    read = [sys.executable, "-c", READ_POLICY, str(tmp_path / "missing.yaml")]
    assert subprocess.run(read, env=env, capture_output=True, text=True).stdout.startswith("30000 True")
    env["GOMP_SPINCOUNT"] = "1000"
    assert subprocess.run(read, env=env, capture_output=True, text=True).stdout.startswith("1000 True")


def test_pointing_params_at_a_step_changes_its_four_lines_only(tmp_path):
    """The fast edit and the round trip change the same four lines and no other (``lora: null`` stays)."""
    fast, round_trip = tmp_path / "fast.yaml", tmp_path / "round_trip.yaml"
    for path in (fast, round_trip):
        path.write_text(PARAMS.read_text())
    point_at_step(fast, 12, 10, 2)
    edit_params(round_trip, ["run.step=12", "run.prev=11", "run.checkpoint=10", "run.rollout_policy=9"])
    for edited in (fast, round_trip):
        lines = zip(PARAMS.read_text().splitlines(), edited.read_text().splitlines(), strict=True)
        changed = [new for old, new in lines if old != new]
        assert [line.split("#")[0].strip() for line in changed] == [
            "step: 12",
            "prev: 11",
            "checkpoint: 10",
            "rollout_policy: 9",
        ]


@pytest.mark.parametrize(
    "run",
    [
        "run: {step: 3, prev: 2, checkpoint: 0}\n",  # flow style
        "run:\n  step: 3\n  prev: 2\n",  # a pointer missing: the round trip adds it
        "run:\n  step: '3'\n  prev: 2\n  checkpoint: 0\n",  # a quoted number
    ],
)
def test_a_run_section_laid_out_otherwise_is_edited_by_the_round_trip(tmp_path, run):
    params = tmp_path / "params.yaml"
    params.write_text(f"seed: 1\n{run}later: 2\n")
    assert replace_run_pointers(params.read_text(), {"step": 5, "prev": 4, "checkpoint": 0}) is None
    point_at_step(params, 5, 0, 1)
    pointers = {"step": 5, "prev": 4, "checkpoint": 0, "rollout_policy": 3}
    assert yaml.safe_load(params.read_text()) == {"seed": 1, "run": pointers, "later": 2}


STAGE = """
  {name}:
    cmd: "true"
    deps: [in.txt]
    params: [lr, run.step]
    outs:
      - out-{name}-${{run.step}}.txt"""


def test_a_commit_parses_each_text_once_and_writes_the_lock_dvc_commit_writes(tmp_path, monkeypatch):
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _yaml

    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=child_env(), check=True)
    names = ["a", "b", "c"]
    (tmp_path / "dvc.yaml").write_text("stages:" + "".join(STAGE.format(name=name) for name in names) + "\n")
    (tmp_path / "params.yaml").write_text("lr: 1.0e-3  # a comment\nrun:\n  step: 7\n")
    for path in ["in.txt", *(f"out-{n}-7.txt" for n in names)]:
        (tmp_path / path).write_text(path)
    parsed = []
    parse = _yaml.parse_yaml

    def counted(text, path, typ="safe"):
        parsed.append(text)
        return parse(text, path, typ)

    monkeypatch.chdir(tmp_path)  # as `rlx fit` runs: in the project
    monkeypatch.setattr(_yaml, "parse_yaml", counted)
    monkeypatch.setattr(strictyaml, "parse_yaml", counted)
    dvc_commit(tmp_path, names)
    assert len(parsed) == len(set(parsed))  # DVC alone reads params.yaml once per stage
    ours = yaml.safe_load((tmp_path / "dvc.lock").read_text())
    (tmp_path / "dvc.lock").unlink()
    subprocess.run([sys.executable, "-m", "dvc", "commit", "-f", "-q"], cwd=tmp_path, env=child_env(), check=True)
    assert ours == yaml.safe_load((tmp_path / "dvc.lock").read_text())


def test_a_lock_another_writer_changed_is_read_again(tmp_path):
    lock = tmp_path / "dvc.lock"
    write_lock(lock, [])
    lock.write_text("schema: '2.0'\nstages:\n  other:\n    cmd: 'true'\n")  # `dvc repro` in between
    write_lock(lock, [])
    assert yaml.safe_load(lock.read_text()) == {"schema": "2.0", "stages": {"other": {"cmd": "true"}}}


KILLED_IN_DVC = """
import sys
from dvc.cli import main
from rlx.lineage.record import fault_point_inside_dvc_writes
fault_point_inside_dvc_writes("inputs.dvc_write")
main(["repro", "--quiet"])
"""


def test_dvc_lock_info_left_empty_by_a_kill_is_repaired(tmp_path, caplog):
    """DVC rewrites .dvc/tmp/rwlock in place at every stage it runs: killed in between (the fault point
    inside its write), it leaves the file empty and every DVC command after it fails, until rlx repairs it."""
    from rlx.lineage.record import repair_rwlock

    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=child_env(), check=True)
    (tmp_path / "dvc.yaml").write_text("stages:\n  a:\n    cmd: echo a > out.txt\n    outs: [out.txt]\n")
    env = child_env() | {"RLX_FAULT": "inputs.dvc_write"}
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_DVC], cwd=tmp_path, env=env, capture_output=True)
    rwlock = tmp_path / ".dvc" / "tmp" / "rwlock"
    assert killed.returncode == -9 and rwlock.read_bytes() == b""
    dvc = [sys.executable, "-m", "dvc", "repro"]
    broken = subprocess.run(dvc, cwd=tmp_path, env=child_env(), capture_output=True, text=True)
    assert broken.returncode != 0 and "JSON structure is corrupted" in broken.stderr
    repair_rwlock(tmp_path)
    assert "rwlock is unreadable (a process killed while DVC wrote it?); replaced by an empty one" in caplog.text
    subprocess.run(dvc, cwd=tmp_path, env=child_env(), check=True, capture_output=True)
    assert (tmp_path / "out.txt").read_text() == "a\n"
    caplog.clear()
    repair_rwlock(tmp_path)  # a readable one is left as it is
    assert caplog.text == ""
