"""One worker of the group, a Ray actor alive for the whole run: a DeepSpeed rank with its own
rollout engine. It keeps an :class:`rlx.engines.Engines` of its own, whose policy lives in this
process (rlx.workers.home.InProcess, the one-process run's home), so the policy it trains at step N is
the very module it samples step N+1 from, and the driver sends it only step numbers and prompt ids.
It runs the stages' own code (train, checkpoint, export) on the run's files, which every node must
see (a shared filesystem, as for XTuner's ``work_dir``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from rlx.config import RLTrainerConfig, SampleParams
from rlx.engines import Engines
from rlx.errors import UserError
from rlx.lineage.fingerprint import fingerprint, first_difference, names_hash, parameter_names
from rlx.samplers.types import Generation
from rlx.stages import reseed
from rlx.store.artifacts import read_json
from rlx.store.background import BackgroundWriter
from rlx.training.distributed import free_port
from rlx.workers.actors import Actor, as_arrays, as_tensors
from rlx.workers.home import place_policy


class RolloutWorker(Actor):
    """A rollout worker apart from the trainers (``resources.num_rollout_workers``): a rollout engine that
    samples from the policy the trainer last gave it."""

    def __init__(self, label: str, shown: bool, config: RLTrainerConfig, project: str, replay: Callable | None = None):
        super().__init__(label, shown, config, project)
        self.config, self.engines = config, place_policy(Engines(config, replay))
        self.home = self.engines.home

    def hold(self, step: int, arrays: dict) -> str:
        """Sample from now on from the policy after ``step`` steps, sent as rlx.workers.actors.as_arrays; the
        digest of the weights this engine then holds, once proven to be that policy's."""
        sent = as_tensors(arrays)
        self.engines.take_policy(step, sent)
        return proven_copy(self.label, self.engines.policy(step), sent, self.engines.layout.step(step))

    def generate(self, step: int, prompt_ids: Sequence[Sequence[int]], params: SampleParams, seed: Sequence[int]):
        """This worker's share of a rollout or evaluation, sampled from the policy after ``step`` steps."""
        generations: list[Generation] = self.home.sampler(step).generate(prompt_ids, params, seed=seed)
        return generations


def proven_copy(label: str, held, sent: dict, paths) -> str:
    """The digest of the engine's copy ``held``, once each of its tensors equals the one ``sent`` and, for a
    plain model, its fingerprint equals the one the run recorded for that policy (a LoRA policy is recorded
    as its adapter, and sent merged): a sync that missed or garbled a tensor stops here, naming it."""
    states, names = held.state_dict(), parameter_names(held)
    wrong = next((name for name, tensor in sent.items() if not torch.equal(states[name], tensor)), None)
    recorded = read_json(paths.weights_fingerprint)
    same_parameters = recorded["names"] == names_hash(names)
    actual = fingerprint(held, like=recorded if same_parameters else None)
    problem = f"parameter {wrong} differs from the one sent" if wrong else None
    if problem is None and same_parameters:
        problem = first_difference(recorded, actual, names)
    if problem:
        raise UserError(
            f"{label}: the policy of step {paths.number} it was sent is not the one the run recorded ({problem}): "
            "the weight sync failed; rerun `rlx fit` to resume from the last complete step"
        )
    return actual["digest"]


class Worker(RolloutWorker):
    """A train worker: a rollout worker (colocated) that is also a DeepSpeed rank and holds its own policy."""

    def __init__(
        self,
        label: str,
        shown: bool,
        config: RLTrainerConfig,
        project: str,
        rank: int,
        world_size: int,
        replay: Callable,
    ):
        # replay: the train stage's, handed in as the driver's Engines gets it
        super().__init__(label, shown, config, project, replay)
        self.rank, self.world_size = rank, world_size
        self.writer = BackgroundWriter("rlx-checkpoint")

    def rendezvous_port(self) -> int:
        return free_port()

    def join(self, master_addr: str, master_port: int) -> None:
        """The torch.distributed rendezvous DeepSpeed reads when this rank's trainer starts (NCCL on GPUs,
        gloo on CPU): this worker is one rank of a launched world (rlx.training.distributed.launched)."""
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK="0",  # Ray gives each worker its own devices: its GPU is cuda:0
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )

    def run(self, name: str, step: int) -> dict:
        """Stage ``name`` of ``step`` on this rank, its RNGs seeded as the one-process run seeds them."""
        reseed(self.config, name, step)
        return self.home.run(name, step)

    def base_fingerprint(self) -> dict:
        return self.home.base_fingerprint()

    def start_checkpoint(self, step: int) -> None:
        """Copy this rank's trainer state after ``step`` steps to host memory, together with the other ranks,
        and write it in a thread of this actor's own while the driver goes on with the next steps."""
        self.writer.wait()
        self.writer.start(self.home.checkpoint, step, self.home.start_checkpoint(step))

    def checkpoint_written(self) -> None:
        """Wait for the write :meth:`start_checkpoint` began (its error, if any, raised here); the driver
        calls it in the actors' background concurrency group, which the other calls do not wait behind."""
        self.writer.wait()

    def write_policy(self, step: int, folder, mark: dict | None):
        """Rank 0 writes step ``step``'s policy; every rank first makes sure it holds it (a replay is collective)."""
        self.engines.policy(step)
        return self.home.write_policy(step, folder, mark) if self.rank == 0 else None

    def policy_ref(self, step: int):
        """Rank 0's policy after ``step`` steps in Ray's object store, for the rollout workers (every rank
        first makes sure it holds it: a replay is collective)."""
        import ray

        self.engines.policy(step)
        return ray.put(as_arrays(self.home.policy_to_send(step))) if self.rank == 0 else None
