"""What a stage wrote, file by file: each file's size and content hash, recorded once and checked later.

The hash is xxHash's XXH3-128: a checksum against accidents (a truncated write, a flipped bit, a file
swapped by hand), not against an attacker, several times faster than sha256 or DVC's md5 (README:
Performance). That speed is what lets a checkpoint
of gigabytes be hashed as it is written and checked whenever it is loaded, and DVC record only the
small list (``checkpoint_outputs.json``) instead of hashing the folders itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import xxhash

HASH = "xxh3_128"


def file_hash(file: Path, digest=xxhash.xxh3_128) -> str:
    """The file's content hash (``digest``: a hashlib name or constructor), read in chunks, so a file of
    any size takes a chunk of memory (xxhash releases the GIL while it hashes each)."""
    with open(file, "rb") as handle:
        return hashlib.file_digest(handle, digest).hexdigest()


def folder_records(files: list[Path], root: Path) -> dict[str, dict]:
    """``{path relative to root: {"size": ..., HASH: ...}}`` for ``files``."""
    return {str(file.relative_to(root)): {"size": file.stat().st_size, HASH: file_hash(file)} for file in files}


def first_changed(root: Path, records: dict[str, dict], hashed: bool = True) -> str | None:
    """The first recorded file under ``root`` that is missing, truncated or (when ``hashed``) not what was
    written, said in a few words; None when all are as recorded."""
    for relative, expected in records.items():
        file = root / relative
        if not file.is_file():
            return f"{file}: missing"
        if file.stat().st_size != expected["size"]:
            return f"{file}: {file.stat().st_size} bytes, {expected['size']} when written (truncated?)"
        if hashed and HASH in expected and file_hash(file) != expected[HASH]:
            return f"{file}: contents differ from what was written (corrupted)"
    return None
