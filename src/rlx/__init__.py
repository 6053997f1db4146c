"""rlx: reproducible RL post-training for language models, as a data-versioned DVC pipeline.

From Python (a notebook): ``run = rlx.train("params.yaml", overrides=["rollout_steps=2"])`` runs or
resumes the run as `rlx fit` does and returns its :class:`rlx.explore.Run`.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlx")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


def __getattr__(name: str):
    """``rlx.train``, imported on first use (by name: the pipeline's stages, whose code dependencies
    are their import closure, never run it, and ``import rlx`` stays light)."""
    if name == "train":
        return importlib.import_module("rlx.api").train
    raise AttributeError(f"module 'rlx' has no attribute {name!r}")
