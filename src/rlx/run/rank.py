"""One rank of a launched stage: ``python -m rlx.run.rank STAGE CONFIG STEP RESULT``.

:mod:`rlx.training.launcher` starts one such process per rank. Each runs the stage's own ``run`` (the one
`rlx stage` runs), and rank 0 writes the stage's metrics to ``RESULT`` for the launching process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlx.config import load
from rlx.engines import Engines
from rlx.stages import module
from rlx.stages.train import replay
from rlx.store.artifacts import write_json
from rlx.store.layout import RunLayout
from rlx.training.distributed import is_main


def main(argv: list[str]) -> None:
    name, config_path, step, result = argv
    config = load(Path(config_path))
    metrics = module(name).run(config, int(step), RunLayout(config.work_dir).step(int(step)), Engines(config, replay))
    if is_main():
        write_json(metrics, Path(result))


if __name__ == "__main__":
    main(sys.argv[1:])
