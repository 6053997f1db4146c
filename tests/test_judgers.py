"""Judgers on the real benchmarks and on the tricky cases, and a panel that never crashes a run."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from conftest import DATA, PARAMS, ROOT
from rlx.config import JudgerConfig, load, preset_overrides
from rlx.errors import UserError
from rlx.judgers import Panel, available, batch_scores, get, score_batch
from rlx.judgers.math import last_boxed
from rlx.judgers.numeric import to_number
from rlx.judgers.rows import judge_rows
from rlx.stages.evaluate import dataset_panel


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


GSM8K = read_jsonl(DATA / "gsm8k" / "test.jsonl")
MATH500 = read_jsonl(DATA / "math500" / "test.jsonl")


def gsm8k_gold(row):
    return row["answer"].rpartition("####")[2].strip().replace(",", "")


def test_available_lists_every_judger():
    assert available() == ["arith", "custom", "environment", "format", "gsm8k", "math", "reward_model"]
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


@pytest.mark.parametrize("extraction", ["math_verify", "boxed"])
def test_math500_reference_solutions_score_with_math_verify(extraction):
    judger = get("math", extraction=extraction)
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


def math_verify_says(response: str, gold: str, **options) -> bool:
    """math-verify's own verdict, called as its README and test suite call it: the gold as written
    (LaTeX inside its math environment), both texts read with the box first, then plain expressions."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return verify(parse(gold, targets), parse(response, targets), **options)


BOXES_FAR_APART = (
    r"First I got \boxed{4}. Checking the second condition again, which I skipped above, the count is in fact "
    r"\boxed{6}."
)
GOLD_WITH_TWO_BOXES = (
    r"\boxed{1} was a slip, as the second equation shows once we substitute it back; the answer is \boxed{2}"
)

# (response, gold, expected): each answer form once right and, where it teaches something, once wrong.
MATH_CASES = [
    # a fraction against a plain-text gold
    (r"The ratio is $\frac{7}{4}$.", "7/4", 1.0),
    (r"The ratio is $\frac{7}{4}$.", "-7/4", 0.0),
    # every math environment, no box needed
    (r"So the total is $ 42 $", "$42$", 1.0),
    (r"we get \( 42 \) apples", "$42$", 1.0),
    (r"Hence \[ 42 \]", "$42$", 1.0),
    (r"Hence $$ 42 $$", "$42$", 1.0),
    (r"Hence $$ 41 $$", "$42$", 0.0),
    # fraction spellings, malformed or not
    (r"$\frac25 $", "$2/5$", 1.0),
    (r"$\dfrac{2}{5}$", "$2/5$", 1.0),
    (r"$\tfrac{2}{5}$", "$2/5$", 1.0),
    (r"$\cfrac{2}{5}$", "$2/5$", 1.0),
    # radicals
    (r"$\sqrt7$", r"$\sqrt{7}$", 1.0),
    (r"$\sqrt7$", r"$\sqrt{17}$", 0.0),
    (r"$\sqrt{8}$", r"$2\sqrt{2}$", 1.0),
    # equations: the value after the last '='
    (r"the slope is $m = \frac{2}{5}$", r"$\frac25$", 1.0),
    (r"Solving, $x = -4$.", "$-4$", 1.0),
    (r"Solving, $x = 4$.", "$-4$", 0.0),
    # units in text
    (r"The rope is $12 \text{ cm}$ long.", "$12$", 1.0),
    (r"The rope is $\frac{3}{4} \text{meters}$ long.", "$3/4$", 1.0),
    # percent
    ("about 35 percent", r"$35\%$", 1.0),
    ("about 35 percent", "$0.35$", 1.0),
    # intervals
    (r"$(-2, 5]$", r"$(-2,5]$", 1.0),
    (r"$[-2, 5]$", r"$(-2,5]$", 0.0),
    (r"$x \in (-\infty, 3)$", r"$(-\infty,3)$", 1.0),
    # sets: order does not matter, members do
    (r"$\{3, 1, 2\}$", r"$\{1,2,3\}$", 1.0),
    (r"$\{3, 1\}$", r"$\{1,2,3\}$", 0.0),
    # tuples: order matters
    (r"$(1, -3)$", r"$(1,-3)$", 1.0),
    (r"$(-3, 1)$", r"$(1,-3)$", 0.0),
    # \left( \right)
    (r"$\left( 2, \frac{\pi}{3} \right)$", r"$(2, \frac{\pi}{3})$", 1.0),
    (r"$\left( 2, \frac{\pi}{6} \right)$", r"$(2, \frac{\pi}{3})$", 0.0),
    # matrices and vectors
    (r"$\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}$", r"$\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}$", 1.0),
    (r"$\begin{pmatrix} 1 & 2 \\ 4 & 3 \end{pmatrix}$", r"$\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}$", 0.0),
    (r"$\begin{pmatrix} 2 \\ -1 \end{pmatrix}$", r"$\begin{pmatrix} 2 \\ -1 \end{pmatrix}$", 1.0),
    # degrees
    (r"The angle is $45^\circ$.", r"$45^\circ$", 1.0),
    (r"The angle is $45^{\circ}$.", "$45$", 1.0),
    (r"The angle is $50^\circ$.", r"$45^\circ$", 0.0),
    # thousands separators and negative numbers, outside LaTeX
    ("The town has 12,500 people.", "12500", 1.0),
    ("The town has 12,500 people.", "1250", 0.0),
    ("$-17$", "-17", 1.0),
    ("$17$", "-17", 0.0),
    # a gold with several answers
    (r"\boxed{3, -1}", "$-1, 3$", 1.0),
    (r"The roots are $\boxed{-1}$ and $\boxed{3}$.", "$-1, 3$", 1.0),
    (r"\boxed{3}", "$-1, 3$", 0.0),
    # several boxes in a response: far apart, the last counts; side by side, they are one answer
    (BOXES_FAR_APART, "$6$", 1.0),
    (r"\boxed{4}, \boxed{6}", "$6$", 0.0),
    # a gold text with two boxes far apart means its last one (rlx used to wrap it in $...$: both)
    (r"$\boxed{1,2}$", GOLD_WITH_TWO_BOXES, 0.0),
    (r"$\boxed{2}$", GOLD_WITH_TWO_BOXES, 1.0),
    # symbols, complex numbers, decimals, text answers, nested braces, no answer
    ("Final answer: $p - q$", "$p-q$", 1.0),
    ("$6 - 5i$", "$6-5i$", 1.0),
    ("$0.5$", r"$\frac{1}{2}$", 1.0),
    (r"$\text{Tuesday}$", r"$\text{Tuesday}$", 1.0),
    (r"so \boxed{\frac{a}{\sqrt{b}}}", r"$\frac{a}{\sqrt{b}}$", 1.0),
    ("I am not sure.", "$5$", 0.0),
    ("", "$5$", 0.0),
]


@pytest.mark.parametrize(("response", "gold", "expected"), MATH_CASES)
def test_math_judger_decides_each_answer_form_as_math_verify_does(response, gold, expected):
    assert math_verify_says(response, gold) == bool(expected)  # a case math-verify itself decides so
    assert get("math").score(response, gold) == expected


@pytest.mark.parametrize(
    ("response", "bare_gold"),
    [
        (r"so $\frac{14}{3}$", r"\frac{14}{3}"),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
        (r"the roots are \boxed{-2, 1}", "-2,1"),
        ("it is 1.22", "1,22"),
        (r"\boxed{3, 7, 5}", "3, 5, 7"),
        (r"It costs $\$18.90$.", r"\$18.90"),
    ],
)
def test_a_bare_gold_is_read_inside_a_math_environment_and_a_bare_number_also_as_a_number(response, bare_gold):
    """MATH's golds carry no math environment: read in one, as math-verify needs for LaTeX. A bare
    number is also read as math-verify reads numbers (``1,22`` is 1.22 there, ``-2,1`` two roots in MATH)."""
    as_number = math_verify_says(response, bare_gold)
    assert get("math").score(response, bare_gold) == 1.0
    assert math_verify_says(response, f"${bare_gold}$") or as_number


def test_a_gold_with_its_own_math_environment_is_parsed_as_it_is():
    assert get("math").score("$[0,1)$", "$[0,1)$") == 1.0
    assert get("math").score("$[0,1]$", "$[0,1)$") == 0.0


@pytest.mark.parametrize(
    ("response", "gold", "default", "boxed"),
    [
        ("Answer $ 9 $", "9", 1.0, 0.0),  # no box: nothing to read
        (r"\boxed{4}, \boxed{6}", "6", 0.0, 1.0),  # only the last box
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", 1.0, 1.0),
        (r"so \boxed{7} \boxed{unclosed", "7", 1.0, 0.0),
    ],
)
def test_boxed_mode_reads_only_the_last_box(response, gold, default, boxed):
    judger = get("math", extraction="boxed")
    assert (get("math").score(response, gold), judger.score(response, gold)) == (default, boxed)
    box = last_boxed(response)
    assert boxed == float(box is not None and math_verify_says(f"\\boxed{{{box}}}", f"${gold}$"))


def test_boxed_mode_can_read_an_answer_pattern_instead():
    judger = get("math", extraction="boxed", answer_pattern=r"ANSWER: (.+)")
    assert judger.score(r"ANSWER: \frac12", "1/2") == 1.0 and judger.extract(r"ANSWER: \frac12") == r"\frac{1}{2}"
    assert judger.score(r"\boxed{\frac12}", "1/2") == 0.0


@pytest.mark.parametrize(
    ("response", "gold", "options"),
    [
        ("$0.667$", r"$\frac23$", {"float_rounding": 2}),
        ("$g(s)$", "$g(t)$", {"strict": False}),
        ("$1 < x < 4$", "$(1,4)$", {"allow_set_relation_comp": True}),
    ],
)
def test_verify_options_are_math_verify_s_with_its_defaults(response, gold, options):
    assert get("math").score(response, gold) == float(math_verify_says(response, gold)) == 0.0
    assert get("math", **options).score(response, gold) == float(math_verify_says(response, gold, **options)) == 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"extraction": "last"}, "option extraction must be one of math_verify, boxed; got 'last'"),
        ({"float_rounding": -1}, "option float_rounding must be an integer of at least 0; got -1"),
        ({"float_rounding": "6"}, "option float_rounding must be an integer of at least 0; got '6'"),
        ({"tail_chars": 0}, "option tail_chars must be an integer of at least 1; got 0"),
        ({"strict": "yes"}, "option strict must be true or false; got 'yes'"),
        ({"allow_set_relation_comp": 1}, "option allow_set_relation_comp must be true or false; got 1"),
        ({"correct_score": "1"}, "option correct_score must be a number; got '1'"),
        ({"answer_pattern": "(.+)"}, "answer_pattern needs extraction 'boxed'"),
        ({"extraction": "boxed", "answer_pattern": "(.+"}, "answer_pattern is not a regular expression"),
        ({"extraction": "boxed", "answer_pattern": "ANSWER"}, "answer_pattern must be a regex with exactly one group"),
        ({"precision": 6}, "judger 'math': bad options"),
    ],
)
def test_bad_math_options_are_refused_in_one_line_naming_the_option(options, message):
    with pytest.raises(UserError, match=re.escape(message)):
        get("math", **options)


def test_the_extracted_answer_is_what_math_verify_read():
    judges = panel({"judger_name": "math", "data_source": ["m"]})
    rows = [
        {"response_text": "Answer \\( 9 \\)", "data_source": "m", "ground_truth": "9"},
        {"response_text": r"so $k = \frac13$", "data_source": "m", "ground_truth": r"\frac{1}{3}"},
        {"response_text": "no idea", "data_source": "m", "ground_truth": "9"},
    ]
    judged = judge_rows(judges, rows, "response_text")
    assert [(j["extracted"], j["correct"]) for j in judged] == [("9", True), (r"k = \frac{1}{3}", True), (None, False)]


def test_the_math500_preset_trains_on_the_box_and_evaluates_as_math_verify():
    config = load(PARAMS, preset_overrides(ROOT / "configs" / "tasks" / "math500.yaml"))
    (training,) = Panel(config.judger_config).seats
    rows = [{"data_source": "HuggingFaceH4/MATH-500"}]
    (evaluation,) = dataset_panel(config, config.evaluator_config.dataset_cfg[0], rows).seats
    assert (training.judger.extraction, evaluation.judger.extraction) == ("boxed", "math_verify")


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


class Batched:
    """A batched judger (as the reward model is) whose scores are given."""

    def __init__(self, scores):
        self.scores = scores

    def score_batch(self, responses, golds, rows):
        return self.scores


def test_a_batched_judger_s_bad_score_costs_only_its_own_response():
    scores = [1.5, float("nan"), 2e6, -3, np.float32(0.25), "0.5"]  # numpy's scalars are numbers, text is not
    outcomes = batch_scores(Batched(scores), [("r", "s", "g", None)] * len(scores))
    assert [score for score, _, _ in outcomes] == [1.5, 0.0, 0.0, -3.0, 0.25, 0.0]
    assert [error for _, _, error in outcomes] == [
        None, "ValueError: returned nan, not a finite score within +-1e+06",
        "ValueError: returned 2000000.0, not a finite score within +-1e+06", None, None,
        "TypeError: returned '0.5', not a number",
    ]  # fmt: skip
    short = batch_scores(Batched([1.0]), [("r", "s", "g", None)] * 2)
    assert [error for _, _, error in short] == ["ValueError: returned 1 scores for 2 responses"] * 2


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


class Hanging:
    """An in-process judger that hangs on one answer."""

    in_process, correct_score = True, 1.0

    def score(self, response, gold, row=None):
        if response == "hang":
            time.sleep(30)
        return float(response == gold)

    def extract(self, response):
        return response


def test_an_in_process_judger_past_the_timeout_scores_zero_and_is_counted():
    from dataclasses import replace

    judges = panel({"judger_name": "gsm8k", "data_source": ["s"]}, timeout=0.5)
    judges.seats = [replace(seat, judger=Hanging()) for seat in judges.seats]
    started = time.perf_counter()
    verdicts = judges.judge_many([("4", "s", "4", None), ("hang", "s", "4", None), ("4", "s", "4", None)])
    assert time.perf_counter() - started < 5
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0]  # the one after it is judged by a fresh thread
    assert verdicts[1].error == "gsm8k: timeout: no score within 0.5 s" and verdicts[2].error is None
