"""The algorithm pieces the train stage uses, against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlx.algo import advantages, kl
from rlx.algo.losses import aggregate, policy_loss
from rlx.stages.train import micro_batches
from rlx.trainer import TokenBatch, lr_factor


def test_grpo_is_a_bessel_z_score_per_group_and_zero_for_equal_rewards():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    out = advantages.grpo(rewards, group_size=4, eps=0.0)
    std = math.sqrt(((0.5**2) * 4) / 3)
    assert torch.allclose(out[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / std)
    assert torch.equal(out[4:], torch.zeros(4))
    with pytest.raises(ValueError, match="group_size must be at least 2"):
        advantages.grpo(rewards, group_size=1)
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        advantages.grpo(rewards, group_size=3)


def test_clipped_loss_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old logp 0
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    loss, metrics = policy_loss(logp, old, torch.tensor([1.0]), mask, cliprange_low=0.2, cliprange_high=0.2)
    # A = 1: max(-r, -clip(r)) = -1.2 (clipped), -0.5, -1.0; mean = -0.9
    assert loss.item() == pytest.approx(-0.9)
    assert metrics["clipfrac"].item() == pytest.approx(1 / 3)
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, clip_ratio_c=3.0)
    # A = -1: max(r, clip(r)) = 1.5, 0.8, 1.0; dual clip min(., 3) leaves them; mean = 1.1
    assert loss.item() == pytest.approx(1.1)


def test_token_mean_over_micro_batches_equals_the_full_batch():
    torch.manual_seed(0)
    logp, old = torch.randn(6, 5), torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    adv = torch.randn(6)
    full, _ = policy_loss(logp, old, adv, mask)
    total = mask.sum()
    parts = [policy_loss(logp[s], old[s], adv[s], mask[s], global_tokens=total)[0] for s in (slice(0, 2), slice(2, 6))]
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-6)


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=5).item() == pytest.approx(10 / (2 * 5))


def test_k3_kl_is_zero_at_equal_policies_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0])
    assert torch.equal(kl.estimate(logp, logp, "k3"), torch.zeros(2))
    assert (kl.estimate(logp, logp - 0.5, "k3") > 0).all()
    assert kl.estimate(logp, logp - 0.5, "k1").tolist() == [0.5, 0.5]


def test_token_batch_marks_exactly_the_response_targets():
    batch = TokenBatch.from_ids([[5, 6, 7], [5]], [[8, 9], [8, 9, 10]], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 0]]
    # mask[t] = 1 where token t + 1 is a response token
    assert batch.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert batch.num_tokens == 5


def test_micro_batches_keep_order_and_the_token_budget():
    lengths = [10, 10, 30, 10, 50, 10]
    batches = micro_batches(list(range(6)), lengths, budget=40)
    assert [i for b in batches for i in b] == list(range(6))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 40 for b in batches)
    assert [4] in batches  # longer than the budget: alone


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    from rlx.config import LRConfig

    cosine = LRConfig(lr_type="cosine", warmup_ratio=0.1, lr_min=1e-5)
    factors = [lr_factor(cosine, step, 100, 1e-4) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1, abs=0.01)
    assert lr_factor(LRConfig(), 50, 100, 1e-4) == 1.0
