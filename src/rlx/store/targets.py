"""Where a command may write what its user named: one guard for every output path given on the command
line or in params.yaml (`rlx materialize --out`, `rlx eval --output`, `rlx convert`, `rlx config schema
-o`, `rlx init-data`, `rlx init-model`).

A named output is replaced whole (written beside it, then renamed into place), so a wrong path would
destroy what is there. The guard refuses, before anything is written: a path that holds the repository
or the current folder, a path in or around an rlx run, the command's own inputs, a file where a folder
is written or a folder where a file is, and anything already there that the same command did not
write. What rlx wrote carries a mark saying which command wrote it: a folder a ``.rlx.json`` file, a
parquet file a key of its footer's metadata, a JSON file a ``$comment`` key (a metrics file's in a list).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from rlx.errors import UserError

MARK = "rlx.made_by"  # the parquet footer's key
FOLDER_MARK = ".rlx.json"  # a folder's mark, which may hold more (rlx.explore: the files it wrote)


def repository_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``.dvc`` or ``.git``."""
    for folder in [start, *start.parents]:
        if (folder / ".dvc").is_dir() or (folder / ".git").exists():
            return folder
    return None


def enclosing_run(path: Path) -> Path | None:
    """The rlx run (a folder with a ``step-0`` folder) that ``path`` is or lies in, if any."""
    for folder in [path, *path.parents]:
        if (folder / "step-0").is_dir():
            return folder
    return None


def made_by(path: Path) -> str | None:
    """Which rlx command wrote ``path`` (its mark), or None: not rlx's, or unreadable."""
    try:
        if path.is_dir():
            return json.loads((path / FOLDER_MARK).read_text()).get("made_by")
        if path.suffix == ".parquet":
            metadata = pq.read_schema(path).metadata or {}
            return metadata.get(MARK.encode(), b"").decode() or None
        if path.suffix == ".json":
            text = json.loads(path.read_text())
            comment = text.get("$comment", "") if isinstance(text, dict) else ""
            comment = comment[0] if isinstance(comment, list) and comment else comment  # a metrics file's mark
            return comment.removeprefix("made by ") if isinstance(comment, str) else None
    except (OSError, ValueError, AttributeError):
        return None
    return None


def guard(target: Path, label: str, command: str, *, folder: bool, inputs=()) -> Path:
    """Refuse ``target`` (named by option or argument ``label``) as the output of ``command`` (e.g.
    ``rlx materialize``), which writes a folder (``folder``) or a file there, replacing it whole; returns
    it. ``inputs`` are the paths the command reads."""
    resolved = Path(target).resolve()
    protected = {Path.cwd().resolve(): "the current folder"}
    if (root := repository_root(Path.cwd().resolve())) is not None:
        protected[root] = f"the repository {root} (with its .git and DVC cache)"
    for place, what in protected.items():
        if place.is_relative_to(resolved):
            raise UserError(
                f"{label} {target}: holds {what}, which rlx would replace; give a new path, e.g. models/NAME"
            )
    for source in (Path(path).resolve() for path in inputs):
        relation = "is" if source == resolved else "holds" if source.is_relative_to(resolved) else "lies in"
        if source.is_relative_to(resolved) or resolved.is_relative_to(source):
            raise UserError(f"{label} {target}: {relation} {source}, an input of {command}; give another path")
    if (run := enclosing_run(resolved)) is not None:
        raise UserError(
            f"{label} {target}: lies in the rlx run {run}, whose files rlx keeps on record; give a path outside it"
        )
    check_kind(target, label, folder)
    if resolved.exists() and made_by(resolved) != command:
        raise UserError(
            f"{label} {target}: already exists and {command} did not write it (it replaces only what it wrote "
            "itself); remove it or give a new path"
        )
    return Path(target)


def check_kind(target: Path, label: str, folder: bool) -> None:
    if folder and Path(target).is_file():
        raise UserError(f"{label} {target}: is a file; give the path of a folder")
    if not folder and Path(target).is_dir():
        raise UserError(f"{label} {target}: is a folder; give the path of a file, e.g. {Path(target) / 'out'}")


def folder_mark(made_by: str, **more) -> str:
    """The text of a folder's ``.rlx.json``: which command wrote it, and what else it keeps."""
    return json.dumps({"made_by": made_by, **more}, sort_keys=True, indent=1) + "\n"


def json_mark(command: str) -> dict:
    """The key a JSON file written by ``command`` carries (JSON Schema reserves ``$comment`` for notes)."""
    return {"$comment": f"made by {command}"}


def metrics_mark(command: str) -> dict:
    """:func:`json_mark` for a metrics file: its note in a list, which `dvc metrics show` and `dvc exp show`
    leave out (they show numbers and text), so no column of text sits among the metrics."""
    return {"$comment": [f"made by {command}"]}


def parquet_mark(command: str) -> dict[bytes, bytes]:
    """The footer metadata a parquet file written by ``command`` carries."""
    return {MARK.encode(): command.encode()}
