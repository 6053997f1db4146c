"""The distribution a rollout token was sampled from, scored where it was sampled from it.

With top-k or top-p (nucleus, Holtzman et al., 2020, arXiv 1904.09751), a rollout samples from the
policy cut to a support and renormalised over it, not from the policy. Scoring the sampled tokens under
the whole distribution, as the engine's log-probs and the trainer's would otherwise be, biases every
importance ratio by ``log S`` (the support's mass; TRL #6789, vLLM #42259); SkyRL (#2237) scores over
the sampled support instead. So both sides here take log-probs over the same cut: the sampler of the
distribution it drew from, the trainer of its own logits cut the same way, and the update is exactly
on-policy for the truncated policy. The cuts are transformers' ``TopKLogitsWarper`` then
``TopPLogitsWarper`` (what the sampler applies), over any number of leading dimensions.
"""

from __future__ import annotations

import torch


def cut_to_support(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``logits`` with every token outside the sampled support at -inf: the ``top_k`` largest (0: all),
    then the fewest of those, largest first, whose probability reaches ``top_p`` (1.0: all)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)
        below = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # the tail whose mass stays under 1 - p
        below[..., -1] = False  # the likeliest token always stays
        logits = logits.masked_fill(below.scatter(-1, order, below), float("-inf"))
    return logits


def support_log_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, sampled=None
) -> torch.Tensor:
    """Log-probs of the distribution sampled from: ``logits / temperature`` cut to the support and
    renormalised over it (-inf outside it). ``sampled`` (the tokens drawn, one per distribution) stay in
    the support: the trainer's logits, a float's rounding away from the engine's, may cut a token at its
    edge that the engine kept, whose log-prob would be -inf."""
    scaled = logits / temperature
    cut = cut_to_support(scaled, top_k, top_p)
    if sampled is not None:
        drawn = sampled.unsqueeze(-1)
        cut = cut.scatter(-1, drawn, scaled.gather(-1, drawn))
    return torch.log_softmax(cut, dim=-1)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """The entropy of each distribution, tokens outside the support (log-prob -inf) counting 0."""
    return -torch.where(log_probs.isinf(), 0.0, log_probs.exp() * log_probs).sum(dim=-1)
