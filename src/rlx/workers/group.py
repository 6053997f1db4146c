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
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from rlx.config import RLTrainerConfig, SampleParams
from rlx.engines import Engines
from rlx.judgers.rows import PanelJudging
from rlx.samplers import InBatches
from rlx.samplers.types import row_seeds
from rlx.stages.train import replay
from rlx.workers.actors import ActorGroup, as_arrays
from rlx.workers.cluster import ray_instance, worker_bundle
from rlx.workers.home import own_module_digest, place_policy
from rlx.workers.judges import JudgePool
from rlx.workers.worker import RolloutWorker, Worker


@contextlib.contextmanager
def warm_engines(config: RLTrainerConfig) -> Iterator[Engines]:
    """What stays warm for a run, the one place that chooses where its policy lives: in this process or
    in a group of workers on Ray (rlx.workers.home), with rollout workers apart and judge actors when
    ``resources`` and ``cpu_resources`` ask for them; the actors are stopped after."""
    resources = config.resources
    if not config.has_actors:
        yield engines_here(config)
        return
    with ray_instance(config) as ray, contextlib.ExitStack() as started:
        workers = started_group(started, WorkerGroup, ray, config) if resources.on_ray else None
        apart = started_group(started, RolloutPool, ray, config) if resources.num_rollout_workers else None
        started.enter_context(cores_left_to_driver(config))
        judges = started_group(started, JudgePool, ray, config) if config.cpu_resources else PanelJudging(config)
        yield place_policy(Engines(config, replay, judges), workers, apart)


def engines_here(config: RLTrainerConfig) -> Engines:
    """What stays warm for a run without actors: the policy, its rollouts and the judging in this process."""
    return place_policy(Engines(config, replay, PanelJudging(config)))


@contextlib.contextmanager
def cores_left_to_driver(config: RLTrainerConfig) -> Iterator[None]:
    """On CPU, with rollout workers on this machine's own Ray instance: the driver's torch threads only on
    the cores they do not reserve. Measured on 2 cores with one rollout worker: a 2-thread driver trained
    2.3x slower than a 1-thread one, its threads and the worker's contending for the cores."""
    resources, threads = config.resources, torch.get_num_threads()
    reserved = resources.num_rollout_workers * resources.num_cpus_per_worker
    local_cpu = resources.accelerator == "CPU" and resources.ray_address is None
    torch.set_num_threads(max(1, int((os.cpu_count() or 1) - reserved)) if local_cpu and reserved else threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def started_group(stack: contextlib.ExitStack, kind: type[ActorGroup], ray, config: RLTrainerConfig) -> ActorGroup:
    """A group of actors started now and stopped when ``stack`` closes."""
    group = kind(ray, config)
    stack.callback(group.stop)
    return group


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


class WorkerGroup(ActorGroup):
    """The workers, placed and joined in one torch.distributed group (rank 0's node holds the rendezvous);
    rank 0's lines are shown in the console. The policy's home on Ray (rlx.workers.home.PolicyHome)."""

    shows_first = True
    runs_apart = False

    def __init__(self, ray, config: RLTrainerConfig):
        resources, count = config.resources, config.resources.num_workers
        project = str(Path.cwd())
        arguments = lambda rank: (config, project, rank, count, replay)  # noqa: E731
        super().__init__(ray, Worker, "worker", worker_bundle(config), count, resources.pg_pack_strategy, arguments)
        port = ray.get(self.actors[0].rendezvous_port.remote())
        self.call("join", self.places[0]["node"], port, what="start-up")
        self.writing: int | None = None  # the step whose checkpoint the ranks are writing
        self.config = config

    def run(self, name: str, step: int) -> dict:
        """Stage ``name`` of ``step`` on every rank; rank 0's metrics, as one process would give them."""
        return self.call("run", name, step, what=f"stage {name} of step {step}")[0]

    def base_fingerprint(self) -> dict:
        """Worker 0's, the others left idle: the driver loads no model (on a GPU node it would take a
        GPU of the workers')."""
        ref = self.actors[0].timed.remote("base_fingerprint")
        return self.checked_result(ref, 0, "base fingerprint")[0]

    def start_checkpoint(self, step: int) -> None:
        """Every rank copies its state after ``step`` steps to host memory and starts writing it (each its
        shard of the optimizer state, rank 0 the policy) in a thread of its own: the driver goes on."""
        self.call("start_checkpoint", step, what=f"copying the checkpoint of step {step}")
        self.writing = step

    def checkpoint(self, step: int, snapshot=None) -> None:
        """Step ``step``'s checkpoint on disk: the write :meth:`start_checkpoint` began, or one made now
        (``snapshot`` is None: the ranks hold their copies)."""
        if self.writing != step:
            self.start_checkpoint(step)
        self.call("checkpoint_written", what=f"writing the checkpoint of step {step}", background=True)
        self.writing = None

    def write_policy(self, step: int, folder: Path, mark: dict | None = None) -> Path:
        """Step ``step``'s policy written by rank 0 (every rank takes part if it must be replayed)."""
        return self.call("write_policy", step, folder, mark, what=f"writing the policy of step {step}")[0]

    def policy_to_send(self, step: int):
        """An object-store reference to rank 0's policy after ``step`` steps (rlx.workers.worker.Worker.policy_ref)."""
        return self.call("policy_ref", step, what=f"sending the policy of step {step}")[0]

    def sampler(self, step: int) -> GroupSampler:
        return GroupSampler(self, step)

    def engine_digest(self, step: int) -> str:
        """Each rank samples from the module it trains, as one process does."""
        return own_module_digest(self.config, step)


class RolloutPool(ActorGroup):
    """The rollout workers placed apart from the trainers (``resources.num_rollout_workers``), each with
    the bundle of a train worker; they sample from the policy last given to them (``held``)."""

    def __init__(self, ray, config: RLTrainerConfig):
        resources, project = config.resources, str(Path.cwd())
        count, arguments = resources.num_rollout_workers, lambda rank: (config, project)  # noqa: E731
        super().__init__(
            ray, RolloutWorker, "rollout worker", worker_bundle(config), count, resources.pg_pack_strategy, arguments
        )
        self.held: int | None = None
        self.digests: dict[int, str] = {}  # policy step -> the digest of the weights the engines proved they hold
        self.sync_timeout = config.rollout_config.weight_sync_timeout

    def zeroed(self) -> dict[str, float]:
        return super().zeroed() | {"time/policy_send": 0.0}

    def hold(self, step: int, weights) -> None:
        """Give every rollout worker the policy after ``step`` steps (its weights, or a reference to them),
        put in the object store once for all of them, each proving it holds them (rlx.workers.worker.proven_copy)
        within ``rollout_config.weight_sync_timeout``; the driver's wait is counted in ``time/policy_send``."""
        started = time.perf_counter()
        ref = weights if isinstance(weights, self.ray.ObjectRef) else self.ray.put(as_arrays(weights))
        what = f"loading the policy of step {step}"
        digests = set(self.call("hold", step, ref, what=what, timeout=self.sync_timeout))
        if len(digests) != 1:  # each proved its copy against the same tensors: a bug, never a user's mistake
            raise RuntimeError(f"the rollout workers hold different weights for the policy of step {step}")
        self.digests[step], self.held = digests.pop(), step
        self.counters["time/policy_send"] += time.perf_counter() - started

    def sampler(self, step: int) -> GroupSampler:
        if self.held != step:
            raise RuntimeError(f"the rollout workers hold the policy of step {self.held}, not {step}")
        return GroupSampler(self, step)


class GroupSampler(InBatches):
    """The engines of a group of train or rollout workers as one sampler: each generates its share from
    the policy after ``step`` steps; row ``i`` of the whole samples from its seed (``seed + i``) wherever it
    lands, so the responses do not depend on how many engines there are."""

    def __init__(self, group: ActorGroup, step: int):
        self.group, self.step = group, step

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SampleParams, *, seed: int | Sequence[int]) -> list:
        cuts = shares(prompt_ids, params.max_tokens, len(self.group.actors))
        seeds = row_seeds(seed, len(prompt_ids))
        arguments = [(self.step, list(prompt_ids[start:end]), params, seeds[start:end]) for start, end in cuts]
        parts = self.group.call_each("generate", arguments, what=f"generation with the policy of step {self.step}")
        return [generation for part in parts for generation in part]
