"""The processes rlx starts for itself (the DVC recorder, the judgers' pool): fresh interpreters that never
run the user's program.

Python's ``spawn`` start method imports the parent's ``__main__`` again in every child, so a script without
an ``if __name__ == "__main__":`` guard runs its top level (its ``fit()`` included) a second time there, and a
program read from stdin cannot be found at all. rlx's helpers need nothing from the user's program (they run
rlx's own functions), so their processes start without it: the child gets the parent's working directory and
``sys.path``, as spawn gives, but not its ``__main__``.
"""

from __future__ import annotations

import threading
from multiprocessing import context, popen_spawn_posix, spawn

_MAIN_ENTRIES = ("init_main_from_path", "init_main_from_name")  # what tells a spawned child to import __main__
_starting = threading.local()


def _preparation_data(name: str, _spawns=spawn.get_preparation_data) -> dict:
    """What a spawned child is told to set up: without ``__main__`` while this thread starts a helper."""
    data = _spawns(name)
    if getattr(_starting, "helper", False):
        for entry in _MAIN_ENTRIES:
            data.pop(entry, None)
    return data


class HelperProcess(context.SpawnProcess):
    """A spawned process that does not import the parent's ``__main__``. Pools restart their processes from
    threads of their own, so the choice is made wherever one is started, not around the pool's creation."""

    @staticmethod
    def _Popen(process_obj):
        spawn.get_preparation_data = _preparation_data  # once: a plain spawn elsewhere is left as it was
        _starting.helper = True
        try:
            return popen_spawn_posix.Popen(process_obj)
        finally:
            _starting.helper = False


class HelperContext(context.SpawnContext):
    """``multiprocessing.get_context("spawn")`` for rlx's helpers: its Process is :class:`HelperProcess`."""

    Process = HelperProcess


def helper_context() -> HelperContext:
    return HelperContext()
