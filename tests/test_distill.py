"""On-policy distillation (teacher_config): the per-token advantage against a hand computation, the
routing of rows to teachers, a real run taught by another run's replayed step, and that run killed at
each of the teacher stages' fault points resuming to the uninterrupted run's weights and scores."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import child_env, fitted_copy, killed_and_resumed
from rlx.algo.distill import mixed_advantages, reverse_kl_advantages
from rlx.algo.losses import policy_loss
from rlx.config import TeacherConfig
from rlx.explore import Run
from rlx.lineage.record import edit_params
from rlx.store.artifacts import read_json, read_rows
from rlx.store.layout import RunLayout
from rlx.training.microbatch import Micro, rollout_logprobs
from rlx.training.trainer import TokenBatch
from rlx.training.update import attach_distillation

TEACHER_KILLS = ["teachers.start", "teachers.metrics", "teacher.start", "teacher.metrics"]


def test_the_advantage_is_the_negative_reverse_kl_per_token_plus_the_weighted_reward_advantage():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    teacher = torch.tensor([[-0.5, -2.5, -0.5], [-0.2, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    distill = reverse_kl_advantages(student, teacher, mask, kl_coef=2.0)
    by_hand = [[2 * 0.5, 2 * -0.5, 0.0], [2 * -0.1, 2 * 2.0, 0.0]]  # -2 (s - t), 0 off the mask
    assert torch.allclose(distill, torch.tensor(by_hand))
    mixed = mixed_advantages(torch.tensor([1.0, -1.0]), distill, mask, reward_coef=0.5)
    assert torch.allclose(mixed, torch.tensor([[1.5, -0.5, 0.5], [-0.7, 3.5, 0.0]]))


def test_an_on_policy_update_descends_the_reverse_kl_token_by_token():
    """With the ratio 1 (one update per batch), the token-mean loss is minus the mean advantage, and its
    gradient moves each sampled token's log-prob towards the teacher's by ``kl_coef x (t - s) / tokens``."""
    student = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher, mask = torch.tensor([[-0.5, -2.5, -3.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    advantages = reverse_kl_advantages(student.detach(), teacher, mask, kl_coef=1.0)
    loss, _ = policy_loss(student, student.detach(), advantages, mask, kind="vanilla", loss_agg_mode="token-mean",
                          global_tokens=2)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(-(0.5 - 0.5) / 2)
    assert torch.allclose(student.grad, torch.tensor([[-0.5 / 2, 0.5 / 2, 0.0]]))


def rollout(prompt: list[int], response: list[int], logprobs: list, source: str, mask=None) -> dict:
    return {"prompt_ids": prompt, "response_ids": response, "prompt_len": len(prompt), "response_len": len(response),
            "rollout_logprobs": logprobs, "data_source": source, "response_mask": mask}  # fmt: skip


def test_each_micro_batch_gets_the_teachers_tokens_and_a_row_no_teacher_scored_keeps_its_reward():
    rollouts = [
        rollout([5, 6], [7, 8, 9], [-1.0, -2.0, -3.0], "math"),
        rollout([5], [7, 30, 8], [-1.0, None, -0.5], "math", mask=[1, 0, 1]),  # an agent's tool token
        rollout([5, 6], [9], [-4.0], "chat"),
    ]
    teachers = [
        {"teacher": "big", "teacher_logprobs": [-0.5, -2.0, -1.0]},
        {"teacher": "big", "teacher_logprobs": [-1.5, None, -0.25]},
        {"teacher": None, "teacher_logprobs": None},
    ]
    indices = [0, 1, 2]
    batch = TokenBatch.from_ids([r["prompt_ids"] for r in rollouts], [r["response_ids"] for r in rollouts], 0,
                                [r["response_mask"] for r in rollouts])  # fmt: skip
    micro = Micro(indices, batch, None, rollout_logprobs(rollouts, indices, batch.mask), None, 1.0, 6, 1.0)
    teaching = TeacherConfig(teachers=[{"name": "big", "path": "x"}], kl_coef=1.0, reward_coef=0.5)
    attach_distillation(teaching, [micro], torch.tensor([2.0, -2.0, 3.0]), rollouts, teachers)
    expected = torch.zeros_like(batch.mask)
    expected[0, 1:4] = torch.tensor([0.5 + 1.0, 0.0 + 1.0, 2.0 + 1.0])  # (t - s) + 0.5 x 2
    expected[1, 0:3] = torch.tensor([-0.5 - 1.0, 0.0, 0.25 - 1.0])  # the tool's token: no advantage
    expected[2, 1] = 3.0  # no teacher: the reward's advantage alone, unweighted
    assert torch.allclose(micro.advantages, expected)


def test_rows_go_to_the_teacher_of_their_data_source_and_the_rest_to_the_one_that_takes_every_row():
    teaching = TeacherConfig(teachers=[{"name": "math", "path": "a", "data_source": ["gsm8k", "math500"]},
                                       {"name": "all", "path": "b"}])  # fmt: skip
    assert [teaching.teacher_of(s).name for s in ("gsm8k", "math500", "rlx/arith")] == ["math", "math", "all"]
    only = TeacherConfig(teachers=[{"name": "math", "path": "a", "data_source": ["gsm8k"]}])
    assert only.teacher_of("rlx/arith") is None


@pytest.mark.parametrize(
    ("teachers", "message"),
    [
        ([{"name": "a", "path": "x"}, {"name": "b", "path": "y"}], "teachers ['a', 'b'] each take every row"),
        ([{"name": "a", "path": "x", "data_source": ["s"]}, {"name": "b", "path": "y", "data_source": ["s"]}],
         "data_source ['s'] is named by two teachers"),
        ([{"name": "a", "path": "x"}, {"name": "a", "path": "y", "data_source": ["s"]}], "names must differ"),
    ],
)  # fmt: skip
def test_routing_that_gives_a_row_two_teachers_is_refused(teachers, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        TeacherConfig(teachers=teachers)


# ---- a real run -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def distill_project(two_step_run, tmp_path_factory) -> Path:
    """The 2-step demo project taught by the finished 2-step run's step 1 (no checkpoint: replayed), its
    reward mixed in at half weight. Not run: copy it."""
    pristine, finished = two_step_run
    project = Path(shutil.copytree(pristine, tmp_path_factory.mktemp("distill") / "project", symlinks=True))
    shutil.copytree(finished / "runs/demo", project / "teachers/demo")
    teacher = "{teachers: [{name: demo, path: teachers/demo, step: 1}], kl_coef: 1.0, reward_coef: 0.5}"
    edit_params(project / "params.yaml", [f"teacher_config={teacher}"])
    return project


@pytest.fixture(scope="module")
def distill_run(distill_project, tmp_path_factory) -> Path:
    return fitted_copy(distill_project, tmp_path_factory.mktemp("distill-run"))


@pytest.mark.slow
def test_a_run_is_taught_per_token_and_records_its_teacher(distill_run):
    layout = RunLayout(distill_run / "runs/demo")
    recorded = read_json(layout.step(0).teachers)["demo"]
    assert recorded["step"] == 1 and recorded["fingerprint"]
    for step in (1, 2):
        rollouts, scored = read_rows(layout.step(step).rollouts), read_rows(layout.step(step).teacher)
        assert [r["teacher"] for r in scored] == ["demo"] * len(rollouts)
        assert {r["teacher_fingerprint"] for r in scored} == {recorded["fingerprint"]}
        for row, teacher in zip(rollouts, scored, strict=True):
            assert len(teacher["teacher_logprobs"]) == row["response_len"]
            gap = sum(s - t for s, t in zip(row["rollout_logprobs"], teacher["teacher_logprobs"], strict=True))
            assert teacher["reverse_kl"] == pytest.approx(gap, rel=1e-5, abs=1e-4)
        metrics = layout.step_metrics(step)
        assert metrics["teacher/reverse_kl/mean"] > 0 and metrics["teacher/reverse_kl/rlx/arith"] > 0
        assert 0 < metrics["distill/advantage_share"] < 1  # mixed: the teacher's and the reward's
        assert metrics["time/teacher"] > 0 and metrics["teacher/tokens"] > 0


@pytest.mark.slow
def test_a_distilled_step_replays_from_its_recorded_scores(distill_run, tmp_path, monkeypatch):
    """Step 1 has no checkpoint: materializing it replays its update from the teacher scores on disk (the
    teacher is not loaded), checked against the step's recorded fingerprint."""
    monkeypatch.chdir(distill_run)  # the run's paths are relative to its project
    folder = Run(distill_run / "runs/demo").policy(1, tmp_path / "step-1")
    assert (folder / "model.safetensors").is_file() and 1 not in RunLayout(distill_run / "runs/demo").checkpoints()


@pytest.mark.slow
def test_a_distillation_run_killed_in_its_teacher_stages_resumes_to_the_same_weights(
    distill_project, distill_run, tmp_path
):
    project = Path(shutil.copytree(distill_project, tmp_path / "project", symlinks=True))
    assert killed_and_resumed(project, TEACHER_KILLS, 2) == "resumed to the reference"
    for relative in ["step-2/policy/model.safetensors", "step-1/teacher.parquet", "step-2/teacher.parquet"]:
        assert (project / "runs/demo" / relative).read_bytes() == (distill_run / "runs/demo" / relative).read_bytes()


@pytest.mark.slow
def test_a_teacher_changed_in_place_since_the_run_started_is_refused(distill_run, tmp_path):
    project = Path(shutil.copytree(distill_run, tmp_path / "project", symlinks=True))
    (project / "teachers/demo/step-1/fingerprint.json").write_text('{"changed": 1}')
    command = [sys.executable, "-m", "rlx", "stage", "teacher", "params.yaml"]
    done = subprocess.run(command, cwd=project, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "teacher_config.teachers.0 (demo): teachers/demo's weights are not those the run started with" in done.stderr


@pytest.mark.slow
def test_show_and_the_notebook_put_the_teachers_log_probs_beside_the_students(distill_run, tmp_path, capsys):
    from rlx.cli import main
    from test_notebooks import execute

    run = Run(distill_run / "runs/demo")
    tokens = run.disagreements(2, top=5)
    assert len(tokens) == 5 and tokens["gap"].abs().is_monotonic_decreasing
    one = run.teacher_tokens(2, tokens["group"][0], tokens["sample"][0])
    assert one["gap"].tolist() == pytest.approx((one["student"] - one["teacher"]).tolist())
    assert one["gap"].abs().max() == pytest.approx(abs(tokens["gap"][0]))
    assert run.samples(2)["teacher"].eq("demo").all()
    with pytest.raises(SystemExit) as exited:
        main(["show", str(distill_run / "runs/demo"), "--rows", "2"])
    assert exited.value.code == 0 and "disagrees most with its teacher" in capsys.readouterr().out
    execute(
        "explore_rollouts", f"RUN = {str(run.work_dir)!r}\nSTEP = None\nAGENT_RUN = None\nDISTILL_RUN = None", tmp_path
    )
