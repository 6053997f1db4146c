"""One `rlx fit` per repository and per work_dir: two runs writing the same files would corrupt each
other silently. Runs in one repository share params.yaml (each run writes its step pointer there),
dvc.lock and DVC's index, so a second run there is refused even with another work_dir.

Each lock is an OS lock (``flock``) on a file (``.dvc/tmp/rlx-fit.lock`` for the repository,
``<work_dir>/fit.lock`` for the run), which the kernel releases when its process ends, however it
ends: a lock left by a killed run is never in the way. The holder writes who it is into the file,
for the message a second run prints, and erases it on a clean exit; a new holder that finds a
holder's record there knows that run was killed, and says so.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlx.errors import UserError

log = logging.getLogger(__name__)


def describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (
        f"{holder.get('command', 'rlx fit')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"started {started})"
    )


def read_holder(handle) -> dict | None:
    handle.seek(0)
    try:
        return json.loads(handle.read() or "null")
    except ValueError:
        return None


def hold_repository(root: Path):
    """Hold the DVC repository at ``root`` (its params.yaml, dvc.lock and index) for this process."""
    folder = Path(root) / ".dvc" / "tmp" if (Path(root) / ".dvc").is_dir() else Path(root)
    return hold(
        folder / "rlx-fit.lock",
        f"the repository {Path(root).resolve()}",
        "its params.yaml, dvc.lock and DVC index are shared by its runs: wait for it to finish, or run the "
        "second experiment in a git worktree or clone of its own (docs/reliability.md: several experiments)",
    )


def hold_work_dir(work_dir: Path):
    """Hold ``work_dir`` for this process (created if missing)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return hold(Path(work_dir) / "fit.lock", f"work_dir {work_dir}", "wait for it to finish or stop it")


@contextmanager
def hold(path: Path, what: str, advice: str) -> Iterator[None]:
    """Hold the lock file ``path`` for this process, or raise a UserError naming ``what`` is busy, the
    process that holds it, and ``advice``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(handle) or {}
            raise UserError(f"{what} is in use by {describe(holder)}; {advice}") from None
        previous = read_holder(handle)
        if previous:
            log.warning("%s: taking over from %s, which was killed", what, describe(previous))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": command_line()}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(me))
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def command_line() -> str:
    """This process's command, ``python -m rlx ...`` shown as ``rlx ...``."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    return " ".join(["rlx" if program == "__main__.py" else program, *sys.argv[1:]])
