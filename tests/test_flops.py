"""rlx.training.flops: the model FLOPs of an update, by hand and by torch's own count of the products."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, Qwen3Config

from rlx.training.flops import ModelShape, device_peak, forward_flops, mfu, peak_flops, training_flops

# hidden 16, MLP 32, 2 layers of 4 query heads (2 key/value heads) of size 8, vocabulary 50
TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, vocab_size=50)  # fmt: skip
# By hand, per layer: q 16x32, k and v 16x16 each, o 32x16; gate, up and down 16x32 each; q and k norms
# of 8, two layer norms of 16. Then the final norm of 16. Norms multiply nothing: 2 x 48 + 16 of them.
PER_LAYER = 16 * 32 + 2 * 16 * 16 + 32 * 16 + 3 * 16 * 32 + 2 * 8 + 2 * 16
BODY, NORMS, HEAD = 2 * PER_LAYER + 16, 2 * (2 * 8 + 2 * 16) + 16, 50 * 16


@pytest.mark.parametrize("tied", [True, False])
def test_the_shape_is_the_hand_count_whether_the_head_is_tied_or_not(tied):
    shape = ModelShape.of(Qwen3Config(**TINY, tie_word_embeddings=tied))
    assert shape == ModelShape(body=BODY, head=HEAD, attention=2 * 4 * 8) and BODY == 6256


def test_palms_formula_by_hand():
    """T = 10 tokens, 4 of them scored: 2N per token and the head at 4 positions, 4LHQT^2 of attention."""
    shape = ModelShape.of(Qwen3Config(**TINY))
    forward = 2 * BODY * 10 + 2 * HEAD * 4 + 4 * 64 * 10 * 10
    assert forward_flops(shape, [(10, 4)]) == forward == 157_120
    assert training_flops(shape, [(10, 4), (10, 4)]) == 2 * 3 * forward
    assert training_flops(shape, [(10, 4)], weight_gradients=False) == 2 * (forward - 4 * 64 * 100) + 3 * 4 * 64 * 100


@pytest.mark.parametrize("trained", [True, False])
def test_the_count_is_what_torch_counts_of_the_models_products(trained):
    """torch's FLOP counter sees every matrix product of a real forward and backward (eager attention
    makes the scores products too); the count is that plus the norms' parameters, which rlx counts in N
    as PaLM does. A frozen model (``trained`` False, as a LoRA policy's base) computes only the
    activations' gradients."""
    config = Qwen3Config(**TINY, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if not trained:
        model.requires_grad_(False).get_input_embeddings().weight.requires_grad_(True)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, 50, (3, 12)), logits_to_keep=5).logits.sum().backward()
    norms = (6 if trained else 4) * NORMS * 12 * 3
    assert counter.get_total_flops() == training_flops(ModelShape.of(config), [(12, 5)] * 3, trained) - norms


def test_peaks_follow_the_device_name_and_the_utilisation_is_flops_over_what_the_devices_could_do():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12 and peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("NVIDIA H200 NVL") == 835e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == peak_flops("NVIDIA A100 80GB PCIe") == 312e12
    assert peak_flops("NVIDIA L4") is None and device_peak(torch.device("cpu")) is None
    assert mfu(989e12, 2.0, 989e12, devices=2) == pytest.approx(0.25)
