"""Evaluation metrics as papers report them, and `rlx eval` / `rlx convert` on real files."""

from __future__ import annotations

import itertools

import pytest

from conftest import DATA
from rlx.cli import main
from rlx.stages.evaluate import dataset_metrics, majority_correct, pass_at_k
from rlx.store.artifacts import read_rows
from rlx.tasks.data import load_rows


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 1), (4, 1, 2), (8, 3, 4), (8, 0, 2), (8, 8, 8), (5, 4, 3)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    # brute force: of every way to draw k of the n samples (the first c correct), the share with a correct one
    draws = list(itertools.combinations(range(n), k))
    expected = sum(any(i < c for i in draw) for draw in draws) / len(draws)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def sample(correct, extracted, finish="stop", length=10):
    return {"correct": correct, "extracted": extracted, "finish_reason": finish, "response_len": length}


def test_dataset_metrics_mean_pass_and_majority():
    samples = [
        sample(True, "4"), sample(False, "5"), sample(False, "5"), sample(True, "4"),  # maj tie: first seen wins
        sample(False, "1", "length", 32), sample(False, "2"), sample(False, None), sample(False, "2"),
    ]  # fmt: skip
    metrics = dataset_metrics("eval/x", samples, n=4)
    assert metrics["eval/x/accuracy"] == metrics["eval/x/mean@4"] == pytest.approx(2 / 8)
    assert metrics["eval/x/pass@1"] == pytest.approx((0.5 + 0) / 2)
    # problem 1 (2 of 4 right): 5 of the 6 pairs hold a right one; problem 2: none
    assert metrics["eval/x/pass@2"] == pytest.approx((5 / 6 + 0) / 2)
    assert metrics["eval/x/pass@4"] == pytest.approx(0.5)
    assert metrics["eval/x/maj@4"] == pytest.approx(0.5)
    assert metrics["eval/x/truncated_frac"] == pytest.approx(1 / 8)
    assert not majority_correct([sample(False, None)])


def test_convert_writes_the_real_sets_in_the_row_shape(tmp_path):
    for name, source, count in (("gsm8k", "gsm8k/test.jsonl", 1319), ("math500", "math500/test.jsonl", 500)):
        out = tmp_path / f"{name}.parquet"
        with pytest.raises(SystemExit) as exited:
            main(["convert", name, str(DATA / source), str(out)])
        assert exited.value.code == 0
        rows = load_rows(out)
        assert len(rows) == count
    assert "\\boxed{}" in rows[0]["prompt"][0]["content"]


@pytest.mark.slow
def test_rlx_eval_scores_a_model_folder_outside_a_run(tiny_model, tmp_path, capsys):
    cfg, metrics = tiny_model
    out = tmp_path / "samples.parquet"
    test_set = cfg.synthetic_task.output_dir / "test.parquet"
    args = ["eval", str(cfg.tiny_model.output_dir), "--data", str(test_set), "--max-tokens", "32", "--output", str(out)]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert f"{metrics['held_out_accuracy']:.4f}" in printed  # greedy: the warm start's own figure
    assert len(read_rows(out)) == 200
    with pytest.raises(SystemExit):
        main([*args[:-2], "--n", "4", "--temperature", "1.0", "--judger", "gsm8k"])
    assert "pass@4" in capsys.readouterr().out


class RecordingSampler:
    """Answers every prompt with '#### 3' and keeps what it was asked, to see what evaluation samples."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, params, *, seed):
        from rlx.samplers.types import Generation

        self.calls.append((list(prompt_ids), seed))
        return [Generation(list(p), [1, 2], "#### 3", [0.0, 0.0], "stop") for p in prompt_ids]


def test_eval_sample_ratio_and_sampling_seed_are_read(tmp_path, monkeypatch):
    import json

    from rlx import config
    from rlx.stages import evaluate

    data = tmp_path / "test.jsonl"
    rows = [
        {
            "data_source": "rlx/arith",
            "prompt": [{"role": "user", "content": str(i)}],
            "reward_model": {"ground_truth": "3"},
        }
        for i in range(20)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(
        evaluate, "prompts_ids", lambda tokenizer, prompts, tools=None: [[int(p[0]["content"])] for p in prompts]
    )
    eval_set = f"evaluator_config.dataset_cfg=[{{name: t, anno_path: {data}, sample_ratio: 0.5}}]"
    cfg = config.load(
        None, [eval_set, "evaluator_config.eval_sample_ratio=0.5", "evaluator_config.sample_params.seed=9"]
    )
    sampler = RecordingSampler()
    samples, _ = evaluate.evaluate_policy(cfg, sampler, None, step=1)
    ((prompts, seed),) = sampler.calls
    assert len(samples) == len(prompts) == 5 and seed == 9  # 20 rows x 0.5 x 0.5, the set's own seed
    evaluate.evaluate_policy(cfg, sampler, None, step=2)
    assert sampler.calls[1] == sampler.calls[0]  # the same seeded subset every time
    evaluate.evaluate_policy(config.load(None, [eval_set]), sampler, None, step=1)
    assert len(sampler.calls[2][0]) == 10 and sampler.calls[2][1] == cfg.seed


def test_convert_qa_turns_your_own_question_answer_lines_into_rows(tmp_path):
    source = tmp_path / "mine.jsonl"
    source.write_text('{"question": "Ana has 3 apples and buys 4. How many? End with #### N.", "answer": 7}\n'
                      '{"question": "What is 10 - 4?", "answer": "6"}\n')  # fmt: skip
    out = tmp_path / "mine.parquet"
    with pytest.raises(SystemExit) as exited:
        main(["convert", "qa", str(source), str(out), "--split", "train", "--data-source", "my/wordmath"])
    assert exited.value.code == 0
    rows = load_rows(out)
    assert [(r["data_source"], r["prompt"][0]["content"][:7], r["reward_model"]["ground_truth"]) for r in rows] == [
        ("my/wordmath", "Ana has", "7"),
        ("my/wordmath", "What is", "6"),
    ]
