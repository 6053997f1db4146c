"""Per-run curves for ``dvc plots show``: one CSV row per step, rebuilt from the steps' metrics files."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable

from rlx.store.artifacts import read_json, write_text
from rlx.store.layout import RunLayout


def write_curve(
    layout: RunLayout,
    name: str,
    stages: Callable[[int], list[str]],
    steps: Iterable[int],
    only_if: str | None = None,
) -> None:
    """Write ``curves/<name>.csv`` from the metrics of ``stages(step)`` for each step (numbers only)."""
    rows = []
    for step in steps:
        paths = [layout.step(step).metrics(stage) for stage in stages(step)]
        if not all(path.is_file() for path in paths):
            continue
        metrics = {key: value for path in paths for key, value in read_json(path).items()}
        if only_if and not metrics.get(only_if):
            continue
        numeric = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not k.startswith("time/")}
        rows.append({"step": step, **numeric})
    target = layout.curves / f"{name}.csv"
    columns = sorted({key for row in rows for key in row} - {"step"})
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=["step", *columns])
    writer.writeheader()
    writer.writerows(rows)
    write_text(text.getvalue(), target)
