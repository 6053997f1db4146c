"""Stage ``checkpoint``: the full policy and optimizer state, only every ``checkpoint_interval`` steps.

A step's own record is small (its rollouts, judgments, update numbers and a weights fingerprint);
the policy of any step is re-created from the newest checkpoint before it by replaying the recorded
updates (``Engines.trainer``). So weights are written only here: at step 0 (the base model and an
empty optimizer state, the root every replay can start from), every ``checkpoint_interval`` steps
and at the last step. With several workers the training ranks write it themselves, each its shard
of the optimizer state, rank 0 the policy.

`rlx fit` first copies the trainer's state to host memory (the ``start_checkpoint`` of the policy's
home, rlx.workers.home), then runs this stage in a background thread, which writes the copy while the
next steps run; with several workers each rank copies its own state and writes it in a thread of its
own, and this stage waits for them.
Outputs: ``policy/`` (HF folder) and ``trainer_state/`` (DeepSpeed), each written whole under a
temporary name, so a kill mid-write leaves the previous checkpoint as it was. Then, still in the
background, every file's size and hash go to ``checkpoint_outputs.json``: DVC records that list, not
the folders, whose gigabytes it would hash with md5 at a tenth of the speed (rlx.store.integrity).
The metrics file, written last, marks it done.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rlx.config import RLTrainerConfig
from rlx.store.artifacts import DiskFullError, atomic_dir, write_json
from rlx.store.layout import StepPaths

draws_random_numbers = False  # safe in a background thread: nothing here reseeds the run's RNGs
checked_when_loaded = True  # a resume checks the sizes only; rlx.training.restore checks the hashes as it reads


def is_due(config: RLTrainerConfig, step: int, total_steps: int) -> bool:
    interval = config.checkpoint_interval
    return step in (0, total_steps) or (interval > 0 and step % interval == 0)


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines, snapshot=None) -> dict:
    """The checkpoint if due: ``snapshot`` (`rlx fit`'s host copy of the trainer's state) or the
    trainer's state as it is."""
    if step and not is_due(config, step, paths.recorded_length()):  # step 0 is always due
        return {"checkpoint/saved": 0}
    if step == 0:
        with disk_full_reported(paths):
            save_base(paths, engines)
    else:  # with several workers each rank writes its shard of the optimizer state, rank 0 the policy
        engines.home.checkpoint(step, snapshot)
    size = sum(f.stat().st_size for out in outputs(paths) for f in out.rglob("*") if f.is_file())
    return {"checkpoint/saved": 1, "checkpoint/bytes": size}


def save_base(paths: StepPaths, engines) -> None:
    """Checkpoint 0: the base model as the run's starting policy (written where the policy is held: with
    several workers by worker 0), with an empty optimizer state."""
    engines.home.write_policy(0, paths.policy)
    with atomic_dir(paths.trainer_state) as tmp:
        write_json({"global_steps": 0}, tmp / "state.json")


def write_snapshot(snapshot, paths: StepPaths) -> None:
    """The trainer's policy and optimizer state from their host copy (rlx.training.trainer), where the home
    of the policy took it (rlx.workers.home)."""
    with disk_full_reported(paths):
        snapshot.write(paths.policy, paths.trainer_state)
    release_freed_memory()


@contextmanager
def disk_full_reported(paths: StepPaths) -> Iterator[None]:
    """A full disk while a checkpoint is written, reported with what is still intact."""
    try:
        yield
    except DiskFullError as exc:
        previous = paths.run.checkpoints(upto=paths.number - 1)
        intact = f"the previous checkpoint step-{previous[-1]} is intact" if previous else "no checkpoint was lost"
        raise DiskFullError(exc.path, f"{intact}: free some space and rerun to resume from it") from None


def release_freed_memory() -> None:
    """Give back to the system what the writers freed: serializing a policy and its optimizer state
    allocates a copy of them in pieces that glibc keeps after they are freed, so the process would
    stay larger by about the model's size for the rest of the run (docs/performance.md)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform == "linux" else None  # glibc's
    if trim:
        trim(0)


def outputs(paths) -> list:
    return [paths.policy, paths.trainer_state] if paths.policy.exists() else []
