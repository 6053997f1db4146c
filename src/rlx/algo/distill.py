"""On-policy distillation's per-token advantage: the negative reverse KL to a teacher, estimated on the
tokens the student sampled, mixed with the reward's per-response advantage.

Tensors are laid out as the trainer's log-probs, ``[batch, T - 1]``, with ``mask`` 1 at each token the
model sampled. The result goes through the policy losses like any per-token advantage (rlx.algo.losses
broadcasts a ``[batch]`` one), so the clip, rollout correction, LoRA, agents and several workers apply.
"""

from __future__ import annotations

import torch


def reverse_kl_advantages(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """``-kl_coef * (log p_student - log p_teacher)`` at each sampled token, 0 elsewhere: the single-sample
    estimate of the per-token reverse KL, as a reward with no discount (Gu et al., 2024, MiniLLM; Agarwal et
    al., 2024, GKD; Thinking Machines, "On-Policy Distillation", 2025). Where the teacher gives a token more
    probability than the student, its advantage is positive."""
    return -kl_coef * (student_logp - teacher_logp) * mask


def mixed_advantages(
    reward_advantages: torch.Tensor, distill: torch.Tensor, mask: torch.Tensor, reward_coef: torch.Tensor | float
) -> torch.Tensor:
    """Per token, ``reward_coef`` x the response's reward advantage plus the distillation advantage
    (``reward_coef`` a number, or one per response)."""
    coef = torch.as_tensor(reward_coef, dtype=distill.dtype)
    coef = coef.unsqueeze(-1) if coef.dim() else coef
    return coef * reward_advantages.unsqueeze(-1).to(distill.dtype) * mask + distill
