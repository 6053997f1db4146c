"""One policy update two ways, on the same micro-batches with the same loss from rlx.algo:

- ``rlx_update``: rlx's DeepSpeed trainer (``PolicyTrainer``) through the train stage's micro-batch loss;
- ``bare_update``: a plain HF model with ``torch.optim.AdamW``, the loop one would write by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlx.algo import advantages as adv
from rlx.algo.losses import aggregate, policy_loss
from rlx.config import RLTrainerConfig
from rlx.training.microbatch import Micro, micro_loss, prepare_micro_batches
from rlx.training.trainer import token_logprobs


def rollout_rows(prompts: list[list[int]], responses: list[list[int]], stop_ids: set[int]) -> list[dict]:
    """Rows shaped like the rollout stage's, for the train stage's micro-batching."""
    return [
        {
            "prompt_ids": list(prompt),
            "response_ids": list(response),
            "rollout_logprobs": [0.0] * len(response),
            "finish_reason": "stop" if response and response[-1] in stop_ids else "length",
            "prompt_len": len(prompt),
            "response_len": len(response),
        }
        for prompt, response in zip(prompts, responses, strict=True)
    ]


def prepare(config: RLTrainerConfig, rows: list[dict], rewards: torch.Tensor, trainer, tokenizer) -> list[Micro]:
    """The train stage's micro-batches of one mini-batch (old log-probs included), with GRPO advantages."""
    (micros,) = prepare_micro_batches(config, rows, trainer, SimpleNamespace(tokenizer=tokenizer))
    advantages = adv.compute("grpo", rewards, config.dataflow_config.prompt_repeat_k)
    for micro in micros:
        micro.advantages = advantages[micro.indices]
    return micros


def rlx_update(trainer, config: RLTrainerConfig, micros: list[Micro]) -> None:
    loss_cfg, total = config.train_worker_cfg.loss_cfg, 0.0
    temperature = config.dataflow_config.sample_params.temperature or 1.0
    for micro in micros:
        loss, values = micro_loss(
            trainer, micro, loss_cfg, temperature, config.dataflow_config.sample_params.max_tokens
        )
        trainer.backward(loss)
        total += values["loss"]
    trainer.optimizer_step(total)


def bare_optimizer(model, config: RLTrainerConfig) -> torch.optim.Optimizer:
    optim = config.train_worker_cfg.optim_cfg
    return torch.optim.AdamW(
        model.parameters(), lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
    )


def bare_update(model, optimizer, config: RLTrainerConfig, micros: list[Micro]) -> None:
    loss_cfg, clip = config.train_worker_cfg.loss_cfg, config.train_worker_cfg.loss_cfg.policy_loss_cfg
    options = {"global_tokens": micros[0].mini_tokens, "norm_length": config.dataflow_config.sample_params.max_tokens}
    model.train()
    for micro in micros:
        logp, entropy = token_logprobs(model, micro.batch, config.dataflow_config.sample_params)
        pg_loss, _ = policy_loss(
            logp,
            logp.detach() if micro.old_logp is None else micro.old_logp,  # on-policy: the live log-probs
            micro.advantages,
            micro.batch.mask,
            kind=clip.loss_type,
            cliprange_low=clip.cliprange_low,
            cliprange_high=clip.cliprange_high,
            clip_ratio_c=clip.clip_ratio_c,
            loss_agg_mode=loss_cfg.loss_agg_mode,
            **options,
        )
        entropy_term = aggregate(entropy, micro.batch.mask, loss_cfg.loss_agg_mode, **options)
        (pg_loss - loss_cfg.entropy_coef * entropy_term).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.train_worker_cfg.optim_cfg.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def update_tokens(rows: list[dict]) -> int:
    """Tokens in one update, counted as the train stage's ``perf/train_tokens_per_s`` counts them."""
    return sum(row["prompt_len"] + row["response_len"] for row in rows)
