"""The run's workers: ``resources.num_workers`` actors (rlx.workers.worker) in one Ray placement group,
started once by `rlx fit` (or a cold `rlx stage`) and kept across steps, as XTuner, verl and OpenRLHF
keep theirs.

The driver keeps the loop and the small stages (prepare, judge, the records); what needs the policy
goes to the workers: a rollout or an evaluation is dealt out, whole prompt groups to each engine in
contiguous shares of about equal work, and gathered back in order; train, checkpoint and export run on
every rank, rank 0 writing what one process would. Between driver and workers travel step numbers,
prompt ids and generations: O(rollouts) bytes a step, never the weights.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path

from rlx.config import RLTrainerConfig, SampleParams
from rlx.engines import Engines
from rlx.errors import UserError
from rlx.stages.train import replay
from rlx.workers.cluster import ray_instance
from rlx.workers.worker import Worker

PLACEMENT_SECONDS = 120  # how long Ray may take to find room for the bundles before rlx gives up
COUNTERS = ("time/workers", "perf/driver_worker_bytes")  # what a step logs of its workers (take_counters)


@contextlib.contextmanager
def warm_engines(config: RLTrainerConfig) -> Iterator[Engines]:
    """What stays warm for a run: one worker in this process, or a group of them on Ray, stopped after."""
    if not config.resources.on_ray:
        yield Engines(config, replay)
        return
    with ray_instance(config) as ray:
        group = WorkerGroup(ray, config)
        try:
            yield Engines(config, replay, workers=group)
        finally:
            group.stop()


def bundle(config: RLTrainerConfig) -> dict[str, float]:
    """One worker's reservation, in Ray's resource names."""
    resources = config.resources
    reserved = {"CPU": resources.num_cpus_per_worker}
    if resources.accelerator == "GPU":
        reserved["GPU"] = resources.num_accelerators_per_worker
    if resources.cpu_memory_per_worker:
        reserved["memory"] = resources.cpu_memory_per_worker
    return reserved


def shares(prompt_ids: Sequence[Sequence[int]], work_per_prompt: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous (start, end) shares of ``prompt_ids`` with about equal expected work (prompt
    length plus ``work_per_prompt`` new tokens each), cut only where the prompt changes, so a group
    (one prompt repeated) stays on one engine, whose prefix cache then serves all its samples."""
    cumulative, total = [0], 0
    for ids in prompt_ids:
        total += len(ids) + work_per_prompt
        cumulative.append(total)
    boundaries = [i for i in range(1, len(prompt_ids)) if list(prompt_ids[i]) != list(prompt_ids[i - 1])]
    cuts = [0]
    for part in range(1, count):
        target = total * part / count
        later = [b for b in boundaries if b >= cuts[-1]]
        cuts.append(min(later, key=lambda b: abs(cumulative[b] - target)) if later else len(prompt_ids))
    cuts.append(len(prompt_ids))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class WorkerGroup:
    """The actors, their placement and their rendezvous; every call goes to all of them and fails fast,
    naming the worker, when one of them fails or dies."""

    def __init__(self, ray, config: RLTrainerConfig):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, count = ray, config.resources.num_workers
        reserved = bundle(config)
        self.placement = placement_group([reserved] * count, strategy=config.resources.pg_pack_strategy)
        if not ray.wait([self.placement.ready()], timeout=PLACEMENT_SECONDS)[0]:
            ray.util.remove_placement_group(self.placement)
            raise UserError(
                f"resources: Ray found no room for {count} workers of {reserved} each, placed "
                f"{config.resources.pg_pack_strategy}, in {PLACEMENT_SECONDS} s on {len(ray.nodes())} node(s)"
            )
        options = {"num_cpus": reserved["CPU"], "num_gpus": reserved.get("GPU", 0), "max_restarts": 0}
        options |= {"memory": reserved["memory"]} if "memory" in reserved else {}
        actor = ray.remote(Worker)
        self.actors = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank),
                **options,
            ).remote(config, str(Path.cwd()), rank, count)
            for rank in range(count)
        ]
        self.counters = dict.fromkeys(COUNTERS, 0.0)
        self.places = [{"node": "not yet known", "pid": "not yet known"}] * count  # until they answer
        self.places = self.call("where", what="start-up")
        port = ray.get(self.actors[0].rendezvous_port.remote())
        self.call("join", self.places[0]["node"], port, what="start-up")

    def described(self, rank: int) -> str:
        place = self.places[rank]
        return f"worker {rank} (node {place['node']}, pid {place['pid']})"

    def call_each(self, method: str, arguments: list[tuple], what: str) -> list:
        """``method`` on every worker, worker ``r`` given ``arguments[r]``; their results in rank order.
        The first failure ends the wait (the others may be blocked in a collective with the failed one)."""
        pending = [actor.timed.remote(method, *args) for actor, args in zip(self.actors, arguments, strict=True)]
        ranks = {ref: rank for rank, ref in enumerate(pending)}
        timed = {}
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            timed[ranks[ready[0]]] = self.checked_result(ready[0], ranks[ready[0]], what)
        results = [timed[rank][0] for rank in range(len(self.actors))]
        self.counters["time/workers"] += max(seconds for _, seconds in timed.values())
        self.counters["perf/driver_worker_bytes"] += len(pickle.dumps((arguments, results)))
        return results

    def checked_result(self, ref, rank: int, what: str):
        """A worker's result, its own UserError passed on as is, its death said in one line."""
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

    def take_counters(self) -> dict[str, float]:
        """Since the last call: the seconds of the slowest worker of each call, and the bytes of the calls'
        arguments and results (what crosses between driver and workers: never the weights)."""
        counters, self.counters = self.counters, dict.fromkeys(COUNTERS, 0.0)
        return counters

    def call(self, method: str, *args, what: str) -> list:
        return self.call_each(method, [args] * len(self.actors), what)

    def run(self, name: str, step: int) -> dict:
        """Stage ``name`` of ``step`` on every rank; rank 0's metrics, as one process would give them."""
        return self.call("run", name, step, what=f"stage {name} of step {step}")[0]

    def write_policy(self, step: int, folder: Path, mark: dict | None) -> Path:
        """Step ``step``'s policy written by rank 0 (every rank takes part if it must be replayed)."""
        return self.call("write_policy", step, folder, mark, what=f"writing the policy of step {step}")[0]

    def sampler(self, step: int) -> GroupSampler:
        return GroupSampler(self, step)

    def stop(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.ray.util.remove_placement_group(self.placement)


class GroupSampler:
    """The workers' engines as one sampler: each generates its share from the policy after ``step``
    steps; row ``i`` of the whole samples from seed ``seed + i`` wherever it lands, so the responses do
    not depend on how many engines there are."""

    def __init__(self, group: WorkerGroup, step: int):
        self.group, self.step = group, step

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int) -> list:
        cuts = shares(prompt_ids, params.max_tokens, len(self.group.actors))
        arguments = [(self.step, list(prompt_ids[start:end]), params, seed + start) for start, end in cuts]
        parts = self.group.call_each("generate", arguments, what=f"generation with the policy of step {self.step}")
        return [generation for part in parts for generation in part]
