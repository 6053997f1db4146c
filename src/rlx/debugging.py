"""What ``debug: true`` turns on: rlx's info and debug log lines, with their time and module, and
finer timings in each step's metrics (the stages' CPU seconds, the update's forward and backward apart);
and what the libraries print otherwise (:func:`quiet_libraries`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator

HANDLER = "rlx-debug"  # the name of the handler this module adds, so it is added once and removed again


def quiet_libraries() -> None:
    """Keep the output for rlx's own progress: no per-file bars or chatter from the libraries (in a notebook
    their bars also warn that ipywidgets is missing). Read by the libraries when they load: call it first."""
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("dvc").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto's, on import in a kernel


def configure_logging(debug: bool) -> None:
    """Under ``debug``, rlx's loggers at DEBUG with a handler of their own (time, level, module, message);
    without, as Python leaves them (warnings and errors through logging's last resort), undoing an
    earlier call's handler but nothing a user set up."""
    logger = logging.getLogger("rlx")
    ours = [handler for handler in logger.handlers if handler.get_name() == HANDLER]
    if debug and not ours:
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(HANDLER)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    elif ours and not debug:
        for handler in ours:
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


@contextlib.contextmanager
def debug_logging(debug: bool) -> Iterator[None]:
    """:func:`configure_logging` for the body, as it was after (a notebook's next run starts as it found it)."""
    logger = logging.getLogger("rlx")
    before = any(handler.get_name() == HANDLER for handler in logger.handlers)
    configure_logging(debug)
    try:
        yield
    finally:
        configure_logging(before)


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str, on: bool) -> Iterator[None]:
    """Add the seconds the body takes to ``timings[name]`` when ``on``. On a GPU the clock is read after
    the device has done the work queued before and in the body, so the figure is the work's, not its
    launch's (which costs the overlap of host and device: a debugging aid)."""
    if not on:
        yield
        return
    import torch

    finished = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    finished()
    started = time.perf_counter()
    yield
    finished()
    timings[name] = timings.get(name, 0.0) + time.perf_counter() - started
