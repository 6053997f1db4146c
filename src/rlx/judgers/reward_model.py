"""A learned reward: a HF sequence-classification model scoring (prompt, response) pairs, batched.

The pair is rendered with the reward model's chat template (prompt messages, then the response as
the assistant's turn) when it has one, else as plain text. ``correct_score`` is the score from
which a response counts as correct in the metrics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


def messages_of(row: dict | None) -> list[dict]:
    prompt = (row or {}).get("prompt") or []
    return json.loads(prompt) if isinstance(prompt, str) else list(prompt)


@dataclass
class RewardModelJudger:
    model_path: str
    batch_size: int = 16
    max_length: int = 1024
    correct_score: float = 0.0
    in_process = True
    batched = True
    _loaded: tuple = field(default=(), init=False, repr=False)

    def model(self):
        if not self._loaded:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model = AutoModelForSequenceClassification.from_pretrained(self.model_path, dtype=torch.float32).eval()
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = tokenizer.pad_token_id
            self._loaded = (model, tokenizer)
        return self._loaded

    def render(self, tokenizer, response: str, row: dict | None) -> str:
        messages = messages_of(row)
        if tokenizer.chat_template:
            return tokenizer.apply_chat_template(
                [*messages, {"role": "assistant", "content": response}], tokenize=False
            )
        return "\n".join([*(m["content"] for m in messages), response])

    def extract(self, response: str) -> str | None:
        return None

    def score_batch(self, responses: list[str], golds: list[str], rows: list[dict | None] | None = None) -> list[float]:
        import torch

        model, tokenizer = self.model()
        rows = rows or [None] * len(responses)
        texts = [self.render(tokenizer, response, row) for response, row in zip(responses, rows, strict=True)]
        scores = []
        for start in range(0, len(texts), self.batch_size):
            batch = tokenizer(
                texts[start : start + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            )
            with torch.no_grad():
                scores.extend(model(**batch).logits[:, 0].float().tolist())
        return scores

    def score(self, response: str, gold: str, row: dict | None = None) -> float:
        return self.score_batch([response], [gold], [row])[0]
