"""Prompt datasets: the synthetic task's splits and rows, and the GSM8K converter on the real file."""

from __future__ import annotations

import json

import datasets
import pytest

from conftest import DATA
from rlx.judgers import get as get_judger
from rlx.tasks import arith, gsm8k
from rlx.tasks.data import DataError, load_rows


def test_splits_never_share_a_question(demo_data):
    train, test = (
        load_rows(demo_data.synthetic_task.output_dir / "train.parquet"),
        load_rows(demo_data.synthetic_task.output_dir / "test.parquet"),
    )
    assert len(train) == demo_data.synthetic_task.train_size and len(test) == demo_data.synthetic_task.test_size
    questions = lambda rows: {row["prompt"][0]["content"] for row in rows}  # noqa: E731
    assert not questions(train) & questions(test)
    assert len(questions(test)) == len(test)


def test_arithmetic_holdout_keeps_every_held_out_computation_out_of_training():
    from rlx.config import SyntheticTaskConfig

    task = SyntheticTaskConfig(train_size=2000, test_size=100, holdout_by="arithmetic", max_operand=30)
    splits = arith.generate_splits(task)
    held_out = {p.key("arithmetic") for p in splits["test"]}
    assert not held_out & {p.key("arithmetic") for p in splits["train"]}


def test_generation_is_deterministic_and_seeded():
    from rlx.config import SyntheticTaskConfig

    task = SyntheticTaskConfig(train_size=300, test_size=30)
    assert arith.generate_splits(task) == arith.generate_splits(task)
    assert arith.generate_splits(task) != arith.generate_splits(task.model_copy(update={"seed": 1}))


def test_reference_solutions_are_correct_and_judged_correct(demo_data):
    judger = get_judger("arith")
    rows = load_rows(demo_data.synthetic_task.output_dir / "test.parquet")
    assert all(judger.score(r["extra_info"]["solution"], r["reward_model"]["ground_truth"]) == 1.0 for r in rows)
    assert all(int(r["reward_model"]["ground_truth"]) >= 0 for r in rows)
    assert {r["data_source"] for r in rows} == {arith.DATA_SOURCE}


def test_rows_load_with_the_datasets_library(demo_data, tmp_path):
    ds = datasets.load_dataset(
        "parquet", data_files=str(demo_data.synthetic_task.output_dir / "test.parquet"), cache_dir=str(tmp_path)
    )["train"]
    row = ds[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"][0]["role"] == "user" and "####" in row["prompt"][0]["content"]


def test_too_small_a_number_space_is_a_clear_error():
    from rlx.config import SyntheticTaskConfig
    from rlx.errors import UserError

    with pytest.raises(UserError, match="only .* distinct held-out"):
        arith.generate_splits(SyntheticTaskConfig(max_operand=2, test_size=100, train_size=10, holdout_by="arithmetic"))


def test_gsm8k_converts_the_real_test_set(tmp_path):
    out = gsm8k.convert(DATA / "gsm8k" / "test.jsonl", tmp_path / "gsm8k.parquet", "test")
    rows = load_rows(out)
    assert len(rows) == 1319
    assert all("," not in r["reward_model"]["ground_truth"] for r in rows)
    judger = get_judger("gsm8k")
    assert sum(judger.score(r["extra_info"]["solution"], r["reward_model"]["ground_truth"]) for r in rows) == 1319


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"data_source": "x", "prompt": "not a list", "reward_model": {"ground_truth": "1"}}\n',
         "row 0: 'prompt' must be a non-empty list"),
        (b'{"prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": "1"}}\n',
         "row 0: missing column 'data_source'"),
        (b'{"data_source": "x", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": ""}}\n',
         "row 0: empty 'reward_model.ground_truth'"),
        (b'{"data_source": "x"\n', ":1: not valid JSON"),
        (b"\xff\xfe\n", "not UTF-8 text"),
        (b"", "the dataset is empty"),
    ],
    ids=["prompt not a list", "no data_source", "empty gold", "bad json", "not utf-8", "empty"],
)  # fmt: skip
def test_broken_rows_are_reported_by_file_and_row(tmp_path, content, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message.replace("(", r"\(")):
        load_rows(path)


def test_missing_dataset_names_the_path(tmp_path):
    with pytest.raises(DataError, match="no such dataset file"):
        load_rows(tmp_path / "absent.parquet")


def test_the_prompt_pool_is_tokenized_once_per_process_and_made_again_when_its_data_change(untrained_model, tmp_path):
    """`rlx fit` checks the pool before the run (rlx.run.preflight) and runs from it: one tokenization, but
    never a pool of files that have changed since."""
    from rlx import config
    from rlx.tasks.data import PromptPool
    from rlx.tokens import prompt_ids
    from rlx.training.loading import load_tokenizer

    cfg, _ = untrained_model
    tokenizer = load_tokenizer(cfg.tiny_model.output_dir, cfg.tiny_model.output_dir)
    prompts = [[{"role": "user", "content": f"{n} + 1"}] for n in range(4)]
    rows = [
        json.dumps({"data_source": "rlx/arith", "prompt": p, "reward_model": {"ground_truth": "1"}}) for p in prompts
    ]
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(rows[:3]) + "\n")
    run = config.load(None, [f"replay_buffer_config.dataset_cfg=[{{name: t, anno_path: {data}}}]"])
    pool = PromptPool.load(run, tokenizer)
    assert PromptPool.load(run, tokenizer) is pool
    assert [r["prompt_ids"] for r in pool.rows] == [prompt_ids(tokenizer, p) for p in prompts[:3]]  # as one by one
    data.write_text("\n".join(rows) + "\n")
    assert len(PromptPool.load(run, tokenizer).rows) == 4
