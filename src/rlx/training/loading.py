"""Loading a policy and its tokenizer, checked: a missing folder, pickled weights, a tokenizer with ids
the model cannot embed or a chat template that fails or loops are refused here, in one line, instead of
failing deep inside a forward pass or on every prompt of the run."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlx.errors import UserError, first_line
from rlx.store import faults
from rlx.store.artifacts import atomic_dir, write_text
from rlx.store.integrity import folder_records
from rlx.store.targets import FOLDER_MARK, folder_mark
from rlx.tokens import prompt_ids
from rlx.training import lora

log = logging.getLogger(__name__)


def pretrained(path: Path, strict: bool = True, **options):
    """``AutoModelForCausalLM.from_pretrained(path, **options)`` from safetensors, its weights matched to the
    model's layers (``strict_load``): transformers leaves a missing weight at a random initialization and
    drops an unexpected one, with a note. Strict, either is refused, named; else warned about, and the
    missing weights are drawn from a fixed seed, so every load of the folder gives the same model (the
    run's fingerprints compare loads)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, info = AutoModelForCausalLM.from_pretrained(
            path, use_safetensors=True, output_loading_info=True, **options
        )
    unmatched = [
        f"{len(info[key])} {kind} ({', '.join(sorted(info[key])[:4])}{', ...' if len(info[key]) > 4 else ''})"
        for key, kind in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"))
        if info[key]
    ]
    if unmatched and strict:
        raise UserError(
            f"{path}: its weights do not match the model its config.json describes: {'; '.join(unmatched)}; give "
            "a complete model folder, or set strict_load: false to load it anyway (missing weights then get a "
            "seeded random initialization)"
        )
    if unmatched:
        log.warning("%s: loaded with strict_load false; weights %s", path, "; ".join(unmatched))
    return model


def load_policy(path, dtype: str = "float32", base: Path | None = None, strict: bool = True):
    """A HF model folder for inference (on the GPU when there is one), with a clear error when it is missing or not one.
    Weights load from safetensors only: a pickled ``*.bin`` checkpoint could run code when read. On a GPU they
    load in ``dtype`` (``rollout_config.dtype`` for a copy only sampled or scored; 'auto': the checkpoint's own);
    on CPU always in float32, where half precision is slow and the tests compare exact values. A LoRA
    adapter's folder loads onto ``base``, the model it was trained on (``load_from``). ``strict``: see
    :func:`pretrained`."""
    path = Path(path)
    if lora.is_adapter(path):
        if base is None:
            raise UserError(f"{path}: a LoRA adapter, which loads onto its base model (load_from); none given")
        return lora.with_adapter(load_policy(base, dtype, strict=strict), path).eval()
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a model folder (no config.json)")
    if not any(path.glob("*.safetensors")):
        found = ", ".join(sorted(p.name for p in path.glob("*.bin"))) or "none"
        raise UserError(
            f"{path}: no *.safetensors weights (found *.bin: {found}); rlx loads safetensors only: "
            "save the model with save_pretrained(..., safe_serialization=True)"
        )
    try:
        name = dtype if torch.cuda.is_available() else "float32"
        model = pretrained(path, strict, dtype=name if name == "auto" else getattr(torch, name))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load the model ({first_line(exc)})") from None
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()


def check_vocabulary(tokenizer, tokenizer_path: Path, model_path: Path) -> None:
    """Refuse a tokenizer with ids the model has no embedding for: they would fail deep inside a
    forward pass (on CPU) or read other memory (on GPU), long after the cause could be named."""
    if not (Path(model_path) / "config.json").is_file():
        raise UserError(f"load_from {model_path}: not a model folder (no config.json)")
    vocab_size = AutoConfig.from_pretrained(model_path).get_text_config().vocab_size
    if len(tokenizer) > vocab_size:
        raise UserError(
            f"tokenizer_path {tokenizer_path}: the tokenizer has {len(tokenizer)} tokens but the model in "
            f"load_from {model_path} embeds only {vocab_size} (vocab_size); use the tokenizer the model was "
            "trained with"
        )


TEMPLATE_SECONDS = 10  # one prompt renders in milliseconds; a template still looping after this never ends


def check_chat_template(tokenizer, tokenizer_path: Path) -> None:
    """Render one prompt, within a time limit: a template that the Jinja sandbox refuses, that fails,
    or that loops for ever is named here instead of failing (or hanging) on every prompt of the run."""
    import signal

    from jinja2 import TemplateError

    def too_slow(*_):
        raise TimeoutError

    timed = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous = signal.signal(signal.SIGALRM, too_slow) if timed else None
    try:
        signal.alarm(TEMPLATE_SECONDS) if timed else None
        prompt_ids(tokenizer, [{"role": "user", "content": "What is 1 + 1?"}])
    except TimeoutError:
        raise UserError(
            f"tokenizer_path {tokenizer_path}: the chat template did not render one prompt in {TEMPLATE_SECONDS} s"
        ) from None
    except (TemplateError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise UserError(f"tokenizer_path {tokenizer_path}: the chat template fails ({first_line(exc)})") from None
    finally:
        if timed:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def load_tokenizer(path: Path, model_path: Path):
    """The tokenizer in ``path`` (left padding, a pad token), once it has a chat template that renders
    and ids that the model in ``model_path`` embeds."""
    if not (path / "tokenizer_config.json").is_file():
        raise UserError(f"tokenizer_path {path}: no tokenizer there (build the demo model with `dvc repro`)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    except (OSError, ValueError) as exc:
        raise UserError(f"tokenizer_path {path}: cannot load the tokenizer ({first_line(exc)})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise UserError(
            f"tokenizer_path {path}: the tokenizer has no chat template (rlx renders prompts as chat "
            "messages; use an instruct model's tokenizer or set tokenizer.chat_template and save it)"
        )
    check_vocabulary(tokenizer, path, model_path)
    check_chat_template(tokenizer, path)
    return tokenizer


def save_policy(policy, tokenizer, folder: Path, base: Path, keep_adapter: bool, mark: dict | None = None) -> Path:
    """``policy`` as a HF folder, written whole under a temporary name first; a LoRA policy merged into a
    full model on ``base``, which ``from_pretrained`` loads without peft (its adapter alone kept in
    ``adapter/`` when ``keep_adapter``). With ``mark``, the folder keeps it in ``.rlx.json``
    (rlx.store.targets), with each file's size and hash."""
    with atomic_dir(folder) as tmp:
        if lora.is_lora(policy):
            save_merged(policy, tmp, base, keep_adapter)
        else:
            policy.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if mark is not None:
            files = folder_records(sorted(p for p in tmp.rglob("*") if p.is_file()), tmp)
            write_text(folder_mark(**mark, files=files), tmp / FOLDER_MARK)
        faults.point("policy.write")
    return folder


def save_merged(policy, folder: Path, base: Path, keep_adapter: bool) -> None:
    """A LoRA policy as ``W + scale x B A`` on a fresh copy of ``base`` (the policy itself stays as it is:
    it may be the trainer's)."""
    adapter = folder / "adapter"
    policy.save_pretrained(adapter, safe_serialization=True)
    lora.merged(load_policy(adapter, base=base)).save_pretrained(folder, safe_serialization=True)
    if not keep_adapter:
        shutil.rmtree(adapter)
