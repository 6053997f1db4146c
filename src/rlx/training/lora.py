"""LoRA policies (``train_worker_cfg.lora``): a peft adapter on the frozen base model.

The base stays exactly as ``load_from`` has it, so a step's policy is the adapter alone (peft's
folder: ``adapter_config.json`` and ``adapter_model.safetensors``), the KL reference is the same
module with its adapter switched off, and an export merges ``W + scale x B A`` into a full model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from rlx.config import LoraConfig
from rlx.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
INIT = {"kaiming": True, "gaussian": "gaussian"}  # rlx's names for peft's init_lora_weights


def is_adapter(folder: Path) -> bool:
    """Whether a policy folder holds a LoRA adapter (a full model's folder has config.json instead)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def is_lora(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def peft_config(cfg: LoraConfig):
    import peft

    return peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        init_lora_weights=INIT[cfg.init],
        use_rslora=cfg.use_rslora,
    )


def linear_modules(model) -> list[str]:
    """The short names of the model's linear layers that can take an adapter: its output head only if
    it is not tied to the input embeddings (an adapter there would move the embeddings too on merge)."""
    head = model.get_output_embeddings()
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not (tied and module is head)
        }
    )


def check_targets(cfg: LoraConfig, model, load_from: Path) -> None:
    """Refuse a target module the model lacks: peft adapts the names it finds and silently skips the rest."""
    if cfg.target_modules == "all-linear":
        return
    known = linear_modules(model)
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    missing = [  # peft's own match: the module's whole name, or its end after a dot
        target for target in cfg.target_modules
        if target.rsplit(".", 1)[-1] not in known or not any(n == target or n.endswith(f".{target}") for n in linear)
    ]  # fmt: skip
    if missing:
        raise UserError(
            f"train_worker_cfg.lora.target_modules: {', '.join(missing)} not among the linear modules of the model "
            f"in load_from {load_from}: {', '.join(known)} (or all-linear)"
        )


def check_model(cfg: LoraConfig, load_from: Path) -> None:
    """:func:`check_targets` and :func:`check_rank` against the architecture in ``load_from``, built
    without its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(load_from))
    check_targets(cfg, model, load_from)
    check_rank(cfg, model, load_from)


def check_rank(cfg: LoraConfig, model, load_from: Path) -> None:
    """Refuse a rank above the smallest side of an adapted layer: ``B A`` of such a rank can be no more
    than that layer's full rank, so the extra rows would only cost memory (a rank of 1e9 asks for terabytes)."""
    targets = set(linear_modules(model) if cfg.target_modules == "all-linear" else cfg.target_modules)
    sides = {
        name: min(module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    }
    narrowest = min(sides, key=sides.get, default=None)
    if narrowest is not None and cfg.rank > sides[narrowest]:
        raise UserError(
            f"train_worker_cfg.lora.rank: {cfg.rank} exceeds the rank any adapted layer of the model in load_from "
            f"{load_from} can have ({narrowest}: {sides[narrowest]}, the smaller of its sides); at most "
            f"{sides[narrowest]}"
        )


def adapt(model, cfg: LoraConfig, load_from: Path, adapter: Path | None, seed: int):
    """``model`` (the base) with a trainable adapter, the only parameters that need a gradient: the one
    saved in ``adapter``, or a new one whose A is drawn from ``seed`` (the same on every replay) and B zero."""
    import peft

    check_targets(cfg, model, load_from)
    model.requires_grad_(False)
    if adapter is not None:
        return peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, peft_config(cfg))


def with_adapter(model, adapter: Path):
    """The base ``model`` with the adapter saved in ``adapter`` (unmerged: its weights are those the
    trainer recorded in the step's fingerprint), for inference."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter)


def merged(model):
    """A PEFT model folded into a plain HF model, ``W + scale x B A`` in each adapted layer."""
    return model.merge_and_unload()


def full_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of the plain model a policy stands for, by the base model's names, for an inference
    engine that knows nothing of adapters (LMDeploy 0.18 loads adapters only when it starts). Under
    LoRA each adapted layer's weight is ``W + scale x B A``, made one layer at a time when it is asked
    for, the policy left as it is; the same arithmetic as :func:`merged`, so the same values."""
    if not is_lora(model):
        yield from model.state_dict().items()
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {f"{name}.base_layer.weight": m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        layer = adapted.get(name)
        if layer is not None:
            tensor = (tensor + layer.get_delta_weight(layer.active_adapters[0])).to(tensor.dtype)  # as merge's +=
        yield name.replace(".base_layer.", "."), tensor


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
