"""Lineage without per-step weights: the fingerprint notices any change, any step's policy is re-created
exactly by replaying its recorded updates, and a run whose records were deleted or edited is refused
with one line. A real short `rlx fit` (checkpoints at 0, 2 and 3) and the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_project
from rlx.cli import main
from rlx.explore import Run
from rlx.lineage.fingerprint import fingerprint, first_difference
from rlx.store.artifacts import read_json
from rlx.store.layout import RunLayout

pytestmark = pytest.mark.slow


class Weights(torch.nn.Module):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(3000, generator=generator).to(dtype))
        self.b = torch.nn.Parameter(torch.randn(7, 5, generator=generator).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_fingerprint_changes_with_any_single_element_and_with_a_swap(dtype):
    module = Weights(dtype)
    before = fingerprint(module)
    assert fingerprint(Weights(dtype)) == before
    bits = module.a.data.view(torch.int32 if dtype == torch.float32 else torch.int16)
    for position in (0, 1, 1234, 2999):
        bits[position] += 1  # the least change: the next representable number
        assert first_difference(before, fingerprint(module), ["a", "b"]) == "parameter a differs"
        bits[position] -= 1
    assert fingerprint(module) == before
    with torch.no_grad():
        module.b[[0, 1]] = module.b[[1, 0]]  # same values, other places
    assert first_difference(before, fingerprint(module)) == "parameter number 1 differs"
    assert first_difference(
        before, fingerprint(Weights(torch.float16))
    ) == "the parameters' dtypes differ: 2 float16, recorded 2 " + str(dtype).removeprefix("torch.")


def test_a_fingerprint_costs_a_few_bytes_per_parameter_and_reads_each_in_its_recorded_dtype():
    """What every step keeps: 8 hex digits per parameter beside a fixed part; a policy recorded in
    bf16 and loaded in fp32 (as generation loads it) compares equal when read as recorded."""
    module = Weights(torch.bfloat16)
    recorded = fingerprint(module)
    assert len(recorded["tensors"]) == 8 * 2 and recorded["dtypes"] == [["bfloat16", 2]]
    assert len(json.dumps(recorded)) < 200
    widened = module.to(torch.float32)
    assert fingerprint(widened)["digest"] != recorded["digest"]
    assert fingerprint(widened, like=recorded) == recorded
    older = {"digest": "0" * 64, "tensors": {"a": ["bfloat16", 1, 2]}}  # the table an earlier rlx kept
    assert (
        first_difference(older, recorded)
        == "the recorded fingerprint is not one this rlx writes (an older rlx's, or edited)"
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model) -> Path:
    """A finished 3-step run with checkpoints kept at 0, 2 and 3; step 1 has no weights of its own."""
    from rlx.run.fit import fit

    project = make_project(tmp_path_factory.mktemp("lineage"), tiny_model)
    overrides = ["rollout_steps=3", "checkpoint_maxkeep=-1", "evaluator_config.enable_evaluate=false"]
    fit(project / "params.yaml", [*overrides, "wandb.enabled=false"])
    assert RunLayout(project / "runs/demo").checkpoints() == [0, 2, 3]
    return project


@contextlib.contextmanager
def inside(folder: Path):
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def rlx(argv: list[str], project: Path, capsys) -> tuple[int, str, str]:
    """The command's exit code, output and its last line on stderr (transformers' loading bars, shown in
    this process since it imported transformers before the CLI could silence them, come before)."""
    with inside(project), pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return exited.value.code, captured.out, (captured.err.splitlines() or [""])[-1] + "\n"


def weights_fingerprint(folder: Path) -> dict:
    from rlx.training.loading import load_policy

    return fingerprint(load_policy(folder))


def test_materialize_re_creates_an_unsaved_step_exactly(finished, capsys, tmp_path):
    work_dir = finished / "runs/demo"
    code, out, err = rlx(
        ["materialize", "runs/demo", "--step", "1", "--out", str(tmp_path / "step-1")], finished, capsys
    )
    assert code == 0, err
    assert weights_fingerprint(tmp_path / "step-1") == read_json(work_dir / "step-1/fingerprint.json")
    # A checkpoint is the step's policy itself; written elsewhere on request, it has the same weights.
    code, _, err = rlx(["materialize", "runs/demo", "--step", "3", "--out", str(tmp_path / "step-3")], finished, capsys)
    assert code == 0, err
    assert (
        load_file(tmp_path / "step-3/model.safetensors").keys()
        == load_file(work_dir / "step-3/policy/model.safetensors").keys()
    )
    assert weights_fingerprint(tmp_path / "step-3") == read_json(work_dir / "step-3/fingerprint.json")


def test_eval_and_explore_use_any_step(finished, capsys):
    code, out, err = rlx(
        ["eval", "runs/demo", "--step", "1", "--data", "data/arith/test.parquet", "--max-tokens", "8"], finished, capsys
    )
    assert code == 0, err
    assert "eval/accuracy" in out
    assert (finished / "runs/demo/materialized/step-1/config.json").is_file()
    samples = Run(finished / "runs/demo").samples(2)
    update = pd.read_parquet(finished / "runs/demo/step-2/update.parquet")
    assert samples["advantage"].tolist() == update["advantage"].tolist()
    assert samples["reward_used"].tolist() == samples["reward"].tolist()  # no KL in the reward here


@pytest.fixture
def copy(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "project", symlinks=True))


def edit_rewards(path: Path) -> None:
    """Rewards that surely move the update: one winner per group, not the one the judge picked."""
    frame = pd.read_parquet(path)
    for winner in (0, 1):
        edited = (frame["sample"] == winner).astype(float)
        if not edited.equals(frame["reward"]):
            break
    frame["reward"] = edited
    frame.to_parquet(path, index=False)


def test_a_step_that_does_not_exist_or_whose_records_are_gone_is_refused(copy, capsys):
    code, out, err = rlx(["materialize", "runs/demo", "--step", "9"], copy, capsys)
    assert (code, err) == (2, "error: runs/demo: step 9 has no policy (trained steps: [1, 2, 3])\n")
    (copy / "runs/demo/step-1/rollouts.parquet").unlink()
    code, out, err = rlx(["materialize", "runs/demo", "--step", "1", "--out", "one"], copy, capsys)
    assert (code, err) == (
        2,
        "error: cannot re-create the policy of step 1 of runs/demo: step 1's rollouts.parquet missing (deleted?); "
        "replay needs every step after the checkpoint it starts from\n",
    )


def test_edited_records_are_refused_before_they_are_replayed_or_shown(copy, capsys):
    """A middle step's tables, edited after the fact (their hashes kept with the step), are never read."""
    edit_rewards(copy / "runs/demo/step-1/judged.parquet")
    code, out, err = rlx(["materialize", "runs/demo", "--step", "1", "--out", "one"], copy, capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: runs/demo/step-1/judged.parquet: ")
    assert err.endswith(
        "rlx reads a run's files only as it wrote them: restore it, or delete runs/demo/step-1 and rerun `rlx fit` "
        "to make it again\n"
    )
    update = copy / "runs/demo/step-2/update.parquet"
    frame = pd.read_parquet(update)
    frame["advantage"] = frame["advantage"] + 1.0  # a forged advantage, same size
    frame.to_parquet(update, index=False)
    code, out, err = rlx(["show", "runs/demo", "--step", "2"], copy, capsys)
    assert (code, out) == (2, "") and err.startswith("error: runs/demo/step-2/update.parquet: ")
    code, out, err = rlx(["show", "runs/demo", "--step", "0"], copy, capsys)
    assert (code, err) == (
        2,
        "error: runs/demo: step 0 has no rollouts (step 0 is the base model, before any rollout); completed steps: "
        "[1, 2, 3]\n",
    )


def test_metrics_edited_or_damaged_are_refused_in_one_line(copy, capsys):
    shutil.copytree(copy / "runs/demo", copy / "runs/b")
    metrics = copy / "runs/b/step-3/train_metrics.json"
    edited = json.loads(metrics.read_text()) | {"train/loss": -1.0}
    metrics.write_text(json.dumps(edited, separators=(",", ":"), sort_keys=True) + "\n")
    code, out, err = rlx(["compare", "runs/demo", "runs/b"], copy, capsys)
    assert (code, err) == (
        2,
        "error: runs/b/step-3/train_metrics.json: not what DVC recorded for the step (edited?); rlx reads a run's "
        "files only as it wrote them: restore it, or delete runs/b/step-3 and rerun `rlx fit` to make it again\n",
    )
    metrics.write_text('{"train/loss": ')
    code, out, err = rlx(["compare", "runs/demo", "runs/b"], copy, capsys)
    assert code == 2 and err.startswith("error: runs/b/step-3/train_metrics.json: unreadable (Expecting value")


def test_a_materialized_folder_is_reused_only_as_it_was_written(copy, capsys, caplog):
    folder = copy / "runs/demo/materialized/step-1"
    code, _, err = rlx(["materialize", "runs/demo", "--step", "1"], copy, capsys)
    assert code == 0, err
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[0]
    save_file({**weights, name: weights[name] + 1}, folder / "model.safetensors", metadata={"format": "pt"})
    code, _, err = rlx(["materialize", "runs/demo", "--step", "1"], copy, capsys)
    assert code == 0, err
    assert "model.safetensors: contents differ from what was written (corrupted), since it was materialized" in (
        caplog.text
    )
    assert weights_fingerprint(folder) == read_json(copy / "runs/demo/step-1/fingerprint.json")


def tree(project: Path) -> dict[str, bytes]:
    """Every file of the project but DVC's own, by its path: what a refused command must leave as it was."""
    return {
        str(p.relative_to(project)): p.read_bytes()
        for p in project.rglob("*")
        if p.is_file() and ".dvc" not in p.relative_to(project).parts
    }


GUARDED = [  # a command that writes, pointed at something it must not replace: its exact message
    (["materialize", "runs/demo", "--step", "1", "--out", "."],
     "--out .: holds the repository {project} (with its .git and DVC cache), which rlx would replace; give a new "
     "path, e.g. models/NAME"),
    (["materialize", "runs/demo", "--step", "1", "--out", "runs/demo"],
     "--out runs/demo: is {project}/runs/demo, an input of rlx materialize; give another path"),
    (["materialize", "runs/demo", "--step", "1", "--out", "data/arith"],
     "--out data/arith: already exists and rlx materialize did not write it (it replaces only what it wrote "
     "itself); remove it or give a new path"),
    (["materialize", "runs/demo", "--step", "1", "--out", "params.yaml"],
     "--out params.yaml: is a file; give the path of a folder"),
    (["eval", "data/tiny-qwen3", "--data", "data/arith/test.parquet", "--output", "data/arith/test.parquet"],
     "--output data/arith/test.parquet: is {project}/data/arith/test.parquet, an input of rlx eval; give another "
     "path"),
    (["eval", "data/tiny-qwen3", "--data", "data/arith/test.parquet", "--output", "data"],
     "--output data: holds {project}/data/tiny-qwen3, an input of rlx eval; give another path"),
    (["eval", "data/tiny-qwen3", "--data", "data/arith/test.parquet", "--output", "src"],
     "--output src: is a folder; give the path of a file, e.g. src/out"),
    (["convert", "gsm8k", "data/gsm8k/test.jsonl", "data/arith/train.parquet"],
     "OUTPUT data/arith/train.parquet: already exists and rlx convert did not write it (it replaces only what it "
     "wrote itself); remove it or give a new path"),
    (["config", "schema", "-o", "dvc.yaml"],
     "--output dvc.yaml: already exists and rlx config schema did not write it (it replaces only what it wrote "
     "itself); remove it or give a new path"),
    (["init-data", "params.yaml", "-S", "synthetic_task.output_dir=.."],
     "synthetic_task.output_dir ..: holds the repository {project} (with its .git and DVC cache), which rlx would "
     "replace; give a new path, e.g. models/NAME"),
    (["init-model", "params.yaml", "-S", "tiny_model.output_dir=runs/demo/step-1/model"],
     "tiny_model.output_dir runs/demo/step-1/model: lies in the rlx run {project}/runs/demo, whose files rlx keeps "
     "on record; give a path outside it"),
]  # fmt: skip


def test_an_output_path_never_replaces_what_rlx_did_not_write(copy, capsys):
    """Every command that writes refuses, before writing, a path holding the project, a run, its own
    input, or anything it did not write itself; what it wrote itself it replaces."""
    before = tree(copy)
    outcomes = {}
    for argv, _ in GUARDED:
        code, out, err = rlx(argv, copy, capsys)
        outcomes[" ".join(argv)] = (code, err)
        assert tree(copy) == before, f"{argv} changed the project"
    assert outcomes == {" ".join(a): (2, f"error: {m.format(project=copy)}\n") for a, m in GUARDED}
    for _ in range(2):  # the second time over what the first wrote
        code, _, err = rlx(["convert", "gsm8k", "data/gsm8k/test.jsonl", "converted.parquet"], copy, capsys)
        assert code == 0, err
        code, _, err = rlx(["materialize", "runs/demo", "--step", "1", "--out", "models/one"], copy, capsys)
        assert code == 0, err
    assert weights_fingerprint(copy / "models/one") == read_json(copy / "runs/demo/step-1/fingerprint.json")


def test_a_damaged_checkpoint_is_refused_and_a_missing_one_replayed_around(copy, capsys):
    work_dir = copy / "runs/demo"
    shutil.rmtree(work_dir / "step-3/policy")  # step 3 now replays from checkpoint 2
    code, _, err = rlx(["materialize", "runs/demo", "--step", "3", "--out", "three"], copy, capsys)
    assert code == 0, err
    assert weights_fingerprint(copy / "three") == read_json(work_dir / "step-3/fingerprint.json")
    weights = load_file(work_dir / "step-2/policy/model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1
    save_file(weights, work_dir / "step-2/policy/model.safetensors", metadata={"format": "pt"})
    code, _, err = rlx(["materialize", "runs/demo", "--step", "2"], copy, capsys)
    assert (code, err) == (
        2,
        f"error: checkpoint runs/demo/step-2/policy is not the policy step 2 recorded (parameter {name} differs)\n",
    )


def test_a_damaged_optimizer_state_is_refused_when_loaded(copy, capsys):
    """The weights fingerprint cannot see the optimizer state; the hashes recorded as it was written can."""
    work_dir = copy / "runs/demo"
    shutil.rmtree(work_dir / "step-3/policy")  # step 3 now replays from checkpoint 2's trainer
    state = max(
        (f for f in (work_dir / "step-2/trainer_state").rglob("*") if f.is_file()), key=lambda f: f.stat().st_size
    )
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of an Adam moment: the file still loads
    state.unlink()  # a new file: the workspace copy may share its inode with DVC's cache
    state.write_bytes(bytes(data))
    code, _, err = rlx(["materialize", "runs/demo", "--step", "3", "--out", "three"], copy, capsys)
    relative = state.relative_to(copy)
    assert (code, err) == (
        2,
        f"error: checkpoint of step 2 is damaged ({relative}: contents differ from what was written (corrupted)); "
        "remove its policy/ and trainer_state/ and rlx re-creates them by replay from the checkpoint before\n",
    )


def test_a_metrics_files_mark_is_no_column_of_dvc_metrics_show(tmp_path):
    """The warm start's metrics carry rlx init-model's mark (the guard replaces only what it wrote) in a form
    DVC's metrics commands leave out, so `dvc metrics show` shows numbers only."""
    from dvc.repo.metrics.show import _extract_metrics

    from rlx.store.targets import made_by, metrics_mark

    written = {**metrics_mark("rlx init-model"), "held_out_accuracy": 0.46}
    (tmp_path / "warm_start.json").write_text(json.dumps(written))
    assert made_by(tmp_path / "warm_start.json") == "rlx init-model"
    assert _extract_metrics(written, "warm_start.json") == {"held_out_accuracy": 0.46}


def test_each_steps_rollouts_record_the_weights_their_engine_held_and_a_mismatch_is_reported(copy, capsys):
    """The rollout stage records the digest of the weights its engine sampled with beside the policy's
    fingerprint (here the sampler is the policy's own module: the two are one); `rlx show` names a step whose
    two differ."""
    metrics = copy / "runs/demo/step-2/rollout_metrics.json"
    record = json.loads(metrics.read_text())
    assert record["rollout/engine_digest"] == read_json(copy / "runs/demo/step-1/fingerprint.json")["digest"]
    code, out, _ = rlx(["show", "runs/demo", "--step", "3"], copy, capsys)
    assert code == 0 and "sampled with weights" not in out
    metrics.write_text(json.dumps(record | {"rollout/engine_digest": "0" * 64}))
    code, out, _ = rlx(["show", "runs/demo", "--step", "3"], copy, capsys)
    assert code == 0
    assert "step 2: its rollouts were sampled with weights 000000000000, not the policy of step 1 the run" in out


def test_a_weight_sync_that_skips_or_garbles_a_tensor_is_caught_before_any_rollout(copy, monkeypatch):
    """A rollout worker's copy (rlx.workers.worker): NaN before its first policy, then each tensor checked
    against the one sent and the whole against the policy's recorded fingerprint, naming the tensor."""
    from rlx.config import load
    from rlx.engines import Engines
    from rlx.errors import UserError
    from rlx.workers.worker import proven_copy

    monkeypatch.chdir(copy)
    config = load(copy / "runs/demo/config.yaml", ["work_dir=runs/demo"])
    paths, sent = RunLayout(config.work_dir).step(0), dict(Engines(config).policy(0).state_dict())
    engines = Engines(config)
    engines.take_policy(0, sent)
    assert (
        proven_copy("rollout worker 0", engines.policy(0), sent, paths)
        == read_json(paths.weights_fingerprint)["digest"]
    )
    garbled = {name: tensor + 1e-3 if name == "model.norm.weight" else tensor for name, tensor in sent.items()}
    engines.take_policy(0, garbled)
    with pytest.raises(UserError, match=r"rollout worker 0: the policy of step 0 it was sent is not the one the run "
                       r"recorded \(parameter model.norm.weight differs\): the weight sync failed"):  # fmt: skip
        proven_copy("rollout worker 0", engines.policy(0), garbled, paths)
    fresh, loader = Engines(config), torch.nn.Module.load_state_dict

    def skipping(model, weights):  # a loader that drops one tensor and says nothing
        return loader(model, {n: t for n, t in weights.items() if n != "model.norm.weight"}, strict=False)

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", skipping)
    fresh.take_policy(0, sent)  # the one it skipped stays NaN, never the base's value
    assert fresh.policy(0).get_parameter("model.norm.weight").isnan().all()
    with pytest.raises(UserError, match=r"\(parameter model.norm.weight differs from the one sent\)"):
        proven_copy("rollout worker 0", fresh.policy(0), sent, paths)
