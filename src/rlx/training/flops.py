"""Model FLOPs of a causal LM's update, and the share of the accelerator's peak they use (MFU).

The count is PaLM's (Chowdhery et al., 2022, "PaLM: Scaling Language Modeling with Pathways",
arXiv:2204.02311, appendix B). A token's forward pass multiplies its activations by each weight
once, 2 FLOPs per weight; its backward pass twice (the activations' gradient and the weight's), 4:
6N per token for N weights. Self-attention has no weights but does work that grows with the
sequence: the scores Q·K and their product with V, 2·2·L·H·Q·T forward for L layers, H query heads
of size Q and T positions, and twice that backward: 12·L·H·Q·T. Per token, then:

    forward and backward   6N + 12·L·H·Q·T      (the update)
    forward only           2N +  4·L·H·Q·T      (old and reference log-probs, no gradient)

What rlx counts, where PaLM's single formula leaves a choice:

- N is every parameter but the input embedding (a lookup, which multiplies nothing); norms and
  biases count, as in PaLM's N, and weigh nothing next to the matrices.
- The output head (vocabulary x hidden, tied to the embedding or not) counts only at the positions
  whose log-probs the update takes, one per token the model generated (an agent's tool tokens are
  not): no loss reads a prompt's logits, and rlx sends only the positions from the first response
  token on through the head (``logits_to_keep``).
- T is each sequence's own length, prompt plus response, with no padding: only real tokens are work.
  Attention counts the whole T x T score matrix, as PaLM does (a causal mask needs half; at the GPU
  check's lengths attention is under a tenth of the total either way).
- A frozen weight (a LoRA policy's base) gets no gradient of its own: 4N forward and backward, not 6N.
  The adapter's own products (rank x (in + out) per adapted matrix) are left out.

MFU = model FLOPs done / (seconds x peak FLOP/s x devices), against the bf16 dense peak of the
vendor's datasheet (``PEAK_BF16``); where the peak is not known (a CPU, an unlisted GPU) there is none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

# Dense bf16 tensor-core peaks from NVIDIA's datasheets, which print them with 2:4 sparsity (twice
# the dense figure) and mark it. Matched as substrings of torch.cuda.get_device_name(); first match counts.
PEAK_BF16 = [
    ("H100 PCIe", 756e12),  # H100 datasheet: 1,513 TFLOPS with sparsity
    ("H100 NVL", 835e12),  # H100 datasheet: 1,671 with sparsity
    ("H100", 989e12),  # H100 SXM ("NVIDIA H100 80GB HBM3"): 1,979 with sparsity
    ("H200 NVL", 835e12),  # H200 datasheet: 1,671 with sparsity
    ("H200", 989e12),  # H200 SXM: 1,979 with sparsity
    ("A100", 312e12),  # A100 datasheet (SXM4 and PCIe, 40 and 80 GB): 312 dense, 624 with sparsity
]


@dataclass(frozen=True)
class ModelShape:
    """What the count needs of a causal LM: its parameters by role and its attention's size."""

    body: int  # parameters every token is multiplied by: all but the input embedding and the output head
    head: int  # the output head's parameters (vocabulary x hidden), used at each scored position
    attention: int  # L x H x Q: layers x query heads x head size

    @classmethod
    def of(cls, config) -> ModelShape:
        """The shape of the model ``config`` (a transformers config) describes, counted from the model
        itself built on the meta device (no memory, any architecture transformers knows)."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        total = sum(p.numel() for p in model.parameters())  # a tied head is one parameter with the embedding
        body = total - embedding.numel() - (0 if head is embedding else head.numel())
        text = config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(body=body, head=head.numel(), attention=text.num_hidden_layers * heads * head_dim)


def forward_flops(shape: ModelShape, sequences: Iterable[tuple[int, int]]) -> float:
    """Model FLOPs of one forward pass over ``sequences``, each ``(tokens, scored)``: its real length
    and the positions that go through the output head."""
    return sum(2 * shape.body * t + 2 * shape.head * s + 4 * shape.attention * t * t for t, s in sequences)


def training_flops(shape: ModelShape, sequences: Iterable[tuple[int, int]], weight_gradients: bool = True) -> float:
    """Model FLOPs of a forward and backward pass over ``sequences`` (as :func:`forward_flops`); without
    ``weight_gradients`` (a frozen base) the backward pass computes the activations' gradients only."""
    sequences = list(sequences)
    weights = sum(2 * shape.body * t + 2 * shape.head * s for t, s in sequences)
    attention = sum(4 * shape.attention * t * t for t, _ in sequences)
    return (3 if weight_gradients else 2) * weights + 3 * attention


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak FLOP/s of the accelerator ``torch.cuda.get_device_name()`` calls
    ``device_name``, or None when it is not in ``PEAK_BF16``."""
    return next((peak for name, peak in PEAK_BF16 if name in device_name), None)


def device_peak(device: torch.device) -> float | None:
    """The dense bf16 peak of the device a model computes on; None on a CPU or an unlisted GPU."""
    return peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def mfu(flops: float, seconds: float, peak: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: the FLOPs done over what ``devices`` at ``peak`` could do in ``seconds``."""
    return flops / (seconds * peak * devices)
