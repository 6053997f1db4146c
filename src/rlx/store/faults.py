"""Named fault points, a testing aid for crash safety: the process kills itself where a test asks.

``RLX_FAULT=train.optimizer_step`` makes the first ``point("train.optimizer_step")`` this process
reaches send SIGKILL to the process itself; ``RLX_FAULT=train.optimizer_step@3`` waits for the third
time it is reached. SIGKILL cannot be caught, so nothing gets to clean up: the work_dir is left as
a power cut or an OOM kill would leave it, and the rerun must still end bitwise where an
uninterrupted run ends (tests/test_resume.py). Without ``RLX_FAULT`` a point is a single comparison.
"""

from __future__ import annotations

import os
import signal

from rlx.store.layout import STAGES

POINTS = (
    *(f"{stage}.start" for stage in STAGES),  # before the stage does anything
    *(f"{stage}.metrics" for stage in STAGES),  # outputs written, metrics (the completion mark) not yet
    "train.optimizer_step",  # gradients accumulated, the optimizer step not yet taken
    "train.save",  # a checkpoint's policy saved, its optimizer state not yet
    "agent.tool_results",  # an agent turn's tool results appended (rollout or evaluation), its artifact not yet written
    "replay.step",  # a recorded update re-applied, its fingerprint not yet checked
    "policy.write",  # a policy folder (HF export, materialized step) written, not yet renamed into place
    "artifact.rename",  # any artifact written under its temporary name, not yet renamed into place
    "dvc.commit",  # the stages saved by DVC, dvc.lock not yet written
    # DVC writes its lock info (.dvc/tmp/rwlock) and dvc.lock in place: the file is emptied when opened,
    # then written. A kill in between leaves it empty (put there by
    # rlx.lineage.record.fault_point_inside_dvc_writes).
    "inputs.dvc_write",  # in `rlx fit`'s `dvc repro` of the run's inputs
    "record.dvc_write",  # in the process recording a step
    "step.commit",  # dvc.lock (and the step's copy) written, done.json not yet
    "step.prune",  # done.json written, old checkpoints not yet pruned
)


def parse(spec: str | None) -> tuple[str, int] | None:
    """``name`` or ``name@N`` as (name, N); None when unset. An unknown name is an error, not a no-op."""
    if not spec:
        return None
    name, _, count = spec.partition("@")
    if name not in POINTS or (count and not (count.isdigit() and int(count) >= 1)):
        raise ValueError(f"RLX_FAULT={spec!r}: expected NAME or NAME@N (N >= 1) with NAME one of {', '.join(POINTS)}")
    return name, int(count or 1)


_target = parse(os.environ.get("RLX_FAULT"))
_reached = 0
_also_kill: list[int] = []


def armed(name: str) -> bool:
    """Whether ``RLX_FAULT`` names the point ``name`` (for points that need setting up to be reached)."""
    return _target is not None and _target[0] == name


def kill_with(pid: int) -> None:
    """A helper process of the run: a point reached here kills the run (``pid``) as well."""
    _also_kill.append(pid)


def point(name: str) -> None:
    """Kill this process here if ``RLX_FAULT`` names this point (and this is the occurrence it counts)."""
    global _reached
    if _target is None or _target[0] != name:
        return
    _reached += 1
    if _reached == _target[1]:
        for pid in (*_also_kill, os.getpid()):
            os.kill(pid, signal.SIGKILL)
