"""The Ray instance a run's workers live in: joined when ``resources.ray_address`` names one, else
started on this machine for the run and stopped after it, also when the driver is killed.

Ray's own clean-up covers a driver that exits; a driver killed with SIGKILL leaves some of the
processes of the instance it started (seen with Ray 2.58: the dashboard and runtime-env agents stay,
re-parented to init). So before starting Ray the driver marks its environment, which every process of
the instance inherits, and starts a reaper (rlx.workers.reaper) in a session of its own that kills
the marked processes once the driver is gone. An instance given by address is never stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlx.config import RLTrainerConfig
from rlx.errors import UserError, first_line
from rlx.workers.reaper import MARK

log = logging.getLogger(__name__)

INSTALL = "pip install 'ray==2.58.0'"  # the release rlx's worker group is written and tested against
RAY_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"  # where `ray start` leaves its address, which "auto" reads
CONNECT_SECONDS = 10  # how long a ray_address's GCS port may take to accept a connection


def import_ray():
    """Ray, or one line saying how to install it (the one-worker path never asks)."""
    try:
        import ray
    except ImportError:
        raise UserError(f"resources: workers on Ray, and Ray is not installed here: {INSTALL}") from None
    return ray


def reservation(cpus: float, memory: int, gpus: float = 0) -> dict[str, float]:
    """One actor's bundle in Ray's resource names (memory in bytes); what it does not reserve left out."""
    return {name: amount for name, amount in {"CPU": cpus, "GPU": gpus, "memory": memory}.items() if amount}


def worker_bundle(config: RLTrainerConfig) -> dict[str, float]:
    resources = config.resources
    gpus = resources.num_accelerators_per_worker if resources.accelerator == "GPU" else 0
    return reservation(resources.num_cpus_per_worker, resources.cpu_memory_per_worker, gpus)


def judge_bundle(config: RLTrainerConfig) -> dict[str, float]:
    judges = config.cpu_resources
    return reservation(judges.num_cpus_per_worker, judges.cpu_memory_per_worker)


def wanted(config: RLTrainerConfig) -> dict[str, float]:
    """What the workers, rollout workers and judge actors reserve in all: their bundles times their numbers."""
    resources = config.resources
    workers = (resources.num_workers if resources.on_ray else 0) + resources.num_rollout_workers
    groups = [(worker_bundle(config), workers)] if workers else []
    if config.cpu_resources:
        groups.append((judge_bundle(config), config.cpu_resources.num_workers))
    total: dict[str, float] = {}
    for bundle, count in groups:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0) + amount * count
    return total


def shortfall(asked: dict[str, float], present: dict[str, float]) -> str | None:
    """What the cluster lacks of ``asked``, in words and with the field to change, or None."""
    fields = {"CPU": "num_cpus_per_worker", "GPU": "num_accelerators_per_worker", "memory": "cpu_memory_per_worker"}
    missing = [
        f"{asked[name]:g} {name} (resources.{fields[name]} x num_workers) but the cluster has {present.get(name, 0):g}"
        for name in asked
        if asked[name] > present.get(name, 0) + 1e-9
    ]
    return "; ".join(missing) or None


@contextlib.contextmanager
def ray_instance(config: RLTrainerConfig) -> Iterator[object]:
    """Ray, connected for the body: to ``resources.ray_address``, or to an instance started here (with
    what this machine has, no dashboard) and stopped after. Refuses, before any worker starts, a
    request for more CPUs, GPUs or memory than the cluster has."""
    ray = import_ray()
    address = config.resources.ray_address
    if address and (problem := unanswered(address)):
        raise UserError(
            f"resources.ray_address {address!r}: no Ray cluster answers there ({problem}); start one with "
            "`ray start --head` (docs/gpus.md: Several GPUs and nodes), or set it to null to start one for the run"
        )
    reaper = None if address else start_reaper()
    try:
        # "local": a new instance even where `ray start` left one running (plain None would join it)
        try:
            ray.init(address=address or "local", include_dashboard=False, configure_logging=False)
        except ConnectionError as exc:
            raise UserError(f"resources.ray_address {address!r}: {first_line(exc)}") from None
        os.environ.pop(MARK, None)  # the instance's processes carry it; the driver's later children need not
        if problem := shortfall(wanted(config), ray.cluster_resources()):
            judges = ", with cpu_resources' judge actors" if config.cpu_resources else ""
            raise UserError(f"resources: the workers{judges} ask for {problem}")
        yield ray
    finally:
        ray.shutdown()
        if reaper is not None:
            reaper.terminate()  # it sweeps what is left of the instance, then exits


def unanswered(address: str) -> str | None:
    """Why no Ray cluster answers at ``address`` (``HOST:PORT``, its GCS port; ``auto``: the address the last
    `ray start` on this machine left), or None: ray.init waits many minutes for an address that is gone.
    What rlx cannot resolve (a ``ray://`` client address, ``auto`` with no address left) is left to Ray."""
    if address == "auto":
        left = Path(RAY_CURRENT_CLUSTER)
        address = os.environ.get("RAY_ADDRESS") or (left.read_text().strip() if left.is_file() else "")
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def start_reaper() -> subprocess.Popen:
    """Mark this process's environment for the Ray instance it is about to start, and start the reaper
    that kills the marked processes when this one is gone (or when told to, at the end of the run)."""
    os.environ[MARK] = f"{os.getpid()}-{uuid.uuid4().hex}"
    return subprocess.Popen(
        [sys.executable, "-m", "rlx.workers.reaper", str(os.getpid()), os.environ[MARK]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the driver's process group: a kill of the group leaves it to clean up
    )
