"""Reading and writing artifacts: parquet tables, JSON records and model folders, always atomically.

Every writer goes to a temporary name in the same folder and renames it into place, so a killed
process never leaves a half-written artifact under the real name.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlx import faults
from rlx.errors import UserError


class DiskFullError(UserError):
    """The disk filled up while an artifact was written; the partial copy was removed, nothing under
    the artifact's name changed."""

    def __init__(self, path: Path, note: str = "the partial copy was removed and nothing else changed"):
        self.path = Path(path)
        super().__init__(f"no space left on device while writing {path}; {note}")


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def _cleaned_on_failure(tmp: Path, path: Path) -> Iterator[None]:
    """Remove the temporary ``tmp`` if writing it fails; a full disk becomes a DiskFullError for ``path``."""
    try:
        yield
    except BaseException as exc:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            raise DiskFullError(path) from None
        raise


def _put_in_place(tmp: Path, path: Path) -> Path:
    """The rename that publishes a finished temporary under its real name."""
    faults.point("artifact.rename")
    os.replace(tmp, path)
    return path


def write_rows(rows: list[dict[str, Any]], path: Path, schema: pa.Schema | None = None) -> Path:
    """Write a list of row dicts as parquet (an empty list needs ``schema``). An empty table keeps
    parquet's own schema only: Arrow's copy of it was half of such a file (every step that does not
    evaluate writes one), and there are no values whose Arrow types it would restore."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    tmp = _temporary(path)
    with _cleaned_on_failure(tmp, path):
        pq.write_table(table, tmp, store_schema=bool(rows))
    return _put_in_place(tmp, path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def write_bytes(data: bytes, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    with _cleaned_on_failure(tmp, path):
        tmp.write_bytes(data)
    return _put_in_place(tmp, path)


def write_text(text: str, path: Path) -> Path:
    return write_bytes(text.encode(), path)


def write_json(data: Any, path: Path, indent: int | None = 2) -> Path:
    """Sorted keys, so equal data gives equal bytes; ``indent=None`` for one compact line."""
    separators = None if indent else (",", ":")
    return write_text(json.dumps(data, indent=indent, sort_keys=True, separators=separators) + "\n", path)


def copy_file(source: Path, path: Path) -> Path:
    """Copy ``source`` to ``path`` (contents and times) through a temporary name."""
    path = Path(path)
    tmp = _temporary(path)
    with _cleaned_on_failure(tmp, path):
        shutil.copy2(source, tmp)
    return _put_in_place(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``path`` whole, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with _cleaned_on_failure(tmp, path):
        yield tmp
    faults.point("artifact.rename")
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def remove_temporaries(folder: Path) -> None:
    """Delete what killed writers left under their temporary names in ``folder`` and its subfolders (one
    level: a writer's temporary sits beside its target). Only for a folder no other process writes to."""
    folder = Path(folder)
    for leftover in [*folder.glob(".*.tmp-*"), *folder.glob("*/.*.tmp-*")]:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
