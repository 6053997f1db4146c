"""The run from Python (a notebook): ``rlx.train`` does what `rlx fit` does, in this process."""

from __future__ import annotations

from pathlib import Path


def train(params="params.yaml", overrides=(), work_dir=None):
    """Run (or resume) the run of ``params`` as `rlx fit PARAMS -S ...` does, in this process, and return
    its :class:`rlx.explore.Run`. As with `-S`, the overrides (and ``work_dir``) are written into the
    params file, so DVC records what ran; paths in it are relative to its folder."""
    from rlx.lineage.record import make_room_for_the_recorder

    make_room_for_the_recorder()
    from rich.console import Console

    from rlx.config import load
    from rlx.explore import Run
    from rlx.run.fit import fit

    params = Path(params).resolve()
    overrides = [*overrides, *([f"work_dir={work_dir}"] if work_dir is not None else [])]
    fit(params, overrides, Console(force_jupyter=False))  # rich's Jupyter display recurses from the progress thread
    return Run(params.parent / load(params).work_dir)  # an absolute work_dir stays as it is
