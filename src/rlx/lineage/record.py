"""What `rlx fit` records in DVC after each step, and the process that records it while the run goes on.

A step is recorded by pointing params.yaml at it and committing the iteration's stages, so dvc.lock
holds exactly what ``dvc repro`` would have left; a copy of that lock stays in the step's folder as
its lineage (gzip: a step's lock is mostly hashes and paths it shares with the others). Recording is
DVC's Python (YAML parsing, hashing, the lock rewrite): on a small machine it would compete with
generation for the interpreter and the cores, so it runs in a process of its own at the lowest CPU
priority, filling the gaps that generation and training leave.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gzip
import io
import json
import logging
import os
import re
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from rlx.config import apply_override, rollout_policy_step
from rlx.config.loading import round_trip_yaml
from rlx.errors import UserError
from rlx.helper_processes import helper_context
from rlx.store import faults
from rlx.store.artifacts import write_bytes, write_text
from rlx.store.layout import STAGES, RunLayout

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def edit_params(path: Path, overrides: list[str]) -> None:
    """Write ``KEY=VALUE`` overrides into params.yaml, keeping its comments, so DVC records what ran."""
    round_trip = round_trip_yaml()
    tree = round_trip.load(path.read_text())
    for override in overrides:
        apply_override(tree, override)
    text = io.StringIO()
    round_trip.dump(tree, text)
    write_text(text.getvalue(), path)


def point_at_step(path: Path, step: int, checkpoint: int, max_staleness: int) -> None:
    """Point params.yaml's ``run`` at a step, the newest checkpoint at or before it and the policy that
    generates its rollouts (``max_staleness`` updates behind). Each step does it, so the numbers are
    replaced in the text where ``run`` is laid out as rlx writes it (a tenth of the record's CPU went to
    ruamel's round trip of the whole file, which also rewrites other lines); any other layout goes
    through the round trip."""
    pointers = {
        "step": step,
        "prev": step - 1,
        "checkpoint": checkpoint,
        "rollout_policy": rollout_policy_step(step, max_staleness),
    }
    text = path.read_text()
    edited = replace_run_pointers(text, pointers)
    if edited is None:
        edit_params(path, [f"run.{key}={value}" for key, value in pointers.items()])
    elif edited != text:
        write_text(edited, path)


_RUN_BLOCK = re.compile(r"^run:[ \t]*(#.*)?\n((?:[ \t]+.*\n|[ \t]*#.*\n|[ \t]*\n)*)", re.MULTILINE)


def replace_run_pointers(text: str, pointers: dict[str, int]) -> str | None:
    """``text`` with the integers of top-level ``run``'s block-style ``KEY: N`` lines replaced, or None
    unless each of ``pointers`` appears there exactly once."""
    text = text if text.endswith("\n") else text + "\n"
    block = _RUN_BLOCK.search(text)
    if block is None:
        return None
    body = block[2]
    for key, value in pointers.items():
        line = re.compile(rf"^([ \t]+{key}:[ \t]*)-?\d+(?=[ \t]*(#.*)?$)", re.MULTILINE)
        body, found = line.subn(rf"\g<1>{value}", body)
        if found != 1:
            return None
    return text[: block.start(2)] + body + text[block.end(2) :]


def dvc_commit(root: Path, names: list[str]) -> None:
    """Record stages ``names`` (their deps, params and outs) in dvc.lock, as `dvc commit -f NAMES` would,
    with one parse of dvc.yaml and one write of the lock; other stages are left as they are. No
    run-cache entries: the run-cache cannot restore a step (its checkpoints are ``cache: false``) and
    writing them was a quarter of the recording's time."""
    from dvc.dvcfile import load_file
    from dvc.repo import Repo

    # Another DVC command holding the repository (a `dvc status`; a `dvc repro`, whose rlx stages refuse
    # to run during a run and so end soon) is waited for: a record that gave up would stop the run.
    with Repo(str(root), _wait_for_lock=True) as repo, repo.lock, each_yaml_text_parsed_once():
        dvcfile = load_file(repo, "dvc.yaml")
        stages = [dvcfile.stages[name] for name in names]
        for stage in stages:
            stage.save(run_cache=False)
            stage.commit()
        faults.point("dvc.commit")
        write_lock(root / "dvc.lock", stages)


_parsed: dict[str, object] = {}  # YAML text: what DVC's safe parse made of it


@contextlib.contextmanager
def each_yaml_text_parsed_once():
    """Within it, DVC parses each distinct YAML text once and gets a copy after that. DVC reads
    params.yaml anew for each stage's params dependency and for dvc.yaml's templates, and dvc.yaml
    itself at each commit: eight parses of two unchanged texts per step, in ruamel's pure-Python
    constructor, took a third of the record's CPU. The texts are the keys, so nothing stale is read."""
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _yaml

    parse = _yaml.parse_yaml
    users = [module for module in (_yaml, strictyaml) if getattr(module, "parse_yaml", None) is parse]

    def parse_once(text, path, typ="safe"):
        if typ != "safe":
            return parse(text, path, typ)
        if text not in _parsed:
            if len(_parsed) > 8:  # params.yaml, dvc.yaml and the lock's latest texts are what recur
                _parsed.clear()
            _parsed[text] = parse(text, path, typ)
        return copy.deepcopy(_parsed[text])

    for module in users:
        module.parse_yaml = parse_once
    try:
        yield
    finally:
        for module in users:
            module.parse_yaml = parse


_written: dict[Path, tuple[str, dict]] = {}  # lock: the text this process last wrote there, and its data


def write_lock(path: Path, stages) -> None:
    """Put the stages' entries into dvc.lock, as DVC's own dump does, but with libyaml's C parser and
    emitter: DVC edits the lock with ruamel's comment-preserving round trip, in pure Python, which was
    half of a step's record (a lock has no comments to preserve). A lock that still holds what this
    process wrote last is not parsed again (its parse was a tenth of the record's CPU)."""
    from dvc.stage.serialize import to_lockfile

    path = path.resolve()
    text = path.read_text() if path.is_file() else ""
    kept_text, kept = _written.get(path, ("", None))
    lock = kept if kept is not None and text == kept_text else yaml.CSafeLoader(text).get_single_data()
    lock = lock or {"schema": "2.0"}
    lock.setdefault("stages", {})
    for stage in stages:
        lock["stages"].update(json.loads(json.dumps(to_lockfile(stage))))  # DVC's OrderedDicts as plain dicts
    text = yaml.dump(lock, Dumper=yaml.CSafeDumper, sort_keys=False)
    write_text(text, path)
    _written[path] = (text, lock)


_committed: dict[tuple[Path, str], tuple[int, ...]] = {}  # (project, stage): run pointers of its last commit here


def record_step(params: Path, layout: RunLayout, step: int, checkpoint: int, max_staleness: int) -> dict[str, float]:
    """Point params.yaml at ``step``, commit the stages whose entries may have changed to DVC and keep a
    copy of the lock in the step's folder; returns the seconds it took and the CPU seconds it used (what
    it took from generation and training on a small machine).

    Every stage of the iteration depends on ``run.step``, so each step commits them all, except three:
    ``base`` and ``teachers`` read no run pointer, and ``checkpoint`` only ``run.checkpoint``. This process
    commits ``base`` and ``teachers`` once and ``checkpoint`` when its checkpoint moves; nothing else they
    read changes while the run goes on (a rerun is a new process and commits them again), which spares a
    sixth of the record's CPU."""
    started, used = time.perf_counter(), time.process_time()
    point_at_step(params, step, checkpoint, max_staleness)
    steady = {"base": (), "teachers": (), "checkpoint": (checkpoint,)}  # not reading run.step: what they read
    project = params.parent.resolve()
    names = [name for name in STAGES if name not in steady or _committed.get((project, name)) != steady[name]]
    dvc_commit(params.parent, names)
    _committed.update({(project, name): steady[name] for name in names if name in steady})
    write_bytes(gzip.compress((params.parent / "dvc.lock").read_bytes(), mtime=0), layout.step(step).lock)
    faults.point("step.commit")
    return {"time/dvc_commit": time.perf_counter() - started, "time/dvc_commit_cpu": time.process_time() - used}


def repair_dvc_files(root: Path, layout: RunLayout) -> None:
    """Repair what a killed process can leave half-written of DVC's own files, before DVC reads them
    (under rlx's repository lock): its lock info and dvc.lock."""
    repair_rwlock(root)
    repair_dvc_lock(root, layout)


def repair_rwlock(root: Path) -> None:
    """DVC keeps which process reads or writes which path in ``.dvc/tmp/rwlock``, rewritten in place at
    every stage it runs or commits: a process killed during that write leaves it empty or cut short, and
    every DVC command after it stops (``JSON structure is corrupted``). Under DVC's own guard of that
    file (so no live writer is overtaken), an unreadable one is replaced by an empty one: the process
    that was writing it is dead, and DVC drops the entries of dead processes anyway."""
    from dvc.config import Config
    from dvc.lock import make_lock
    from dvc.rwlock import RWLOCK_FILE, RWLOCK_LOCK, SCHEMA
    from voluptuous import Invalid

    folder = root / ".dvc" / "tmp"
    path = folder / RWLOCK_FILE
    if not path.is_file():
        return
    hardlink = Config(dvc_dir=str(root / ".dvc"))["core"].get("hardlink_lock", False)
    with make_lock(str(folder / RWLOCK_LOCK), tmp_dir=str(folder), hardlink_lock=hardlink, wait=True):
        try:
            SCHEMA(json.loads(path.read_text()))
            return
        except (ValueError, Invalid):
            pass
        log.warning("%s is unreadable (a process killed while DVC wrote it?); replaced by an empty one", path)
        write_text("{}", path)


def fault_point_inside_dvc_writes(name: str) -> None:
    """A testing aid (rlx.store.faults): DVC writes its lock info and its YAML files (dvc.lock) in place, the
    file emptied when it is opened; put the fault point ``name`` between the opening and the writing,
    where a kill leaves the file empty. Does nothing unless ``RLX_FAULT`` names the point."""
    if not faults.armed(name):
        return
    import types

    import dvc.rwlock
    from dvc.utils.serialize import _yaml

    def after_the_point(write):
        def written(data, stream, *args, **kwargs):
            faults.point(name)
            return write(data, stream, *args, **kwargs)

        return written

    dvc.rwlock.json = types.SimpleNamespace(**{**vars(json), "dump": after_the_point(json.dump)})
    _yaml._dump = after_the_point(_yaml._dump)


def repair_dvc_lock(root: Path, layout: RunLayout) -> None:
    """DVC rewrites dvc.lock in place: a run killed during that write leaves it unreadable. Put back the
    copy kept by the last recorded step (a step's copy is written once its record is complete); the
    next commit records what came after it."""
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA
    from voluptuous import Invalid

    lock = root / "dvc.lock"
    try:
        COMPILED_LOCKFILE_SCHEMA(yaml.safe_load(lock.read_text()))  # as DVC checks it when it loads it
        return
    except FileNotFoundError:
        return
    except (yaml.YAMLError, Invalid):
        pass
    recorded = layout.steps_with(layout.step(0).lock.name)
    if not recorded:
        raise UserError(f"{lock} is unreadable (a run killed while DVC wrote it?) and no recorded step kept a copy")
    log.warning("%s is unreadable (a run killed while DVC wrote it?); restored from step %d", lock, recorded[-1])
    write_bytes(gzip.decompress(layout.step(recorded[-1]).lock.read_bytes()), lock)


def make_room_for_the_recorder() -> None:
    """Make OpenMP threads that finish a parallel region spin for a short while only (GOMP_SPINCOUNT,
    10x below libgomp's default) before they sleep: the recorder runs at the lowest priority on the
    cores generation and training leave idle, and threads spinning for long leave none. OpenMP reads
    this once, when torch loads, so `rlx fit` calls it first; a setting of your own wins (README:
    Performance has the step times of the three settings)."""
    os.environ.setdefault("GOMP_SPINCOUNT", "30000")


def recorder() -> ProcessPoolExecutor:
    """One process that records the steps handed to it, in order (``submit(record_step, ...)``)."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=helper_context(),  # a fresh interpreter: no copy of the run's threads, nor the user's program
        initializer=_serve_the_run,
        initargs=(os.getpid(),),
    )


def _serve_the_run(run: int) -> None:
    """Set up the recorder process: lowest priority, killed with the run (SIGKILL included, so it never
    writes dvc.lock behind a rerun's back), and its fault points kill the run too."""
    os.nice(19)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != run:  # the run died before the line above took effect
        os._exit(1)
    faults.kill_with(run)
    fault_point_inside_dvc_writes("record.dvc_write")
