"""Killed anywhere, `rlx fit` resumes to the very weights of an uninterrupted run, and a damaged
artifact found on resume is redone: real processes, SIGKILL at named fault points (rlx.store.faults).

Process starts dominate the cost (imports, DeepSpeed, DVC), so each case is a chain: the run is
killed at one point, rerun with the next point set (so the rerun resumes, then is killed again),
and so on; a last plain rerun finishes it. Every kill and every resume counts: the final policy
must equal the reference bitwise and DVC must be clean.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import child_env, dvc_status, fit, killed_and_resumed
from rlx.errors import UserError
from rlx.explore import Run
from rlx.lineage.record import edit_params
from rlx.run.worklock import hold_work_dir
from rlx.store.faults import POINTS
from rlx.store.layout import ITERATION, RunLayout
from test_distill import TEACHER_KILLS  # tested by a distillation run's kills

pytestmark = pytest.mark.slow

STEPS = 2  # conftest.two_step_run's; step 2 is the last: it evaluates, exports and prunes

# Chains list points in the order a run reaches them, so that each rerun does reach its point. The
# chains run side by side (each a project of its own): a process start is mostly one core's work.
CHAINS = {
    "to-step-1": [
        "inputs.dvc_write",  # the run's first DVC write (`dvc repro` of its inputs): DVC's lock info left empty
        *("base.start", "base.metrics", "checkpoint.start", "checkpoint.metrics"),  # step 0 and checkpoint 0
        *(f"{stage}.{when}" for stage in ("prepare", "rollout", "judge") for when in ("start", "metrics")),
        *("train.start", "train.optimizer_step", "train.metrics"),
    ],
    "from-step-1": [
        # Killed after step 1 trained (it writes no checkpoint; the first occurrence is checkpoint 0's):
        # the rerun re-creates its policy by replay.
        *("checkpoint.start@2", "replay.step"),
        # Step 2, the last, writes its checkpoint in the background while it evaluates and exports.
        *("train.save", "checkpoint.metrics", "evaluate.start", "evaluate.metrics"),
        *("export.start", "policy.write", "export.metrics"),
        # DVC records step 1 while step 2 runs, and step 1 is marked done once step 2's stages are:
        # (killed while DVC writes its lock info as it records step 1: the file is left empty)
        *("record.dvc_write", "dvc.commit", "step.commit", "step.prune"),
    ],
    # A seeded sample of occurrences of the point every artifact write passes (written, not yet renamed).
    # Each run writes at most 11 artifacts before it is killed: the chain ends well before the run does.
    "random-writes": [f"artifact.rename@{n}" for n in random.Random(9).sample(range(1, 12), 3)],
}
AGENT_KILL = "agent.tool_results"  # tested by the agent run's kill, below
chained = {p.partition("@")[0] for chain in CHAINS.values() for p in chain}
assert chained | {AGENT_KILL} | set(TEACHER_KILLS) == set(POINTS), "a fault point is untested"


@pytest.fixture(scope="module")
def pristine(two_step_run) -> Path:
    """The demo set to STEPS steps, without W&B (test_pipeline checks it); not run."""
    return two_step_run[0]


def fresh_copy(pristine: Path, base: Path) -> Path:
    return Path(shutil.copytree(pristine, base / "project", symlinks=True))


def final_policy(project: Path) -> bytes:
    return (RunLayout(project / "runs/demo").step(STEPS).policy / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference_run(two_step_run) -> Path:
    """An uninterrupted run, whose artifacts every resumed one must reproduce."""
    return two_step_run[1]


@pytest.fixture(scope="module")
def reference(reference_run) -> bytes:
    """The final weights of an uninterrupted run."""
    return final_policy(reference_run)


def differing_artifacts(project: Path, reference_run: Path) -> list[str]:
    """The steps' data files whose bytes differ from the uninterrupted run's: where a divergence began."""
    names = ["prompts.parquet", "rollouts.parquet", "judged.parquet", "update.parquet", "fingerprint.json"]
    relatives = [f"step-{step}/{name}" for step in range(1, STEPS + 1) for name in names]
    return [
        r for r in relatives if read_or_none(project / "runs/demo" / r) != read_or_none(reference_run / "runs/demo" / r)
    ]


def read_or_none(file: Path) -> bytes | None:
    return file.read_bytes() if file.is_file() else None


def test_killed_at_each_fault_point_resumes_to_the_same_weights(pristine, reference, tmp_path):
    with ThreadPoolExecutor(len(CHAINS)) as pool:
        outcomes = dict(zip(CHAINS, pool.map(partial(kill_along, pristine, tmp_path), CHAINS), strict=True))
    assert outcomes == {name: "resumed to the reference" for name in CHAINS}
    same = {name: final_policy(tmp_path / name / "project") == reference for name in CHAINS}
    assert same == dict.fromkeys(CHAINS, True), "weights differ after the kills of a chain"


def kill_along(pristine: Path, base: Path, name: str) -> str:
    """Kill `rlx fit` at each point of chain ``name`` in turn, then finish the run; what went wrong, if anything."""
    return killed_and_resumed(fresh_copy(pristine, base / name), CHAINS[name], STEPS)


@pytest.fixture(scope="module")
def partway(pristine, tmp_path_factory) -> Path:
    """A run killed as it marked step 1 done: step 1 recorded by DVC, step 2's stages run (on a loaded
    machine the background recorder may have recorded step 2 too before the kill). Every step is a
    checkpoint here, so step 1's is surely on disk (step 2's may still have been written)."""
    project = fresh_copy(pristine, tmp_path_factory.mktemp("partway"))
    edit_params(project / "params.yaml", ["checkpoint_interval=1"])
    assert fit(project, "step.prune").returncode == -9
    return project


def executed_calls(rollouts: Path) -> tuple[int, int]:
    """Per agent rollout of a step: the calls of the tool that ran (not the unreadable ones), and the
    turns whose calls ran through the loop (each reaches AGENT_KILL once)."""
    rows = pq.read_table(rollouts, columns=["tool_calls"]).to_pylist()
    calls = [json.loads(row["tool_calls"]) for row in rows]
    return sum(c["error"] is None for row in calls for c in row), sum(len({c["turn"] for c in row}) for row in calls)


def test_an_agent_run_killed_in_its_rollout_resumes_exactly_and_replay_calls_no_tool(
    agent_project, agent_run, tmp_path, monkeypatch
):
    """Killed by SIGKILL in step 2's rollout, past its first tool results: the rerun re-creates step 1's
    policy by replay and ends on the uninterrupted run's weights; only step 2's rollout called the tool
    again (helpers.agents.ping logs each call with its pid), and materializing step 1 calls it never."""
    from helpers.agents import TOOL_LOG

    reference = RunLayout(agent_run / "runs/demo")
    step_1, turns_1 = executed_calls(reference.step(1).rollouts)
    step_2, _ = executed_calls(reference.step(2).rollouts)
    assert (step_1, step_2) > (0, 0), "the taught model called no tool"
    project = fresh_copy(agent_project, tmp_path)
    assert killed_and_resumed(project, [f"{AGENT_KILL}@{turns_1 + 1}"], STEPS) == "resumed to the reference"
    weights = {name: final_policy(run) for name, run in (("resumed", project), ("reference", agent_run))}
    assert weights["resumed"] == weights["reference"]
    assert weights["reference"] != (reference.step(0).policy / "model.safetensors").read_bytes(), "nothing learned"
    log = project / TOOL_LOG
    pids = [line.split()[0] for line in log.read_text().splitlines()]
    killed, resumed = dict.fromkeys(pids)  # the two processes, in order
    assert (pids.count(killed) >= step_1, pids.count(resumed)) == (True, step_2)
    monkeypatch.chdir(project)
    Run(project / "runs/demo").policy(1, tmp_path / "step-1")  # no checkpoint: re-created by replay
    assert len(log.read_text().splitlines()) == len(pids)


def test_an_agent_runs_tool_tokens_are_masked_unscored_and_the_templates_rendering(agent_run):
    """The uninterrupted agent run's rollouts (here, where the run is made anyway) hold what the GPU check
    asserts of LMDeploy's (helpers.teaching.check_tool_tokens)."""
    from transformers import AutoTokenizer

    from helpers.teaching import check_tool_tokens

    tokenizer = AutoTokenizer.from_pretrained(agent_run / "data/tiny-qwen3")
    layout = RunLayout(agent_run / "runs/demo")
    rows = [row for step in (1, 2) for row in pq.read_table(layout.step(step).rollouts).to_pylist()]
    assert 0 < check_tool_tokens(rows, tokenizer) < len(rows)


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


DAMAGE = {  # file under the work_dir: (its stage, how it is damaged)
    "step-2/prompts.parquet": ("prepare", truncate),
    "step-2/judged.parquet": ("judge", flip_a_byte),
    "step-2/rollout_metrics.json": ("rollout", truncate),
    "step-2/update.parquet": ("train", flip_a_byte),
    "step-1/fingerprint.json": ("train", flip_a_byte),  # the finished step the next one starts from
    "step-1/policy/model.safetensors": ("checkpoint", truncate),  # by size; loaded: by hash, fingerprint
}


REDONE = "redone from its stage on, to the reference"


def test_a_damaged_artifact_is_redone_with_what_follows_it(partway, reference_run, tmp_path):
    """Each damage in a copy of its own, the reruns side by side (each is mostly a process starting)."""
    redo = partial(redo_damaged, partway, reference_run, tmp_path)
    with ThreadPoolExecutor(3) as pool:
        outcomes = dict(zip(DAMAGE, pool.map(redo, DAMAGE), strict=True))
    assert outcomes == dict.fromkeys(DAMAGE, REDONE)


def redo_damaged(partway: Path, reference_run: Path, base: Path, relative: str) -> str:
    """Damage ``relative`` in a copy of the run killed partway, rerun `rlx fit`; what went wrong, if anything."""
    stage, damage = DAMAGE[relative]
    project = Path(shutil.copytree(partway, base / relative.replace("/", "-") / "project", symlinks=True))
    work_dir = project / "runs/demo"
    file, step = work_dir / relative, int(relative.split("/")[0].removeprefix("step-"))
    data = file.read_bytes()
    file.unlink()  # a new file: the workspace copy may share its inode with DVC's cache
    file.write_bytes(damage(data))
    written = metrics_times(RunLayout(work_dir).step(step))
    done = fit(project)
    if done.returncode != 0:
        return done.stderr[-3000:]
    if f"{Path('runs/demo') / relative}: " not in done.stderr or f"stage {stage} of step {step} runs again" not in (
        done.stderr
    ):
        return f"the damage was not reported:\n{done.stderr[-3000:]}"
    after = metrics_times(RunLayout(work_dir).step(step))
    rewritten = {name for name in ITERATION if after[name] != written[name]}
    if rewritten != set(ITERATION[ITERATION.index(stage) :]):
        return f"stages run again: {sorted(rewritten)}"
    if final_policy(project) != final_policy(reference_run):
        differ = differing_artifacts(project, reference_run)
        return f"the final weights differ from the reference; so do {differ}, and in the run killed partway " + str(
            differing_artifacts(partway, reference_run)
        )
    return f"dvc status: {status}" if (status := dvc_status(project)) else REDONE


def metrics_times(paths) -> dict:
    """When each stage of a step last wrote its metrics (None: not yet)."""
    return {name: p.stat().st_mtime_ns if (p := paths.metrics(name)).is_file() else None for name in ITERATION}


def test_a_dvc_lock_cut_short_is_restored_from_the_last_step(partway, reference, tmp_path):
    """DVC rewrites dvc.lock in place; a run killed during that write leaves it cut short."""
    project = Path(shutil.copytree(partway, tmp_path / "project", symlinks=True))
    lock = project / "dvc.lock"
    text = lock.read_text()
    lock.write_text(text[: text.index("outs:", len(text) // 2) + len("outs:")])
    layout = RunLayout(project / "runs/demo")
    last_recorded = layout.steps_with(layout.step(0).lock.name)[-1]  # 1, or 2 where the kill came late
    done = fit(project)
    assert done.returncode == 0, done.stderr[-3000:]
    restored = f"dvc.lock is unreadable (a run killed while DVC wrote it?); restored from step {last_recorded}"
    assert restored in done.stderr, done.stderr[-3000:]
    assert final_policy(project) == reference
    assert dvc_status(project) == {}


HOLDER = """
import sys, time
from rlx.run.worklock import hold_work_dir
with hold_work_dir(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_work_dir_held_by_another_process_is_refused_then_taken_over(tmp_path, caplog):
    """Two clones may name one absolute work_dir: the second is refused with the holder named; the lock
    of a killed holder is taken over (the repository lock is tested in test_shared_repo)."""
    work_dir = tmp_path / "shared-run"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(work_dir)], env=child_env(), stdout=subprocess.PIPE)
    try:
        assert first.stdout.readline() == b"held\n"
        with pytest.raises(UserError) as refused, hold_work_dir(work_dir):
            pass
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert f"work_dir {work_dir} is in use by " in str(refused.value) and f"(pid {first.pid} on " in str(refused.value)
    assert str(refused.value).endswith("wait for it to finish or stop it")
    with caplog.at_level(logging.WARNING), hold_work_dir(work_dir):
        assert f"pid {first.pid}" in caplog.text and "which was killed" in caplog.text
