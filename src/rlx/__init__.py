"""rlx: reproducible RL post-training for language models, as a data-versioned DVC pipeline.

From Python (a notebook): ``run = rlx.train("params.yaml", overrides=["rollout_steps=2"])`` runs or
resumes the run as `rlx fit` does and returns its :class:`rlx.explore.Run`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlx")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


def train(params="params.yaml", overrides=(), work_dir=None):
    """Run (or resume) the run of ``params`` as `rlx fit PARAMS -S ...` does, in this process, and return
    its :class:`rlx.explore.Run`. As with `-S`, the overrides (and ``work_dir``) are written into the
    params file, so DVC records what ran; paths in it are relative to its folder."""
    from pathlib import Path

    from rlx.record import make_room_for_the_recorder

    make_room_for_the_recorder()
    from rich.console import Console

    from rlx.config import load
    from rlx.explore import Run
    from rlx.fit import fit

    params = Path(params).resolve()
    overrides = [*overrides, *([f"work_dir={work_dir}"] if work_dir is not None else [])]
    fit(params, overrides, Console(force_jupyter=False))  # rich's Jupyter display recurses from the progress thread
    return Run(params.parent / load(params).work_dir)  # an absolute work_dir stays as it is
