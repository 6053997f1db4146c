"""One `rlx fit` per work_dir: two runs writing the same steps would corrupt each other silently.

The lock is an OS lock (``flock``) on ``<work_dir>/fit.lock``, which the kernel releases when its
process ends, however it ends: a lock left by a killed run is never in the way. The holder writes
who it is into the file, for the message a second run prints, and erases it on a clean exit; a
new holder that finds a holder's record there knows that run was killed, and says so.
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


@contextmanager
def hold(work_dir: Path) -> Iterator[None]:
    """Hold ``work_dir`` for this process, or raise a UserError naming the process that holds it."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "fit.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(handle) or {}
            raise UserError(
                f"work_dir {work_dir} is in use by {describe(holder)}; wait for it to finish or stop it"
            ) from None
        previous = read_holder(handle)
        if previous:
            log.warning("work_dir %s: taking over from %s, which was killed", work_dir, describe(previous))
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
