"""The process that records steps in DVC: it yields the CPU to the run, and it never outlives the run
(a rerun must be the only writer of dvc.lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import child_env
from rlx.record import recorder

# A run that starts the recorder, prints the recorder's pid, then waits to be killed.
RUN = """
import os, sys, time
from rlx.record import recorder
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
