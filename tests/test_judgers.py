"""Judgers on the real benchmarks and on the tricky cases, and a panel that never crashes a run."""

from __future__ import annotations

import json
import time

import pytest

from conftest import DATA
from rlx.config import JudgerConfig
from rlx.errors import UserError
from rlx.judgers import Panel, available, get, score_batch
from rlx.judgers.math import last_boxed
from rlx.judgers.numeric import to_number


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


GSM8K = read_jsonl(DATA / "gsm8k" / "test.jsonl")
MATH500 = read_jsonl(DATA / "math500" / "test.jsonl")


def gsm8k_gold(row):
    return row["answer"].rpartition("####")[2].strip().replace(",", "")


def test_available_lists_every_judger():
    assert available() == ["arith", "custom", "format", "gsm8k", "math", "reward_model"]
    with pytest.raises(UserError, match="unknown judger 'nope'"):
        get("nope")


def test_gsm8k_reference_solutions_all_score_and_other_rows_only_by_coincidence():
    judger = get("gsm8k")
    golds = [gsm8k_gold(row) for row in GSM8K]
    solutions = [row["answer"] for row in GSM8K]
    assert sum(score_batch(judger, solutions, golds)) == 1319
    shifted = score_batch(judger, solutions[1:] + solutions[:1], golds)
    coincidences = sum(to_number(a) == to_number(b) for a, b in zip(golds[1:] + golds[:1], golds, strict=True))
    assert sum(shifted) == coincidences
    assert coincidences < 30  # genuine coincidences only: equal gold answers of neighbouring rows


def test_math500_reference_solutions_score_with_math_verify():
    judger = get("math")
    misses = [row["unique_id"] for row in MATH500 if judger.score(row["solution"], row["answer"]) != 1.0]
    assert len(misses) <= 5, misses  # at least 99 %; measured: 0 misses of 500


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("so #### 1,600", "1600", 1.0),  # thousands commas
        ("#### -3", "-3", 1.0),  # negative numbers
        ("#### $72.00", "72", 1.0),  # dollar sign and a decimal form
        ("#### 72 dollars", "72", 1.0),  # units after the number
        ("I think 72", "72", 0.0),  # strict: no '####'
        ("", "72", 0.0),  # no answer at all
        ("#### 5 then #### 7", "7", 1.0),  # the last one counts
        ("x" * 100_000 + "#### 9", "9", 1.0),  # very long responses: only the tail is read
    ],
)
def test_gsm8k_tricky_cases(response, gold, expected):
    assert get("gsm8k", strict=True).score(response, gold) == expected


def test_gsm8k_flexible_mode_takes_the_last_number():
    assert get("gsm8k").score("I think it is 70, no, 72.", "72") == 1.0
    assert get("gsm8k", strict=True).score("I think it is 70, no, 72.", "72") == 0.0


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
        ("\\boxed{(1, 2]}", "(1,2]", 1.0),
        ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0),
        ("first \\boxed{3} then \\boxed{\\frac{a}{\\sqrt{b}}}", "\\frac{a}{\\sqrt{b}}", 1.0),  # nested, last box
        ("\\boxed{3}", "4", 0.0),
        ("no box at all: 3", "3", 0.0),
    ],
)
def test_math_tricky_cases(response, gold, expected):
    assert get("math").score(response, gold) == expected


def test_last_boxed_handles_nested_braces():
    assert last_boxed("a \\boxed{x} b \\boxed{\\frac{1}{\\sqrt{2}}} c") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{unclosed") is None


def test_format_judger():
    judger = get("format")
    assert judger.score("<think>hmm</think> <answer>4</answer>", "4") == 1.0
    assert judger.score("4", "4") == 0.0


def panel(*items, timeout=10.0):
    return Panel(JudgerConfig(reward_judger_configs=list(items), timeout=timeout))


def test_custom_judgers_load_by_name_sync_or_async():
    judges = panel(
        {"judger_name": "custom", "data_source": ["x"], "options": {"function": "helpers.judges:exact"}},
    )
    assert judges.judge("4", "x", "4").reward == 1.0
    async_judges = panel(
        {"judger_name": "custom", "data_source": ["x"], "options": {"function": "helpers.judges:exact_async"}},
    )
    assert [v.reward for v in async_judges.judge_many([("4", "x", "4", None), ("5", "x", "4", None)])] == [1.0, 0.0]
    with pytest.raises(UserError, match="cannot import it"):
        get("custom", function="helpers.judges:missing")


def test_a_judger_that_raises_hangs_or_returns_nonsense_scores_zero_and_is_counted():
    judges = panel(
        {"judger_name": "custom", "data_source": ["bug"], "options": {"function": "helpers.judges:broken"}},
        {"judger_name": "custom", "data_source": ["slow"], "options": {"function": "helpers.judges:sleepy"}},
        {"judger_name": "custom", "data_source": ["word"], "options": {"function": "helpers.judges:wordy"}},
        {"judger_name": "gsm8k", "data_source": ["ok"]},
        timeout=2.0,
    )
    started = time.perf_counter()
    verdicts = judges.judge_many(
        [("x", "bug", "1", None), ("x", "slow", "1", None), ("x", "word", "1", None), ("#### 1", "ok", "1", None)]
    )
    assert time.perf_counter() - started < 15
    assert [v.reward for v in verdicts] == [0.0, 0.0, 0.0, 1.0]
    assert "RuntimeError: judger bug" in verdicts[0].error
    assert "timeout" in verdicts[1].error
    assert "not a number" in verdicts[2].error
    assert verdicts[3].error is None
    # the panel still works after killing the stuck worker
    assert judges.judge("x", "bug", "1").reward == 0.0


def test_several_judgers_per_source_are_weighted_and_kept_apart():
    judges = panel(
        {"judger_name": "gsm8k", "data_source": ["s"], "weight": 1.0},
        {"judger_name": "format", "data_source": ["s"], "weight": 0.5, "options": {"pattern": ".*####.*"}},
    )
    verdict = judges.judge("#### 3", "s", "3")
    assert verdict.reward == 1.5 and verdict.scores == {"gsm8k": 1.0, "format": 1.0} and verdict.correct
    with pytest.raises(UserError, match="no judger scores data_source 'other'"):
        judges.judge("#### 3", "other", "3")


@pytest.mark.slow
def test_reward_model_scores_prompt_response_pairs_in_batches(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg, _ = tiny_model
    torch.manual_seed(0)
    classifier = AutoModelForSequenceClassification.from_pretrained(cfg.tiny_model.output_dir, num_labels=1)
    classifier.save_pretrained(tmp_path / "rm")
    AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir).save_pretrained(tmp_path / "rm")
    judger = get("reward_model", model_path=str(tmp_path / "rm"), batch_size=2)
    row = {"prompt": [{"role": "user", "content": "Ana has 3 apples. How many?"}]}
    responses = ["3 + 0 = 3\n#### 3", "#### 4", "I do not know"]
    together = judger.score_batch(responses, ["3"] * 3, [row] * 3)
    alone = [judger.score(r, "3", row) for r in responses]
    assert together == pytest.approx(alone, abs=1e-5)  # padding in a batch changes nothing
    assert len(set(round(s, 4) for s in together)) == 3  # a real model: different texts, different scores
    judges = panel(
        {"judger_name": "reward_model", "data_source": ["s"], "options": {"model_path": str(tmp_path / "rm")}}
    )
    verdicts = judges.judge_many([(r, "s", "3", row) for r in responses])
    assert [v.reward for v in verdicts] == pytest.approx(together, abs=1e-5)
