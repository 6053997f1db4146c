"""Data-parallel training: the processes DeepSpeed's launcher starts, and how they agree.

With ``resources.num_workers > 1`` the train stage does not train in the calling process: it writes
the resolved config to the step's folder and launches ``num_workers`` copies of this module through
`deepspeed` (one host, or the hosts of ``resources.hostfile``). Every rank reads the same judged
rollouts and computes the same advantages; the micro-batches of each mini-batch are dealt out
round-robin, DeepSpeed averages the gradients, and rank 0 writes the artifacts. On CPU the ranks
talk over gloo, which is how the tests run two of them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from rlx.artifacts import atomic_dir, read_json, write_json
from rlx.errors import UserError

RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # set by the launcher


def ensure_rendezvous() -> None:
    """DeepSpeed needs a rendezvous even for one process; without these variables it looks for MPI."""
    if "RANK" in os.environ:
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def without_rendezvous(environ: dict) -> dict:
    """``environ`` minus this process's rendezvous, for a child that must start its own."""
    return {name: value for name, value in environ.items() if name not in RENDEZVOUS}


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def launched() -> bool:
    """Whether this process is one rank of a launched world (the launcher sets WORLD_SIZE)."""
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


def barrier() -> None:
    if world_size() > 1:
        torch.distributed.barrier()


@contextmanager
def atomic_dir_on_all_ranks(path: Path) -> Iterator[Path]:
    """``artifacts.atomic_dir`` for a folder every rank writes into (e.g. sharded optimizer state):
    rank 0 owns the temporary folder and the final rename, the others write into the same one."""
    if world_size() == 1:
        with atomic_dir(path) as tmp:
            yield tmp
        return
    with ExitStack() as stack:
        shared = [stack.enter_context(atomic_dir(path)) if is_main() else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        yield shared[0]
        barrier()  # everyone has written before rank 0 renames
    barrier()  # and the rename is done before anyone reads


def hostfile_slots(path: Path) -> int:
    """Processes a DeepSpeed hostfile provides: the sum of its ``host slots=N`` lines."""
    if not path.is_file():
        raise UserError(f"resources.hostfile {path}: no such file")
    total = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        if not fields.get("slots", "").isdigit():
            raise UserError(f"resources.hostfile {path}, line {number}: expected 'HOST slots=N', got {line!r}")
        total += int(fields["slots"])
    return total


def launch_command(num_workers: int, hostfile: Path | None, port: int, args: list[str]) -> list[str]:
    """The `deepspeed` launch of ``python -m rlx.distributed ARGS`` on ``num_workers`` processes."""
    where = ["--hostfile", str(hostfile)] if hostfile else ["--num_gpus", str(num_workers)]
    deepspeed = Path(sys.executable).with_name("deepspeed")
    return [str(deepspeed), *where, "--master_port", str(port), "--no_local_rank", "--module", __name__, *args]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_stage(name: str, config, step: int, folder: Path) -> dict:
    """Run stage ``name`` of ``step`` on ``resources.num_workers`` ranks; return rank 0's metrics."""
    from rlx.config import to_yaml

    config_path, result = folder / f".{name}.launch.yaml", folder / f".{name}.launch.json"
    folder.mkdir(parents=True, exist_ok=True)
    config_path.write_text(to_yaml(config))
    result.unlink(missing_ok=True)
    resources = config.resources
    command = launch_command(
        resources.num_workers, resources.hostfile, free_port(), [name, str(config_path), str(step), str(result)]
    )
    done = subprocess.run(command, env=without_rendezvous(dict(os.environ)), capture_output=True, text=True)
    if done.returncode != 0 or not result.is_file():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise RuntimeError(f"the {name} stage on {resources.num_workers} workers failed:\n{tail}")
    metrics = read_json(result)
    config_path.unlink()
    result.unlink()
    return metrics


def main(argv: list[str]) -> None:
    """One rank: ``python -m rlx.distributed STAGE CONFIG STEP RESULT``."""
    from rlx.config import load
    from rlx.engines import Engines
    from rlx.stages import module

    name, config_path, step, result = argv
    config = load(Path(config_path))
    metrics = module(name).run(config, int(step), Engines(config))
    if is_main():
        write_json(metrics, Path(result))


if __name__ == "__main__":
    main(sys.argv[1:])
