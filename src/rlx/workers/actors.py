"""A set of Ray actors in one placement group, called all at once: what the worker group and the judge
actors share. A call fails fast, naming the actor, its node and its pid, when one of them fails or dies.
Each actor is named (``worker 1``, ``judge 0``), and Ray puts the name before every line it writes to
the console; unless ``display_all_workers_log``, only train worker 0 writes there, the others to a file
of their own under ``<log_dir>/workers/``."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from rlx.config import RLTrainerConfig
from rlx.debugging import configure_logging
from rlx.errors import UserError

PLACEMENT_SECONDS = 120  # how long Ray may take to find room for the bundles before rlx gives up
BACKGROUND = "background"  # the actors' concurrency group for a call that waits on their own threads


def as_arrays(weights: dict[str, torch.Tensor]) -> dict[str, tuple[object, str]]:
    """A policy's weights as numpy arrays (and their torch dtypes) for Ray's object store, which keeps an
    array's bytes as they are, where it pickles a tensor through torch.save (0.065 s against 0.2 s to put
    the weights of a 25 M model there). bfloat16, which numpy lacks, travels as its 16 bits."""
    return {
        name: ((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).detach().cpu().numpy(), str(t.dtype))
        for name, t in weights.items()
    }


def as_tensors(arrays: dict[str, tuple[object, str]]) -> dict[str, torch.Tensor]:
    """The tensors of :func:`as_arrays`, over the object store's read-only memory (to be copied from)."""
    with warnings.catch_warnings():  # read-only arrays: the tensors are only read, by load_state_dict
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {
            name: torch.from_numpy(a).view(torch.bfloat16) if dtype == "torch.bfloat16" else torch.from_numpy(a)
            for name, (a, dtype) in arrays.items()
        }


def keep_output_in(file: Path) -> None:
    """This process's output (its prints, log lines, libraries' messages, a crash's traceback) to ``file``
    instead of to the console, where Ray would stream it: the process's stdout and stderr are replaced."""
    file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (1, 2):
        os.dup2(descriptor, stream)
    os.close(descriptor)


class Actor:
    """What every rlx actor answers besides its own methods. It works in the ``project`` folder, as the
    driver does (the run's paths are relative to it). ``label`` names it in the console (Ray reads
    ``repr``); its lines go there if ``shown`` or ``display_all_workers_log``, else to a file in log_dir."""

    def __init__(self, label: str, shown: bool, config: RLTrainerConfig, project: str):
        os.chdir(project)
        self.label = label
        configure_logging(config.debug)
        if not (shown or config.display_all_workers_log):
            keep_output_in(config.log_folder / "workers" / f"{label.replace(' ', '-')}.log")

    def __repr__(self) -> str:
        return self.label

    def timed(self, method: str, *args) -> tuple[object, float]:
        """``method(*args)`` and the seconds it took here: the driver tells the actors' time from its own."""
        started = time.perf_counter()
        result = getattr(self, method)(*args)
        return result, time.perf_counter() - started

    def where(self) -> dict:
        """Where this actor runs, for messages and the rendezvous."""
        import ray

        node = {"node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id()}
        return node | {"host": socket.gethostname(), "pid": os.getpid()}


class ActorGroup:
    """``count`` actors of ``kind`` (an :class:`Actor`), each in its own bundle ``reserved`` of one placement
    group placed by ``strategy``; actor ``r`` is made with ``arguments(r)`` after its label (``name r``) and
    whether its lines are shown (``shows_first``: actor 0's always are). ``name`` names them in messages
    and in the step's counters (``time/<name>s``: the slowest actor of each call; ``perf/driver_<name>_bytes``)."""

    shows_first = False

    def __init__(self, ray, kind: type, name: str, reserved: dict, count: int, strategy: str, arguments: Callable):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.name = ray, name
        self.placement = placement_group([reserved] * count, strategy=strategy)
        if not ray.wait([self.placement.ready()], timeout=PLACEMENT_SECONDS)[0]:
            ray.util.remove_placement_group(self.placement)
            raise UserError(
                f"resources: Ray found no room for {count} {name}s of {reserved} each, placed {strategy}, "
                f"in {PLACEMENT_SECONDS} s on {len(ray.nodes())} node(s)"
            )
        options = {"num_cpus": reserved["CPU"], "num_gpus": reserved.get("GPU", 0), "max_restarts": 0}
        options |= {"memory": reserved["memory"]} if "memory" in reserved else {}
        remote = ray.remote(concurrency_groups={BACKGROUND: 1})(kind)
        self.actors = [
            remote.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank),
                **options,
            ).remote(f"{name} {rank}", self.shows_first and rank == 0, *arguments(rank))
            for rank in range(count)
        ]
        self.counters = self.zeroed()
        self.places = [{"node": "not yet known", "pid": "not yet known"}] * count  # until they answer
        self.places = self.call("where", what="start-up")

    def zeroed(self) -> dict[str, float]:
        return {f"time/{self.name}s": 0.0, f"perf/driver_{self.name}_bytes": 0.0}

    def described(self, rank: int) -> str:
        place = self.places[rank]
        return f"{self.name} {rank} (node {place['node']}, pid {place['pid']})"

    def call_each(
        self, method: str, arguments: list[tuple], what: str, background: bool = False, timeout: float | None = None
    ) -> list:
        """``method`` on every actor, actor ``r`` given ``arguments[r]``; their results in rank order.
        The first failure ends the wait (the others may be blocked in a collective with the failed one), as
        does ``timeout`` seconds without every answer (a hung call is named, not waited for forever).
        A ``background`` call runs in the actors' :data:`BACKGROUND` group, beside their other calls, and
        is not counted in the step's actor time, which it overlaps."""
        group = {"concurrency_group": BACKGROUND} if background else {}
        calls = zip(self.actors, arguments, strict=True)
        pending = [actor.timed.options(**group).remote(method, *args) for actor, args in calls]
        ranks = {ref: rank for rank, ref in enumerate(pending)}
        timed, deadline = {}, None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                late = ", ".join(self.described(ranks[ref]) for ref in pending)
                raise UserError(f"{what}: {late} did not answer within {timeout} s; rerun `rlx fit` to resume")
            timed[ranks[ready[0]]] = self.checked_result(ready[0], ranks[ready[0]], what)
        results = [timed[rank][0] for rank in range(len(self.actors))]
        if not background:
            self.counters[f"time/{self.name}s"] += max(seconds for _, seconds in timed.values())
            self.counters[f"perf/driver_{self.name}_bytes"] += len(pickle.dumps((arguments, results)))
        return results

    def checked_result(self, ref, rank: int, what: str):
        """An actor's result, its own UserError passed on as is, its death said in one line."""
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except exceptions.RayTaskError as failed:
            if isinstance(failed.cause, UserError):
                raise failed.cause from None
            raise
        except exceptions.RayActorError:
            raise UserError(
                f"{self.described(rank)} died during {what}; rerun `rlx fit` to resume from the last complete step"
            ) from None

    def call(self, method: str, *args, what: str, background: bool = False, timeout: float | None = None) -> list:
        return self.call_each(method, [args] * len(self.actors), what, background, timeout)

    def take_counters(self) -> dict[str, float]:
        """Since the last call: the seconds of the slowest actor of each call, and the bytes of the calls'
        arguments and results (what crosses between the driver and the actors)."""
        counters, self.counters = self.counters, self.zeroed()
        return counters

    def stop(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.ray.util.remove_placement_group(self.placement)
