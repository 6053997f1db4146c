"""``python -m rlx.workers.reaper DRIVER_PID MARK``: waits for the driver to end (or for SIGTERM), then
kills every process whose environment carries ``RLX_RAY_INSTANCE=MARK``: what is left of the Ray
instance that driver started (rlx.workers.cluster)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

POLL_SECONDS = 0.5
MARK = "RLX_RAY_INSTANCE"  # the environment variable every process of an instance rlx started carries


def marked(mark: str) -> list[int]:
    """Processes of this user (others' cannot be read, nor killed) whose mark starts with ``mark``: the
    whole mark names one instance, its driver's ``PID-`` every instance that driver started."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if any(line.startswith(needle) for line in (entry / "environ").read_bytes().split(b"\0")):
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours
                continue
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}").is_dir() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


def sweep(mark: str) -> None:
    """Kill the marked processes, again until none is left (a dying raylet may start no new ones, but
    its last workers can appear while it goes)."""
    for _ in range(10):
        pids = marked(mark)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        time.sleep(POLL_SECONDS)


def main(driver: int, mark: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: (sweep(mark), sys.exit(0)))
    while alive(driver):
        time.sleep(POLL_SECONDS)
    sweep(mark)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
