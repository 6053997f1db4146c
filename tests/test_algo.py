"""The algorithm pieces the train stage uses, against values computed by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlx.algo import advantages, kl, registry
from rlx.algo.losses import aggregate, policy_loss
from rlx.config import ConfigError
from rlx.training.packing import micro_batches
from rlx.training.trainer import TokenBatch, lr_factor, token_logprobs


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
    # A = 1: max(-r, -clip(r)) = -1.2 (clipped at 1 + high), -0.5, -1.0; mean = -0.9
    assert loss.item() == pytest.approx(-0.9)
    assert [metrics[f"clipfrac{part}"].item() for part in ("", "_low", "_high", "_dual")] == pytest.approx(
        [1 / 3, 0, 1 / 3, 0]
    )
    loss, metrics = policy_loss(logp, old, torch.tensor([-1.0]), mask, clip_ratio_c=3.0)
    # A = -1: max(r, clip(r)) = 1.5, 0.8 (clipped at 1 - low), 1.0; dual clip min(., 3) leaves them; mean = 1.1
    assert loss.item() == pytest.approx(1.1)
    assert [metrics[f"clipfrac{part}"].item() for part in ("", "_low", "_high", "_dual")] == pytest.approx(
        [1 / 3, 1 / 3, 0, 0]
    )


RATIOS = torch.tensor([[1.2, 1.4, 0.85], [0.85, 1.2, 4.0]])  # against old logp 0; row 0 A = +1, row 1 A = -1


@pytest.mark.parametrize(("low", "high", "expected"), [
    # A = +1: -1.2, -1.3 (upper clip), -0.85; A = -1: 0.9 (lower clip), 1.2, min(4, 3) = 3 (dual clip)
    (0.1, 0.3, {"loss": 1.75 / 6, "clipfrac": 3 / 6, "clipfrac_low": 1 / 6, "clipfrac_high": 1 / 6, "clipfrac_dual": 1 / 6}),
    # swapped: A = +1: -1.1, -1.1 (both at the upper clip), -0.85; A = -1: 0.85, 1.2, 3 (dual clip)
    (0.3, 0.1, {"loss": 2.0 / 6, "clipfrac": 3 / 6, "clipfrac_low": 0, "clipfrac_high": 2 / 6, "clipfrac_dual": 1 / 6}),
])  # fmt: skip
def test_vanilla_asymmetric_bounds_act_on_their_own_side(low, high, expected):
    loss, metrics = policy_loss(
        RATIOS.log(), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3),
        cliprange_low=low, cliprange_high=high, clip_ratio_c=3.0,
    )  # fmt: skip
    assert {"loss": loss.item(), **{name: metrics[name].item() for name in expected if name != "loss"}} == (
        pytest.approx(expected)
    )


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.1, 0.3, (-0.15, 0.5, 0.0)),  # A = +1: s = 1.2 inside; A = -1: s = 0.85 clipped to 0.9
        (0.3, 0.1, (-0.125, 0.0, 0.5)),  # A = +1: s = 1.2 clipped to 1.1; A = -1: s = 0.85 inside
    ],
)
def test_gspo_asymmetric_bounds_act_on_the_sequence_ratio(low, high, expected):
    logp = torch.log(torch.tensor([[1.2, 1.2], [0.85, 0.85]]))
    loss, metrics = policy_loss(
        logp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), kind="gspo",
        cliprange_low=low, cliprange_high=high, loss_agg_mode="seq-mean-token-mean",
    )  # fmt: skip
    got = (loss.item(), metrics["clipfrac_low"].item(), metrics["clipfrac_high"].item())
    assert got == pytest.approx(expected)
    assert metrics["clipfrac_dual"].item() == 0


@pytest.mark.parametrize(("low", "high", "weights", "fractions"), [
    (0.1, 0.3, [1.2, 0.9], (0.0, 0.5)),  # ratio 0.85 truncated to 0.9 at the lower bound
    (0.3, 0.1, [1.1, 0.85], (0.5, 0.0)),  # ratio 1.2 truncated to 1.1 at the upper bound
])  # fmt: skip
def test_cispo_asymmetric_bounds_truncate_the_weight_on_their_own_side(low, high, weights, fractions):
    logp = torch.log(torch.tensor([[1.2, 0.85]])).requires_grad_()
    loss, metrics = policy_loss(
        logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), kind="cispo",
        cliprange_low=low, cliprange_high=high,
    )  # fmt: skip
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-weights[0] / 2, -weights[1] / 2])
    assert (metrics["clipfrac_high"].item(), metrics["clipfrac_low"].item()) == pytest.approx(fractions)


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


# ---- every estimator by hand -------------------------------------------------------------

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # group 0: one right; group 1: flat
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]] * 2, dtype=torch.float32)


def test_dr_grpo_and_rloo_by_hand():
    assert advantages.dr_grpo(REWARDS, 4).tolist() == [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]
    # leave-one-out: 1 - 0 = 1 for the right one; 0 - 1/3 for the others
    assert torch.allclose(advantages.rloo(REWARDS, 4), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0]))


def test_opo_uses_a_length_weighted_baseline():
    # group 0 lengths 2, 4, 1, 2: baseline = (2 * 1) / 9
    expected = torch.tensor([1 - 2 / 9, -2 / 9, -2 / 9, -2 / 9, 0, 0, 0, 0])
    assert torch.allclose(advantages.opo(REWARDS, 4, mask=MASK), expected)


def test_reinforce_plus_plus_whitens_over_valid_tokens():
    out = advantages.reinforce_plus_plus(REWARDS, 4, mask=MASK, eps=0.0)
    # every valid token carries its response's reward: lengths 2, 4, 1, 2, 2, 4, 1, 2
    per_token = [1, 1] + [0] * 4 + [0] + [0, 0] + [1] * 9
    mean, std = statistics.mean(per_token), statistics.stdev(per_token)
    assert mean == pytest.approx(11 / 18)
    assert out.tolist() == pytest.approx([(r - mean) / std for r in REWARDS.tolist()], rel=1e-6)


def test_reinforce_plus_plus_baseline_centres_groups_then_whitens():
    out = advantages.reinforce_plus_plus_baseline(REWARDS, 4, mask=MASK, eps=0.0)
    assert torch.equal(out[4:], torch.zeros(4))
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    lengths = MASK.sum(-1)
    values = centred.repeat_interleave(lengths.long())
    expected = (centred - values.mean()) / values.std()
    assert torch.allclose(out[:4], expected[:4])


def test_pass_at_k_matches_the_closed_form():
    out = advantages.pass_at_k(REWARDS, 4, k=2)
    # n = 4, 3 wrong: pass@2 = 1 - C(3,2)/C(4,2) = 0.5, sigma = 0.5
    # right: (1 - 0.5) / 0.5 = 1; wrong: (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5
    assert torch.allclose(out[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    assert torch.equal(out[4:], torch.zeros(4))


@pytest.mark.parametrize("name", registry.names("advantage"))
def test_zero_variance_groups_get_zero_and_only_group_estimators_refuse_singletons(name):
    flat = torch.ones(8)
    assert torch.equal(advantages.compute(name, flat, 4, mask=MASK), torch.zeros(8))
    if name in registry.names("advantage", groups=True):
        with pytest.raises(ValueError, match="group_size must be at least 2"):
            advantages.compute(name, flat, 1, mask=MASK)
    else:  # batch-whitened, no groups: a group of one is a batch like another
        assert advantages.compute(name, REWARDS, 1, mask=MASK).tolist() == pytest.approx(
            advantages.compute(name, REWARDS, 4, mask=MASK).tolist()
        )


def test_the_config_accepts_exactly_the_registered_names(monkeypatch):
    from rlx import config

    for kind in registry.KINDS:
        monkeypatch.setitem(registry._TABLES, kind, dict(registry._TABLES[kind]))  # undone after the test
    with pytest.raises(ConfigError, match="advantage_estimator_config.type: Input should be a registered advantage"):
        config.load(None, ["advantage_estimator_config.type=halved"])

    @registry.register("advantage", "halved")
    def halved(rewards, group_size, **_):
        return rewards / 2

    assert config.load(None, ["advantage_estimator_config.type=halved"]).advantage_estimator_config.type == "halved"
    assert advantages.compute("halved", torch.tensor([1.0, 3.0]), 2).tolist() == [0.5, 1.5]
    assert "halved" in config.json_schema()["$defs"]["AdvantageEstimatorConfig"]["properties"]["type"]["enum"]
    with pytest.raises(ValueError, match="advantage estimator 'halved' is registered twice"):
        registry.register("advantage", "halved")(halved)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo2'; registered: vanilla, gspo, cispo"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), kind="ppo2")


# ---- losses -------------------------------------------------------------------------------


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logp = torch.tensor([[0.1, 0.3, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = policy_loss(
        logp, old, torch.tensor([1.0]), mask, kind="gspo", cliprange_low=1.0, cliprange_high=1.0
    )
    ratio = math.exp(0.2)  # exp(mean(0.1, 0.3))
    assert loss.item() == pytest.approx(-ratio)
    loss.backward()
    # d(-s * (logp_t - sg(logp_t)))/d logp_t = -s on valid tokens
    assert torch.allclose(logp.grad, torch.tensor([[-ratio / 2, -ratio / 2, 0.0]]))


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)  # ratio 2 is clipped to 1.28
    loss, metrics = policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.ones(1, 2),
        kind="cispo",
        cliprange_low=1.0,
        cliprange_high=0.28,
    )
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.28 / 2, -1.0 / 2]]))
    assert (metrics["clipfrac"].item(), metrics["clipfrac_high"].item()) == pytest.approx((0.5, 0.5))


def test_extreme_log_ratios_stay_finite():
    logp = torch.tensor([[80.0, -80.0]])
    for kind in ("vanilla", "gspo", "cispo"):
        loss, metrics = policy_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), kind=kind)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())


def test_fully_masked_rows_contribute_nothing():
    logp, old = torch.randn(2, 3), torch.randn(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    both, _ = policy_loss(logp, old, torch.tensor([1.0, 5.0]), mask)
    first, _ = policy_loss(logp[:1], old[:1], torch.tensor([1.0]), mask[:1])
    assert both.item() == pytest.approx(first.item())


# CISPO's weight is stop-gradient on purpose, so its gradient is not the derivative of its value:
# gradcheck does not apply (its gradient is checked by hand above).
@pytest.mark.parametrize("kind", ["vanilla", "gspo"])
def test_policy_losses_pass_gradcheck(kind):
    torch.manual_seed(1)
    logp = (torch.randn(2, 3, dtype=torch.float64) * 0.1).requires_grad_()
    old = torch.randn(2, 3, dtype=torch.float64) * 0.1
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    # wide clip ranges keep every point away from the kinks where the loss is not differentiable
    assert torch.autograd.gradcheck(
        lambda x: policy_loss(x, old, adv, mask, kind=kind, cliprange_low=0.9, cliprange_high=5.0, clip_ratio_c=50.0)[
            0
        ],
        (logp,),
    )


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_kinds_by_hand(kind):
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    d = 0.5
    expected = {"k1": d, "k2": d * d / 2, "k3": math.exp(-d) - 1 + d, "abs": d}[kind]
    assert kl.estimate(logp, ref, kind).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.estimate(logp, ref, "k4")


def test_adaptive_kl_coefficient_moves_toward_the_target():
    assert kl.adaptive_kl_coef(0.1, observed_kl=0.2, target_kl=0.1, horizon=100, batch_size=10) == pytest.approx(0.102)
    assert kl.adaptive_kl_coef(0.1, observed_kl=0.05, target_kl=0.1, horizon=100, batch_size=10) < 0.1


# ---- rollout correction and shaping ---------------------------------------------------------


# Behaviour weights w = pi_train / pi_rollout: row 0 3, 1, 0.5 and 4 (padding), row 1 2, 2 and two padding
# tokens; per sequence the product over the response: 1.5 and 4. Padding gets log-weight 0: weight 1.
TRAIN = torch.tensor([[0.9, 0.5, 0.2, 0.4], [0.8, 0.6, 0.3, 0.3]], dtype=torch.float64).log()
ROLLOUT = torch.tensor([[0.3, 0.5, 0.4, 0.1], [0.4, 0.3, 0.3, 0.6]], dtype=torch.float64).log()
RESPONSE = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)


@pytest.mark.parametrize(("level", "mode", "expected"), [
    ("token", "truncate", [[2.5, 1, 0.5, 1], [2, 2, 1, 1]]),  # 3 capped at 2.5
    ("token", "mask", [[0, 1, 0, 1], [1, 1, 1, 1]]),  # 3 above 2.5 and 0.5 below 0.6 dropped
    ("token", "decoupled", [[0, 1, 0.5, 1], [2, 2, 1, 1]]),  # 3 above the cap dropped; no lower bound
    ("sequence", "truncate", [[1.5] * 4, [2.5] * 4]),
    ("sequence", "mask", [[1] * 4, [0] * 4]),
    ("sequence", "decoupled", [[1.5] * 4, [0] * 4]),  # the whole of row 1 dropped
])  # fmt: skip
def test_importance_weights_by_hand(level, mode, expected):
    from rlx.algo.correction import importance_weights

    weights = importance_weights(
        TRAIN, ROLLOUT, RESPONSE, level=level, mode=mode, threshold_high=2.5, threshold_low=0.6
    )
    assert weights.tolist() == [pytest.approx(row) for row in expected]


def test_decoupled_keeps_a_weight_at_the_cap_and_drops_one_above():
    decoupled = registry.get("correction", "decoupled")
    weights = decoupled(torch.tensor([0.0, 1e-3, -5.0]), threshold_high=1.0)  # w = 1, 1.001, e^-5
    assert weights.tolist() == pytest.approx([1.0, 0.0, math.exp(-5)])


def test_decoupled_ppo_loss_by_hand():
    from rlx.algo.correction import importance_weights

    rollout = torch.tensor([[0.3, 0.5, 0.4]]).log()  # the stale behaviour policy
    proximal = torch.tensor([[0.6, 0.5, 0.2]]).log()  # the policy the update starts from: w = 2, 1, 0.5
    live = torch.tensor([[0.9, 0.6, 0.3]]).log()  # r = live / proximal = 1.5, 1.2, 1.5
    mask = torch.ones(1, 3)
    weights = importance_weights(proximal, rollout, mask, mode="decoupled", threshold_high=1.5)
    loss, _ = policy_loss(live, proximal, torch.tensor([1.0]), mask, token_weights=weights)
    # A = 1: -min(r, clip(r, 0.8, 1.2)) = -1.2 each; weighted 0 (w = 2 > 1.5: dropped), -1.2, -0.6; the
    # dropped token still counts in the token mean, as in AReaL: -1.8 / 3
    assert loss.item() == pytest.approx(-0.6)


def test_an_unknown_correction_mode_or_level_lists_the_known_ones():
    from rlx.algo.correction import importance_weights

    assert registry.names("correction") == ["truncate", "mask", "decoupled"]
    with pytest.raises(
        ValueError, match="unknown rollout correction mode 'clip'; registered: truncate, mask, decoupled"
    ):
        importance_weights(TRAIN, ROLLOUT, RESPONSE, mode="clip")
    with pytest.raises(ValueError, match="unknown correction level 'word': token or sequence"):
        importance_weights(TRAIN, ROLLOUT, RESPONSE, level="word")


def test_correction_metrics_count_the_weights_applied_to_response_tokens():
    from types import SimpleNamespace

    from rlx.config import load
    from rlx.training.update import attach_weights, correction_metrics

    def metrics(*overrides):
        config = load(None, [f"train_worker_cfg.loss_cfg.rollout_correction.{o}" for o in overrides])
        correction = config.train_worker_cfg.loss_cfg.rollout_correction
        micros = [  # float32, as the trainer's log-probs
            SimpleNamespace(indices=[i], old_logp=TRAIN[i : i + 1].float(), rollout_logp=ROLLOUT[i : i + 1].float(),
                            batch=SimpleNamespace(mask=RESPONSE[i : i + 1].float()), token_weights=None)
            for i in range(2)
        ]  # fmt: skip
        attach_weights(correction, micros, torch.zeros(2))
        return correction_metrics(correction, micros, RESPONSE.flatten())

    assert metrics() == {}  # off
    # a cap float32 cannot hold exactly still counts the token capped at it. Applied 2.2, 1, 0.5, 2, 2
    truncated = metrics("enabled=true", "threshold_high=2.2")
    assert truncated == pytest.approx({
        "correction/weight_mean": 7.7 / 5, "correction/weight_max": 2.2,
        "correction/dropped_frac": 0.0, "correction/truncated_frac": 0.2,
    })  # fmt: skip
    # applied 0, 1, 0.5, 2, 2: the padding's weight 1 is not counted, nothing is truncated
    assert metrics("enabled=true", "mode=decoupled", "threshold_high=2.5") == pytest.approx({
        "correction/weight_mean": 1.1, "correction/weight_max": 2.0, "correction/dropped_frac": 0.2,
    })  # fmt: skip
    masked = metrics("enabled=true", "mode=mask", "threshold_high=2.5", "threshold_low=0.6")  # applied 0, 1, 0, 1, 1
    assert masked["correction/dropped_frac"] == pytest.approx(0.4) and "correction/truncated_frac" not in masked


def test_mismatch_metrics_are_the_raw_ratio():
    from rlx.algo.correction import mismatch_metrics

    metrics = mismatch_metrics(TRAIN, ROLLOUT, RESPONSE)
    assert metrics["mismatch/is_weight_max"] == pytest.approx(3.0)
    assert metrics["mismatch/is_weight_mean"] == pytest.approx((3 + 1 + 0.5 + 2 + 2) / 5)
    assert mismatch_metrics(TRAIN, TRAIN, RESPONSE)["mismatch/k3_kl"] == 0.0


def test_overlong_penalty_ramps_in_the_buffer():
    from rlx.algo.shaping import overlong_penalty

    lengths = torch.tensor([10, 24, 28, 32, 40])
    assert overlong_penalty(lengths, max_tokens=32, buffer=8).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


# ---- invariants, over many random cases ------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

rewards_and_groups = (
    st.integers(2, 6)
    .flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0]), min_size=g, max_size=4 * g).map(
                lambda r: r[: len(r) - len(r) % g]
            ),
        )
    )
    .filter(lambda case: len(case[1]) >= case[0])
)


@settings(max_examples=60, deadline=None)
@given(rewards_and_groups, st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_advantages_sum_to_zero_in_every_group(case, name):
    group_size, rewards = case
    out = advantages.compute(name, torch.tensor(rewards), group_size)
    assert torch.allclose(out.view(-1, group_size).sum(dim=1), torch.zeros(len(rewards) // group_size), atol=1e-5)


token_batches = st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**16))


def random_batch(rows: int, cols: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logp = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 0.3
    old = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 0.3
    mask = (torch.rand(rows, cols, generator=generator) > 0.3).double()
    adv = torch.randn(rows, generator=generator, dtype=torch.float64)
    return logp, old, mask, adv


@settings(max_examples=60, deadline=None)
@given(token_batches, st.sampled_from(["vanilla", "gspo", "cispo"]), st.sampled_from(
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))  # fmt: skip
def test_loss_is_invariant_to_padding(shape, kind, mode):
    logp, old, mask, adv = random_batch(*shape)
    padded = [torch.cat([t, torch.zeros(t.shape[0], 3, dtype=t.dtype)], dim=1) for t in (logp, old, mask)]
    plain, _ = policy_loss(logp, old, adv, mask, kind=kind, loss_agg_mode=mode)
    wider, _ = policy_loss(*padded[:2], adv, padded[2], kind=kind, loss_agg_mode=mode)
    assert wider.item() == pytest.approx(plain.item(), rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(token_batches, st.sampled_from(["vanilla", "gspo", "cispo"]), st.integers(1, 4))
def test_token_mean_over_any_split_equals_the_whole_batch(shape, kind, cut):
    logp, old, mask, adv = random_batch(*shape)
    cut = min(cut, logp.shape[0])
    whole, _ = policy_loss(logp, old, adv, mask, kind=kind)
    total = mask.sum()
    parts = [
        policy_loss(logp[s], old[s], adv[s], mask[s], kind=kind, global_tokens=total)[0]
        for s in (slice(0, cut), slice(cut, None))
        if logp[s].shape[0]
    ]
    assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-9, abs=1e-12)


def test_a_run_with_one_update_per_step_is_told_its_clip_cannot_act():
    from rlx.config import load
    from rlx.stages.train import clip_cannot_act

    message = clip_cannot_act(load(None, ["train_worker_cfg.loss_cfg.policy_loss_cfg.cliprange_high=0.28"]))
    assert message.startswith("train_worker_cfg.optimizer_steps is 1: every update is on-policy")
    assert "(cliprange_low 0.2, cliprange_high 0.28, clip_ratio_c 3.0) cannot act" in message
    assert clip_cannot_act(load(None, ["train_worker_cfg.optimizer_steps=2"])) is None


class WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep``, as a remote-code model's may not."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def test_token_logprobs_score_from_the_first_response_position_as_the_whole_sequence_would():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=50, num_hidden_layers=1, head_dim=16, **shape))
    batch = TokenBatch.from_ids([[5, 6, 7, 8, 9], [5, 6, 7]], [[10, 11], [12, 13, 14]], pad_id=0)
    assert batch.first_scored == 2  # the second prompt's last token predicts its first response token
    logp, entropy = token_logprobs(model, batch)
    whole, whole_entropy = token_logprobs(WithoutLogitsToKeep(model), batch)
    assert logp.shape == whole.shape == batch.mask.shape
    assert torch.equal(logp * batch.mask, whole * batch.mask)
    assert torch.equal(entropy * batch.mask, whole_entropy * batch.mask)
    assert not logp[:, :2].any() and whole[:, :2].all()  # before it: not scored, zeros


# ---- the sampled support (rlx.algo.support)


def test_the_support_is_transformers_top_k_then_top_p_over_any_leading_dimensions():
    """The trainer cuts its [B, T, V] logits as the sampler's transformers warpers cut each [B, V] step."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    from rlx.algo.support import cut_to_support

    logits = 3 * torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    for top_k, top_p in [(0, 0.9), (5, 1.0), (7, 0.6), (0, 0.05), (50, 0.999)]:
        warpers = ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
        expected = []
        for position in range(logits.shape[1]):
            step = logits[:, position]
            for warp in warpers:
                step = warp(None, step)
            expected.append(step)
        assert torch.equal(cut_to_support(logits, top_k, top_p), torch.stack(expected, dim=1)), (top_k, top_p)


def test_log_probs_over_the_support_by_hand():
    """p = (0.5, 0.25, 0.15, 0.1): top-p 0.7 keeps the two likeliest (0.75 of the mass, the least that reaches
    0.7), top-k 3 the three (0.9); each renormalised. A token drawn outside the cut stays in it."""
    from rlx.algo.support import entropy, support_log_probs

    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    nucleus = support_log_probs(probs.log(), top_p=0.7)
    assert torch.allclose(nucleus[:2].exp(), torch.tensor([0.5, 0.25]) / 0.75) and nucleus[2:].isinf().all()
    three = support_log_probs(probs.log(), top_k=3)
    assert torch.allclose(three[:3].exp(), torch.tensor([0.5, 0.25, 0.15]) / 0.9) and three[3].isinf()
    kept = support_log_probs(probs.log(), top_p=0.7, sampled=torch.tensor(2))
    assert torch.allclose(kept[:3].exp(), torch.tensor([0.5, 0.25, 0.15]) / 0.9)
    hot = support_log_probs((probs**2).log(), temperature=2.0)  # temperature before the cut
    assert torch.allclose(hot.exp(), probs)
    expected = -sum(p * math.log(p) for p in (0.5 / 0.75, 0.25 / 0.75))
    assert entropy(nucleus).item() == pytest.approx(expected, abs=1e-6)
