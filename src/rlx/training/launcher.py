"""Launching a stage on ``resources.num_workers`` ranks through DeepSpeed's launcher.

With ``resources.num_workers > 1`` the train stage does not train in the calling process: it writes
the resolved config to the step's folder and launches ``num_workers`` copies of :mod:`rlx.run.rank`
through `deepspeed` (one host, or the hosts of ``resources.hostfile``); rank 0 hands its metrics back
in a file. The ranks agree through :mod:`rlx.training.distributed`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlx.config import to_yaml
from rlx.errors import UserError
from rlx.store.artifacts import read_json
from rlx.training.distributed import free_port, without_rendezvous

RANK_MODULE = "rlx.run.rank"  # what each launched process runs


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
    """The `deepspeed` launch of ``python -m rlx.run.rank ARGS`` on ``num_workers`` processes."""
    where = ["--hostfile", str(hostfile)] if hostfile else ["--num_gpus", str(num_workers)]
    deepspeed = Path(sys.executable).with_name("deepspeed")
    return [str(deepspeed), *where, "--master_port", str(port), "--no_local_rank", "--module", RANK_MODULE, *args]


def launch_stage(name: str, config, step: int, folder: Path) -> dict:
    """Run stage ``name`` of ``step`` on ``resources.num_workers`` ranks; return rank 0's metrics."""
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
