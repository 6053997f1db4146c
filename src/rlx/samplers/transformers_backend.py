"""Rollout with ``transformers``' ``generate``: the CPU backend (and the reference the GPU one matches).

Token in, token out: prompts arrive as token ids and every response keeps its ids, its per-token
log-probs and why it ended, so the trainer never re-tokenizes text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import (
    LogitsProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlx.config import SampleParams
from rlx.samplers.types import Generation, row_seeds
from rlx.tokens import decode_many


def stop_ids(tokenizer: PreTrainedTokenizerBase, params: SampleParams) -> list[int]:
    """The tokenizer's EOS ids plus the configured stop ids, without duplicates."""
    eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return list(dict.fromkeys([*ids, *params.stop_token_ids]))


def is_greedy(params: SampleParams) -> bool:
    return not params.do_sample or params.temperature == 0


def generation_kwargs(tokenizer: PreTrainedTokenizerBase, params: SampleParams) -> dict:
    """``generate``'s options; sampling itself is :class:`RowSeededSampling`'s, so ``generate`` decodes
    greedily over the scores it leaves."""
    kwargs = {
        "max_new_tokens": params.max_tokens,
        "min_new_tokens": params.min_tokens,
        "do_sample": False,
        "eos_token_id": stop_ids(tokenizer, params),
        "pad_token_id": tokenizer.pad_token_id,
        "repetition_penalty": params.repetition_penalty,
        "return_dict_in_generate": True,
        "output_logits": True,
    }
    if params.stops:
        kwargs.update(stop_strings=list(params.stops), tokenizer=tokenizer)
    return kwargs


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[Sequence[int]],
    params: SampleParams,
    *,
    seed: int | Sequence[int],
    batch_size: int = 1024,
) -> list[Generation]:
    """Generate one response per prompt (repeat a prompt to sample a group); prompt ``i`` samples from
    seed ``seed + i`` (or ``seed[i]``) alone, so a response does not depend on the batch it was generated in.

    Log-probs are those of the distribution each token was sampled from: ``log_softmax(logits /
    temperature)`` (greedy: temperature 1), cut to the top-k / top-p support and renormalised where
    those are set (rlx.algo.support, which the trainer scores with too), and with any repetition
    penalty or min_tokens suppression in it (which the trainer cannot score: the config refuses them in
    training rollouts unless told they may be off-policy, and mismatch/* then says by how much).
    """
    kwargs = generation_kwargs(tokenizer, params)
    temperature = 1.0 if is_greedy(params) else params.temperature
    was_training = model.training
    model.eval()
    results: list[Generation] = []
    seeds = row_seeds(seed, len(prompt_ids))
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        sampling = None if is_greedy(params) else RowSeededSampling(params, seeds[start : start + len(chunk)])
        processors = [sampling] if sampling else []
        outputs = _generate_batch(model, tokenizer, chunk, {**kwargs, "logits_processor": processors}, temperature)
        results.extend(_generations(tokenizer, chunk, *outputs, sampling, params))
    model.train(was_training)
    return results


class RowSeededSampling(LogitsProcessor):
    """Sampling with one random stream per row: temperature, top-k and top-p as ``generate`` applies
    them, then the exponential race (Gumbel-max: ``argmax(p_i / E_i)``, ``E_i ~ Exp(1)``, picks ``i``
    with probability ``p_i``), each row drawing its ``E`` from its own seeded generator. A row's
    response then depends only on its prompt, the policy and its seed, not on the rows beside it:
    prompts dealt to one engine or to eight sample the same responses."""

    def __init__(self, params: SampleParams, seeds: Sequence[int]):
        self.seeds, self.generators = list(seeds), None
        self.sampled_logprobs: list[torch.Tensor] | None = [] if warped(params) else None
        self.warpers = [TemperatureLogitsWarper(params.temperature)]
        if params.top_k:
            self.warpers.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=params.top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.generators is None:
            self.generators = [torch.Generator(scores.device).manual_seed(seed) for seed in self.seeds]
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        race = torch.stack([torch.empty_like(scores[0]).exponential_(generator=g) for g in self.generators])
        race.clamp_(min=torch.finfo(race.dtype).tiny)  # a draw of exactly 0 would pick a token of probability 0
        raced = scores - race.log()  # greedy decoding takes the argmax: the row's sample
        if self.sampled_logprobs is not None:  # the processors before this one (penalty, min length) included
            picked = raced.argmax(dim=-1, keepdim=True)
            self.sampled_logprobs.append(torch.log_softmax(scores.float(), dim=-1).gather(-1, picked).squeeze(-1))
        return raced


def warped(params: SampleParams) -> bool:
    """Whether sampling departs from ``logits / temperature``: then the sampled log-probs are recorded as
    the tokens are drawn."""
    return bool(params.top_k) or params.top_p < 1.0 or params.repetition_penalty != 1.0 or params.min_tokens > 0


def _generate_batch(model, tokenizer, chunk, kwargs, temperature) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The new tokens of a batch, their log-probs under ``logits / temperature`` and the stop ids."""
    width = max(len(ids) for ids in chunk)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in chunk])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk])
    out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device), **kwargs)
    new_tokens = out.sequences[:, width:].cpu()
    logits = torch.stack(out.logits, dim=1).float().cpu() / temperature
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
    return new_tokens, token_logprobs, kwargs["eos_token_id"]


def _generations(tokenizer, chunk, new_tokens, token_logprobs, stop, sampling, params) -> list[Generation]:
    """Each row's response up to its end, with the log-probs it was sampled with."""
    if sampling is not None and sampling.sampled_logprobs is not None:
        token_logprobs = torch.stack(sampling.sampled_logprobs, dim=1).cpu()
    pad, stops = tokenizer.pad_token_id, set(stop)
    sampled = new_tokens.tolist()
    ends = [_response_length(response, stops, pad, params.max_tokens) for response in sampled]
    responses = [response[:length] for response, (length, _) in zip(sampled, ends, strict=True)]
    texts = decode_many(tokenizer, responses, params.skip_special_tokens)
    generations = [
        Generation(list(ids), response, text, token_logprobs[row, :length].tolist(), finish)
        for row, (ids, response, text, (length, finish)) in enumerate(zip(chunk, responses, texts, ends, strict=True))
    ]
    if params.stops:
        generations = [g.cut_at_stop_strings(params.stops) for g in generations]
    return generations


def _response_length(response: list[int], stops: set[int], pad: int, max_tokens: int) -> tuple[int, str]:
    """Where a response ends (its stop token included) and why: ``stop`` or ``length``."""
    for position, token in enumerate(response):
        if token in stops:
            return position + 1, "stop"
    # A batch runs until its longest member ends; shorter ones are padded afterwards.
    length = len(response)
    while length and response[length - 1] == pad and pad not in stops:
        length -= 1
    return length, "length" if length >= max_tokens else "stop"
