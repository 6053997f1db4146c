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

from rlx.errors import UserError
from rlx.store import faults
from rlx.store.targets import parquet_mark


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


def write_rows(
    rows: list[dict[str, Any]], path: Path, schema: pa.Schema | None = None, made_by: str | None = None
) -> Path:
    """Write a list of row dicts as parquet (an empty list needs ``schema``); ``made_by``: the command
    that wrote it, kept in the footer (rlx.store.targets). An empty table keeps parquet's own schema only:
    Arrow's copy of it was half of such a file (every step that does not evaluate writes one), and there
    are no values whose Arrow types it would restore."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    if made_by is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **parquet_mark(made_by)})
    tmp = _temporary(path)
    with _cleaned_on_failure(tmp, path):
        pq.write_table(table, tmp, store_schema=bool(rows) or made_by is not None)
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


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it takes the place of ``path`` (a folder there is moved aside
    first and removed only once the new one is in place), on failure it is removed. Only for a ``path``
    rlx writes itself: a path the user named passes rlx.store.targets.guard first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with _cleaned_on_failure(tmp, path):
        yield tmp
    faults.point("artifact.rename")
    aside = tmp.with_name(f"{tmp.name}-old")
    if path.exists():
        os.replace(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside, ignore_errors=True)


def remove_temporaries(folder: Path) -> None:
    """Delete what killed writers left under their temporary names in ``folder`` and its subfolders (one
    level: a writer's temporary sits beside its target); a temporary of a process still alive is its
    writer's, and stays."""
    folder = Path(folder)
    for leftover in [*folder.glob(".*.tmp-*"), *folder.glob("*/.*.tmp-*")]:
        if writer_is_alive(leftover):
            continue
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def writer_is_alive(temporary: Path) -> bool:
    """Whether the process whose pid a temporary's name ends with (``.NAME.tmp-PID``) still runs."""
    pid = temporary.name.rpartition(".tmp-")[2].removesuffix("-old")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
