"""The tiny base model: deterministic, loadable with transformers, and partially trained."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import PARAMS, demo_config
from rlx.cli import main
from rlx.store.targets import metrics_mark
from rlx.tasks.arith import write_dataset
from rlx.tasks.data import load_rows
from rlx.tasks.tiny_model import build, greedy_accuracy, train_tokenizer
from rlx.tokens import prompt_ids

pytestmark = pytest.mark.slow


def test_same_seed_builds_identical_weights_and_tokenizer(tmp_path):
    files = []
    for attempt in ("a", "b"):
        cfg = demo_config(
            tmp_path / attempt,
            "synthetic_task.train_size=600",
            "synthetic_task.test_size=20",
            "tiny_model.sft_steps=4",
            "tiny_model.sft_batch_size=16",
        )
        write_dataset(cfg.synthetic_task)
        build(cfg)
        files.append(cfg.tiny_model.output_dir)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (files[0] / name).read_bytes() == (files[1] / name).read_bytes(), name


def test_whole_numbers_makes_each_number_one_token_wherever_it_stands():
    """The agent demo's tokenizer: a number is the same single token in the question, the tool call and the
    answer (no space attached), so copying it is copying a token; the default keeps one token per digit."""
    texts = [
        f"Mo has {a} cards. Then Mo buys {b} more.\n{a} + {b} = {a + b}\n#### {a + b}"
        for a in range(1, 60)
        for b in (7, 35)
    ]
    numbers = lambda tokenizer, text: [t for t in tokenizer.tokenize(text) if t.strip("Ġ").isdigit()]  # noqa: E731
    whole = train_tokenizer(texts, 512, whole_numbers=True)
    assert numbers(whole, "Mo has 42 cards.") == numbers(whole, '{"expression": "42 + 7"}')[:1] == ["42"]
    assert numbers(whole, "#### 77") == numbers(whole, "tool\n77") == ["77"]
    assert numbers(train_tokenizer(texts, 512), "Mo has 42 cards.") == ["4", "2"]


def test_loads_with_auto_classes_and_generates(tiny_model):
    cfg, _ = tiny_model
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir)
    model = AutoModelForCausalLM.from_pretrained(cfg.tiny_model.output_dir)
    assert model.config.model_type == "qwen3"
    assert 1_000_000 <= model.num_parameters() <= 5_000_000
    assert tokenizer.padding_side == "left" and tokenizer.chat_template
    row = load_rows(cfg.synthetic_task.output_dir / "test.parquet")[0]
    ids = torch.tensor([prompt_ids(tokenizer, row["prompt"])])
    out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "####" in text  # the warm start taught the answer format


def test_warm_start_accuracy_is_partial_and_reproducible(tiny_model):
    cfg, metrics = tiny_model
    assert json.loads(cfg.tiny_model.metrics_path.read_text()) == {**metrics_mark("rlx init-model"), **metrics}
    # Well above 0 and well below 100%: RL has something to start from and room to improve.
    assert 0.10 <= metrics["held_out_accuracy"] <= 0.60, metrics
    model = AutoModelForCausalLM.from_pretrained(cfg.tiny_model.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir)
    rows = load_rows(cfg.synthetic_task.output_dir / "test.parquet")
    assert greedy_accuracy(model, tokenizer, rows, "arith", cfg.tiny_model.eval_max_tokens) == pytest.approx(
        metrics["held_out_accuracy"]
    )


def test_init_model_without_data_says_how_to_make_it(tmp_path, capsys):
    cfg_args = [
        f"synthetic_task.output_dir={tmp_path / 'none'}",
        f"tiny_model.output_dir={tmp_path / 'm'}",
        f"tiny_model.metrics_path={tmp_path / 'm.json'}",
    ]
    with pytest.raises(SystemExit) as exited:
        main(["init-model", str(PARAMS), *sum((["-S", a] for a in cfg_args), [])])
    assert exited.value.code == 2
    assert "no such dataset file" in capsys.readouterr().err
