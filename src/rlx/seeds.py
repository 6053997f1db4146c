"""Seeds derived from the run's seed: each part of a run (a step's sampling, an epoch's order, a stage)
draws its own numbers, the same on every rerun."""

from __future__ import annotations

SPREAD = 1_000_003  # a large prime: runs with nearby seeds get far-apart seeds for the same part


def derive(seed: int, offset: int) -> int:
    """The seed of one part of a run, ``offset`` naming the part (a step, an epoch, ...), below 2^63:
    any seed the config accepts (64 bits) gives one that torch and LMDeploy take (the same value as
    before for every seed below 9 x 10^12, the demo's included)."""
    return (seed * SPREAD + offset) % 2**63
