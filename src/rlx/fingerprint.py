"""A fingerprint of a policy's weights: what a step records instead of the weights themselves.

Each parameter contributes two integer sums over its raw bit patterns (read as integers of the
element's width): the plain sum and a sum weighted by position (1..2^20, repeating). Any change to
a single element changes the plain sum, since the difference of two distinct bit patterns is a
nonzero integer; reorderings and most multi-element changes move the weighted one. It is a checksum
against accidents (a non-deterministic kernel, a wrong checkpoint), not a cryptographic hash. Both
sums are reductions on the device that holds the weights, so a GPU fingerprints 8 B parameters in
milliseconds and nothing is copied to the host but two numbers per tensor.
"""

from __future__ import annotations

import hashlib
import json

import torch

CHUNK = 1 << 20  # elements per reduction: bounds the int64 temporary to 8 MiB
_INTEGER_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_weights: dict[torch.device, torch.Tensor] = {}


def position_weights(device: torch.device) -> torch.Tensor:
    if device not in _weights:
        _weights[device] = torch.arange(1, CHUNK + 1, dtype=torch.int64, device=device)
    return _weights[device]


@torch.no_grad()
def tensor_sums(tensor: torch.Tensor) -> list[int]:
    """``[plain, weighted]`` sums of the tensor's bit patterns (int64 arithmetic, wrapping)."""
    bits = tensor.detach().contiguous().view(-1).view(_INTEGER_OF_WIDTH[tensor.element_size()])
    weights = position_weights(bits.device)
    sums = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), CHUNK):
        part = bits[start : start + CHUNK].long()
        sums[0] += part.sum()
        sums[1] += (part * weights[: part.numel()]).sum()
    return sums.tolist()


def fingerprint(module: torch.nn.Module, like: dict | None = None) -> dict:
    """``{"digest": ..., "tensors": {name: [dtype, plain, weighted]}}`` over the module's parameters
    (tied ones once). The digest is a sha256 of the table, to compare in one look. With ``like`` (a
    recorded fingerprint) each parameter is read in the dtype recorded for it: a bf16 policy loaded in
    fp32 for generation converts back exactly, so it is compared bit for bit with what the trainer held."""
    recorded = {name: entry[0] for name, entry in like["tensors"].items()} if like else {}
    tensors = {}
    for name, parameter in module.named_parameters():
        dtype = getattr(torch, recorded.get(name, ""), parameter.dtype)
        tensors[name] = [str(dtype).removeprefix("torch."), *tensor_sums(parameter.to(dtype))]
    digest = hashlib.sha256(json.dumps(tensors, sort_keys=True).encode()).hexdigest()
    return {"digest": digest, "tensors": tensors}


def first_difference(expected: dict, actual: dict) -> str | None:
    """Where two fingerprints part (the first parameter in name order that differs), or None."""
    if expected["digest"] == actual["digest"]:
        return None
    names = sorted(set(expected["tensors"]) | set(actual["tensors"]))
    for name in names:
        want, got = expected["tensors"].get(name), actual["tensors"].get(name)
        if want != got:
            if want is None or got is None:
                return f"parameter {name} is {'new' if want is None else 'missing'}"
            return f"parameter {name} differs" + (f" (dtype {got[0]}, recorded {want[0]})" if want[0] != got[0] else "")
    return "the digest differs"
