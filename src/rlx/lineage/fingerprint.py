"""A fingerprint of a policy's weights: what a step records instead of the weights themselves.

Each parameter's raw bit patterns, read as integers of the element's width and laid out in rows of
1024, give two numbers: their plain sum, and a sum weighted by position (each element by its column,
1..1024, each row's sum by its row number). Any change to a single element changes the plain sum,
since two distinct bit patterns differ by a nonzero integer; swapping elements moves the weighted
one. It is a checksum against accidents (a non-deterministic kernel, a wrong checkpoint), not a
cryptographic hash. The reductions run where the weights are (on the GPU, no host copy) in float64,
exactly: every partial sum is an integer below 2^53, so no rounding and
no dependence on the order of summation; only the row sums go on in int64 (wrapping).
"""

from __future__ import annotations

import hashlib
import itertools
import json

import torch

ROW = 1024  # elements per row: a row's weighted sum stays below 2^53 (2^31 x 1024 x 1024 / 2)
ROWS_PER_PASS = 1024  # rows converted to float64 at a time: an 8 MiB temporary
_INTEGER_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32}
SHORT_HASH_BYTES = 4  # per parameter in a record: 8 hex digits


def row_sums(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's plain and column-weighted sum, exact, as int64 (the weighted one a matrix-vector
    product: no temporary the size of the rows, and exact in any order of summation)."""
    values = rows.to(torch.float64)
    columns = torch.arange(1, ROW + 1, dtype=torch.float64, device=rows.device)
    return values.sum(dim=1).to(torch.int64), (values @ columns).to(torch.int64)


def row_blocks(bits: torch.Tensor):
    """``(first row number, rows)`` of a flat tensor in rows of ``ROW``, the last one padded with zeros."""
    full = bits.numel() // ROW * ROW
    head = bits[:full].view(-1, ROW)
    for start in range(0, head.shape[0], ROWS_PER_PASS):
        yield start, head[start : start + ROWS_PER_PASS]
    tail = bits[full:]
    if tail.numel():
        yield head.shape[0], torch.cat([tail, tail.new_zeros(ROW - tail.numel())])[None]


@torch.no_grad()
def tensor_sums(tensor: torch.Tensor) -> list[int]:
    """``[plain, weighted]`` sums of the tensor's bit patterns (see the module's docstring); 8-byte
    elements are read as two 4-byte halves, so every sum stays exact."""
    width = min(tensor.element_size(), 4)
    bits = tensor.detach().contiguous().view(-1).view(_INTEGER_OF_WIDTH[width])
    plain = weighted = 0
    for first, rows in row_blocks(bits):
        sums, by_column = row_sums(rows)
        numbers = torch.arange(first + 1, first + 1 + sums.numel(), dtype=torch.int64, device=bits.device)
        plain += int(sums.sum())
        weighted += int(by_column.sum() + (sums * numbers).sum())
    return [plain, weighted]


def fingerprint(module: torch.nn.Module, like: dict | None = None, frozen: dict | None = None) -> dict:
    """The record of the module's parameters (tied ones once), a few bytes per parameter, since every
    step keeps one: ``digest``, a sha256 of the whole table (each name, dtype and both sums);
    ``names``, a short hash of the names in order; ``dtypes``, ``[dtype, how many]`` runs in that order;
    ``tensors``, a 32-bit hash of each parameter's dtype and sums, in that order (8 hex digits each), so
    a mismatch names the first parameter that differs. With ``like`` (a recorded fingerprint) each
    parameter is read in the dtype recorded for it: a bf16 policy loaded in fp32 for generation
    converts back exactly, so it is compared bit for bit with what the trainer held. ``frozen``, a dict
    the caller keeps for the module's life, holds the sums of the parameters that do not train (a LoRA's
    base), read once: no update changes them, and reading them was all but the adapter's share of the
    fingerprint's time. A fingerprint of the same weights loaded afresh reads them all again."""
    recorded = [dtype for dtype, count in like["dtypes"] for _ in range(count)] if like else []
    table = {}
    for index, (name, parameter) in enumerate(module.named_parameters()):
        kept = frozen is not None and not parameter.requires_grad
        if kept and name in frozen:
            table[name] = frozen[name]
            continue
        dtype = getattr(torch, recorded[index] if index < len(recorded) else "", parameter.dtype)
        table[name] = [str(dtype).removeprefix("torch."), *tensor_sums(parameter.to(dtype))]
        if kept:
            frozen[name] = table[name]
    return {
        "digest": hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest(),
        "names": names_hash(list(table)),
        "dtypes": [[dtype, len(list(run))] for dtype, run in itertools.groupby(entry[0] for entry in table.values())],
        "tensors": "".join(short_hash(entry) for entry in table.values()),
    }


def names_hash(names: list[str]) -> str:
    """A fingerprint's ``names``: which parameters, in which order (rlx.lineage.fingerprint.parameter_names)."""
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]


def short_hash(entry: list) -> str:
    """8 hex digits of a parameter's ``[dtype, plain, weighted]``: enough to point at the one that
    differs (the digest is what proves two fingerprints equal)."""
    return hashlib.blake2b(json.dumps(entry).encode(), digest_size=SHORT_HASH_BYTES).hexdigest()


def tensor_hashes(recorded: dict) -> list[str]:
    """A fingerprint's per-parameter hashes, in the module's parameter order."""
    width = 2 * SHORT_HASH_BYTES
    return [recorded["tensors"][start : start + width] for start in range(0, len(recorded["tensors"]), width)]


def first_difference(expected: dict, actual: dict, names: list[str] | None = None) -> str | None:
    """Where two fingerprints part (the first parameter that differs, by name when ``names``, the
    module's parameter names, are given), or None."""
    if expected.get("digest") == actual["digest"]:
        return None
    if set(expected) != set(actual):
        return "the recorded fingerprint is not one this rlx writes (an older rlx's, or edited)"
    if expected["names"] != actual["names"]:
        return "the parameters' names differ from the recorded ones"
    if expected["dtypes"] != actual["dtypes"]:
        return f"the parameters' dtypes differ: {runs(actual['dtypes'])}, recorded {runs(expected['dtypes'])}"
    for index, (want, got) in enumerate(zip(tensor_hashes(expected), tensor_hashes(actual), strict=True)):
        if want != got:
            return f"parameter {names[index] if names else f'number {index}'} differs"
    return "the digest differs"


def parameter_names(module: torch.nn.Module) -> list[str]:
    """The names :func:`first_difference` reports, in the order :func:`fingerprint` reads them."""
    return [name for name, _ in module.named_parameters()]


def runs(dtypes: list) -> str:
    return ", ".join(f"{count} {dtype}" for dtype, count in dtypes)
