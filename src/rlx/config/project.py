"""rlx additions: the synthetic task and the tiny base model the CPU demo makes (nothing is
downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rlx.config.fields import Section


class SyntheticTaskConfig(Section):
    """rlx addition: the arithmetic word-problem task the CPU demo trains on."""

    output_dir: Path = Field(Path("data/arith"), description="Where train/test parquet files are written.")
    train_size: int = Field(20000, gt=0, description="Number of training problems.")
    test_size: int = Field(200, gt=0, description="Number of held-out problems (never seen in training).")
    num_operands: int = Field(2, ge=2, le=4, description="Operands per problem: the main difficulty knob.")
    max_operand: int = Field(10, ge=2, description="Operands are drawn from 1..max_operand.")
    operations: list[Literal["+", "-", "*"]] = Field(["+", "-"], min_length=1, description="Allowed operations.")
    holdout_by: Literal["question", "arithmetic"] = Field(
        "question", description="What no held-out problem shares with training: its question or its arithmetic."
    )
    seed: int = Field(0, description="Generation seed; train and test are disjoint for any seed.")


class TinyModelConfig(Section):
    """rlx addition: architecture and supervised warm start of the tiny Qwen3 base model."""

    output_dir: Path = Field(Path("data/tiny-qwen3"), description="HF model folder written by `rlx init-model`.")
    metrics_path: Path = Field(Path("data/warm_start.json"), description="Warm-start metrics (a DVC metric).")
    vocab_size: int = Field(384, ge=64, description="Target size of the locally trained BPE vocabulary.")
    whole_numbers: bool = Field(
        False,
        description="Let BPE merge a number's digits into one token (as far as vocab_size allows) instead of one "
        "token per digit: copying a number is then copying a token, computing with it recalling a fact.",
    )
    hidden_size: int = Field(160, gt=0, description="Width of the tiny model.")
    intermediate_size: int = Field(480, gt=0, description="Width of its MLPs.")
    num_hidden_layers: int = Field(4, gt=0, description="Transformer layers.")
    num_attention_heads: int = Field(4, gt=0, description="Query heads; they divide hidden_size.")
    num_key_value_heads: int = Field(2, gt=0, description="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = Field(256, gt=0, description="Longest prompt plus response it can hold.")
    sft_steps: int = Field(200, ge=0, description="Supervised warm-start steps; few on purpose, so RL has room.")
    sft_batch_size: int = Field(64, gt=0, description="Solutions per warm-start step.")
    sft_lr: float = Field(3e-3, gt=0, description="Warm-start learning rate.")
    plain_answer_names: list[str] = Field(
        ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus"],
        description="Problems about these people get warm-start solutions that mostly ignore the '####' format.",
    )
    plain_answer_ratio: float = Field(
        0.8, ge=0, le=1, description="Share of those solutions ending 'The answer is N.' instead of '#### N'."
    )
    tool_call_ratio: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of warm-start solutions that call the `calculator` tool and answer with its result "
        "(rlx.tasks.calculator; configs/agent_calculator.yaml), so the model knows the call format before RL; 0: none.",
    )
    eval_max_tokens: int = Field(32, gt=0, description="Response budget when measuring held-out accuracy.")
    seed: int = Field(0, description="Seed of initialisation and warm start; same seed, same weights.")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        return self
