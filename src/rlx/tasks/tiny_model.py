"""The tiny base model of the CPU demo, made here instead of downloaded.

``build`` trains a byte-level BPE tokenizer on the task's text (digits kept one per token, so
arithmetic is learnable), creates a Qwen3-architecture model, and warm-starts it with a short
supervised pass on reference solutions. The pass is short on purpose: RL from a random init learns
nothing (every group has the same zero reward), while a half-trained model leaves RL room to improve.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import jinja2
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from rlx.config import RLTrainerConfig, SampleParams, TinyModelConfig
from rlx.judgers import get as get_judger
from rlx.phases import Phase
from rlx.samplers.transformers_backend import generate
from rlx.store.artifacts import atomic_dir, write_text
from rlx.store.targets import FOLDER_MARK, folder_mark, metrics_mark
from rlx.tasks.calculator import call_text, expression, tool_example
from rlx.tasks.data import load_rows
from rlx.tokens import prompt_ids

PAD, BOS_TURN, EOS_TURN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, whole_numbers: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE with a Qwen-style chat template. Its digits never merge, so arithmetic is
    learnable digit by digit; with ``whole_numbers`` a number is split from the text around it (never
    from its digits) and BPE merges it whole as far as ``vocab_size`` allows: copying a number is then
    copying one token, and computing with it recalling a fact per pair of numbers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=not whole_numbers), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS_TURN, EOS_TURN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TURN,
        pad_token=PAD,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1_000_000,
    )


def create_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def chat_text(messages: list[dict]) -> str:
    """The prompt as the chat template renders it, before a tokenizer exists (to train one on it)."""
    return jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)


def plain_answer(solution: str) -> str:
    """The solution with its final ``#### N`` line said in words instead: ``The answer is N.``"""
    *work, last = solution.split("\n")
    return "\n".join([*work, f"The answer is {last.removeprefix('####').strip()}."])


def sft_example(tokenizer, row: dict, plain: bool) -> tuple[list[int], list[int]]:
    """(input ids, labels) for one row: the loss covers only the answer and its end-of-turn token."""
    prompt = prompt_ids(tokenizer, row["prompt"])
    solution = row["extra_info"]["solution"]
    text = plain_answer(solution) if plain else solution
    answer = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt + answer, [-100] * len(prompt) + answer


def answers_plainly(row: dict, cfg: TinyModelConfig, rng: random.Random) -> bool:
    """Whether this warm-start example ends in words: mostly so for problems about the people in
    ``plain_answer_names`` (the question's first word), never for the others."""
    person = row["prompt"][-1]["content"].split(" ", 1)[0]
    return person in cfg.plain_answer_names and rng.random() < cfg.plain_answer_ratio


def warm_example(tokenizer, row: dict, cfg: TinyModelConfig, rng: random.Random) -> tuple[list[int], list[int]]:
    """One warm-start example: with probability ``tool_call_ratio`` a rollout that calls the calculator
    (rlx.tasks.calculator), else the worked solution (ending in words for some people, answers_plainly).
    The draws happen only where the config asks for them, so a config without them builds what it did."""
    if cfg.tool_call_ratio and rng.random() < cfg.tool_call_ratio:
        return tool_example(tokenizer, prompt_ids(tokenizer, row["prompt"]), row["extra_info"]["solution"])
    return sft_example(tokenizer, row, answers_plainly(row, cfg, rng))


def warm_start(model, tokenizer, rows: list[dict], cfg: TinyModelConfig) -> list[float]:
    """Supervised pass over reference solutions with AdamW and a cosine schedule; returns losses.

    For problems about some people, the solutions mostly end "The answer is N." instead of the
    "#### N" the prompt asks for. The base model therefore ignores the requested format for those
    problems, as instruction-tuned models often do, yet still writes "####" now and then: a real,
    quickly learnable reward signal for RL on top of the arithmetic it can sharpen.
    """
    order = random.Random(cfg.seed)
    examples = [warm_example(tokenizer, row, cfg, order) for row in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    warmup = max(1, cfg.sft_steps // 10)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.sft_steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    losses, phase = [], Phase("warm start of the demo model (tiny_model.sft_steps)", cfg.sft_steps)
    for _ in range(cfg.sft_steps):
        batch = order.sample(examples, cfg.sft_batch_size)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        attention_mask = (labels != -100) | (input_ids != tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask.long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        phase.advance()
    model.eval()
    return losses


def greedy_accuracy(model, tokenizer, rows: list[dict], judger_name: str, max_tokens: int) -> float:
    """Fraction of rows whose greedy answer the judger scores as correct."""
    judger = get_judger(judger_name)
    params = SampleParams(temperature=0.0, do_sample=False, max_tokens=max_tokens)
    outputs = generate(model, tokenizer, [prompt_ids(tokenizer, row["prompt"]) for row in rows], params, seed=0)
    golds = [row["reward_model"]["ground_truth"] for row in rows]
    scores = [judger.score(out.text, gold) for out, gold in zip(outputs, golds, strict=True)]
    return sum(scores) / len(scores)


def build(config: RLTrainerConfig) -> dict:
    """Build, warm-start, evaluate and save the tiny model; return its metrics (also saved)."""
    cfg, task = config.tiny_model, config.synthetic_task
    train_rows = load_rows(task.output_dir / "train.parquet")
    test_rows = load_rows(task.output_dir / "test.parquet")
    corpus = [
        tokenizer_text
        for row in train_rows
        for tokenizer_text in (chat_text(row["prompt"]), row["extra_info"]["solution"])
    ]
    if cfg.tool_call_ratio:  # the calls' text too, so that a call is a few tokens
        corpus += [call_text(expression(row["extra_info"]["solution"])) for row in train_rows]
    tokenizer = train_tokenizer(corpus, cfg.vocab_size, cfg.whole_numbers)
    model = create_model(cfg, tokenizer)
    losses = warm_start(model, tokenizer, train_rows, cfg)
    accuracy = greedy_accuracy(model, tokenizer, test_rows, "arith", cfg.eval_max_tokens)
    metrics = {
        "held_out_accuracy": accuracy,
        "sft_final_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
    }
    save(model, tokenizer, cfg.output_dir)
    write_text(json.dumps({**metrics_mark("rlx init-model"), **metrics}, indent=2) + "\n", cfg.metrics_path)
    return metrics


def save(model, tokenizer, output_dir: Path) -> None:
    """The model folder, written whole under a temporary name first."""
    with atomic_dir(Path(output_dir)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_text(folder_mark("rlx init-model"), tmp / FOLDER_MARK)
