"""rlx: reproducible RL post-training for language models, as a data-versioned DVC pipeline.

From Python (a notebook), as XTuner v1's class: ``run = rlx.RLTrainer(rollout_steps=2, ...).fit()`` runs or
resumes the run as `rlx fit` does and returns its :class:`rlx.explore.Run`; ``rlx.train("params.yaml",
overrides=["rollout_steps=2"])`` does the same with `-S` overrides.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlx")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


def __getattr__(name: str):
    """``rlx.RLTrainer`` and ``rlx.train``, imported on first use (by name: the pipeline's stages, whose code
    dependencies are their import closure, never run them, and ``import rlx`` stays light)."""
    if name in ("RLTrainer", "train"):
        return getattr(importlib.import_module("rlx.api"), name)
    raise AttributeError(f"module 'rlx' has no attribute {name!r}")
