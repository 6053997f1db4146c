"""Data-parallel training: how the ranks of a worker group (rlx.workers) agree.

Every rank reads the same judged rollouts and computes the same advantages; the micro-batches of
each mini-batch are dealt out round-robin (``deal``), DeepSpeed averages the gradients, and rank 0
writes the artifacts. In a single process every collective here is the identity. On CPU the ranks
talk over gloo, which is how the tests run two of them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from functools import cache
from pathlib import Path

import torch

from rlx.store.artifacts import atomic_dir

log = logging.getLogger(__name__)

CPU_COMM_OP = "deepspeed_shm_comm"  # the torch extension DeepSpeed builds on first use for its collectives on CPU
STALE_BUILD_SECONDS = 600  # a build of it takes about a minute on two cores


def ensure_rendezvous() -> None:
    """DeepSpeed needs a rendezvous even for one process; without these variables it looks for MPI."""
    if "RANK" in os.environ:
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def clear_stale_build_lock(name: str) -> None:
    """Remove the lock of torch extension ``name``'s build when it is older than any build takes. A process
    killed while it built the extension leaves the lock, and every later build of it, in every process, would
    wait for it forever; torch's lock records no owner to ask."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    lock = Path(root) / name / "lock"
    with suppress(FileNotFoundError):
        age = time.time() - lock.stat().st_mtime
        if age > STALE_BUILD_SECONDS:
            log.warning("removing %s, left %.0f s ago by a build of %s that never finished", lock, age, name)
            lock.unlink()


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def launched() -> bool:
    """Whether this process is one rank of a world of several (a worker sets WORLD_SIZE when it joins)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def deal(items: list, ranks: int, me: int) -> list:
    """This rank's share of ``items``, dealt round-robin; ranks left without one get ``items[0]``
    to run with weight 0, so every rank makes the same number of backward passes (ZeRO-2/3 reduce
    inside each one)."""
    rounds = -(-len(items) // ranks)
    return [items[i] if i < len(items) else items[0] for i in range(me, rounds * ranks, ranks)]


def sum_across(tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over the ranks (in place); the tensor itself in a single process."""
    if world_size() > 1:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def cat_across(tensor: torch.Tensor) -> torch.Tensor:
    """The ranks' 1-D tensors (of any lengths) concatenated in rank order."""
    if world_size() == 1:
        return tensor
    parts = [None] * world_size()
    torch.distributed.all_gather_object(parts, tensor)
    return torch.cat(parts)


def barrier(group=None) -> None:
    if world_size() > 1:
        torch.distributed.barrier(group=group)


@cache
def writers_group():
    """A process group of every rank for the checkpoint writers alone, over gloo (a CPU barrier, whatever the
    training backend): they write in a thread of their own while training runs its collectives on the default
    group, and two threads' collectives on one group would be matched across ranks in any order. Every rank
    makes it at the same point (a trainer's start); None in a single process."""
    return torch.distributed.new_group(backend="gloo") if world_size() > 1 else None


@contextmanager
def atomic_dir_on_all_ranks(path: Path, group=None) -> Iterator[Path]:
    """``artifacts.atomic_dir`` for a folder every rank writes into (e.g. sharded optimizer state):
    rank 0 owns the temporary folder and the final rename, the others write into the same one; the ranks
    agree over ``group`` (the default one unless given)."""
    if world_size() == 1:
        with atomic_dir(path) as tmp:
            yield tmp
        return
    with ExitStack() as stack:
        shared = [stack.enter_context(atomic_dir(path)) if is_main() else None]
        torch.distributed.broadcast_object_list(shared, src=0, group=group)
        yield shared[0]
        barrier(group)  # everyone has written before rank 0 renames
    barrier(group)  # and the rename is done before anyone reads


def buckets(tensors: Iterable[tuple[str, torch.Tensor]], limit: int) -> Iterator[dict[str, torch.Tensor]]:
    """Named tensors in consecutive groups of at most ``limit`` bytes (a bigger tensor goes alone), taken
    from ``tensors`` only as each group is made. A ZeRO-3 parameter counts at its whole size
    (``ds_numel``), which its partitioned tensor no longer shows."""
    bucket, size = {}, 0
    for name, tensor in tensors:
        nbytes = getattr(tensor, "ds_numel", tensor.numel()) * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = {}, 0
        bucket[name], size = tensor, size + nbytes
    if bucket:
        yield bucket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
