"""What `rlx fit` checks before it writes anything: a run refused for a bad input leaves params.yaml,
the work_dir and the DVC record as they were.

Besides what this machine and backend can act on (:func:`check_setup`), three kinds of check:
the inputs the run reads but does not make (datasets, model, tokenizer) are readable; the run's
folder overlaps no other stage's output; and a resumed run still has the configuration its steps
were made with (a step's record must say what it used).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import yaml

from rlx.config import RLTrainerConfig, RunPointer
from rlx.data import load_rows
from rlx.errors import UserError
from rlx.layout import RunLayout

# Fields a resumed run may change: they decide what is logged or kept, never what a step computes.
CHANGEABLE_ON_RESUME = {"auto_resume", "wandb", "exp_tracker", "debug_rollout", "checkpoint_maxkeep", "hf_max_keep"}
CONVERTED_SETS = [Path("data/gsm8k/train.parquet"), Path("data/gsm8k/test.parquet"), Path("data/math500/test.parquet")]


def check(config: RLTrainerConfig) -> None:
    check_setup(config)
    check_overlaps(config)
    check_inputs(config)
    check_unchanged(config, RunLayout(config.work_dir))


def check_setup(config: RLTrainerConfig) -> None:
    """Refuse (or warn about, once) settings this machine or backend cannot act on, before a run starts:
    ``resources.accelerator`` against the devices torch sees, the hostfile's slots against
    ``num_workers``, LMDeploy-only rollout fields under another backend."""
    from rlx.launcher import hostfile_slots
    from rlx.rollout import ignored_settings

    resources, cuda = config.resources, torch.cuda.is_available()
    if resources.accelerator == "GPU" and not cuda:
        raise UserError("resources.accelerator 'GPU': torch sees no CUDA device here; set it to 'CPU' or run on a GPU")
    if resources.accelerator == "CPU" and cuda:
        warnings.warn(
            "resources.accelerator is 'CPU' but a CUDA GPU is visible, and rlx samples and trains on it; "
            "set resources.accelerator: GPU (or hide the GPU with CUDA_VISIBLE_DEVICES=)",
            stacklevel=2,
        )
    if resources.hostfile is not None:
        slots = hostfile_slots(resources.hostfile)
        if resources.num_workers == 1 or slots != resources.num_workers:
            raise UserError(
                f"resources.hostfile {resources.hostfile} provides {slots} slots but resources.num_workers is "
                f"{resources.num_workers}; a hostfile launches num_workers > 1 ranks, one per slot: make them equal"
            )
    if ignored := ignored_settings(config.rollout_config):
        warnings.warn(
            f"{', '.join(ignored)}: read by the lmdeploy backend only, ignored with rollout_config.backend "
            f"{config.rollout_config.backend!r}; remove them",
            stacklevel=2,
        )


def made_by_the_pipeline(config: RLTrainerConfig) -> list[Path]:
    """What dvc.yaml's stages upstream of the iteration write (`rlx fit` brings them up to date)."""
    demo = config.tiny_model
    return [config.synthetic_task.output_dir, demo.output_dir, demo.metrics_path, *CONVERTED_SETS]


def overlaps(a: Path, b: Path) -> bool:
    a, b = Path(a).resolve(), Path(b).resolve()
    return a.is_relative_to(b) or b.is_relative_to(a)


def check_overlaps(config: RLTrainerConfig) -> None:
    """DVC refuses two stages with overlapping outputs only once params.yaml says so, in words about
    its stages; say it first, in the fields' words."""
    if Path(config.work_dir).is_file():
        raise UserError(f"work_dir {config.work_dir}: is a file; give a folder (it holds the run's steps)")
    for output in made_by_the_pipeline(config):
        if overlaps(config.work_dir, output):
            raise UserError(
                f"work_dir {config.work_dir} overlaps {output}, which a pipeline stage writes (see dvc.yaml); "
                "choose a work_dir outside it, e.g. runs/NAME"
            )
    if Path(config.load_from).resolve().is_relative_to(Path(config.work_dir).resolve()):
        raise UserError(
            f"load_from {config.load_from} is inside work_dir {config.work_dir}: the run would train from its "
            "own outputs; copy the model out (`rlx materialize RUN --step N --out models/NAME`) or use another work_dir"
        )


def check_inputs(config: RLTrainerConfig) -> None:
    """Datasets, model and tokenizer, each read as the run will read it; what the pipeline makes is
    left to it (it is made by rlx's own code, after the run starts)."""
    made = made_by_the_pipeline(config)
    pending = [path for path in made if not Path(path).exists()]
    datasets = [
        *(d.anno_path for d in config.replay_buffer_config.dataset_cfg),
        *(d.anno_path for d in config.evaluator_config.dataset_cfg),
    ]
    for path in datasets:
        if not any(overlaps(path, output) for output in pending):
            load_rows(path)
    if not any(overlaps(config.load_from, output) for output in pending):
        check_model(config)


def check_model(config: RLTrainerConfig) -> None:
    """The base model's folder, the headers of its weights (a truncated file is found here, not in the
    middle of step 0) and the tokenizer with its chat template."""
    from safetensors import SafetensorError, safe_open

    from rlx.engines import Engines

    Engines(config).tokenizer  # noqa: B018 (loading it checks it: folder, chat template, vocabulary)
    if config.train_worker_cfg.lora is not None:
        from rlx.lora import check_model as check_lora

        check_lora(config.train_worker_cfg.lora, config.load_from)
    for weights in sorted(Path(config.load_from).glob("*.safetensors")):
        try:
            with safe_open(weights, "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise UserError(f"load_from {config.load_from}: {weights.name} is damaged ({exc})") from None


def differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """``path: old -> new`` for each leaf that differs between two config trees."""
    found = []
    for key in sorted(set(recorded) | set(current), key=str):
        old, new, path = recorded.get(key), current.get(key), f"{prefix}{key}"
        if isinstance(old, dict) and isinstance(new, dict):
            found += differences(old, new, f"{path}.")
        elif old != new:
            found.append(f"{path}: {old!r} -> {new!r}")
    return found


def check_unchanged(config: RLTrainerConfig, layout: RunLayout) -> None:
    """A resumed run's configuration equals the one its steps were made with (config.yaml, written
    when it started): otherwise the new values would be recorded while a restored optimizer state, or
    the steps already made, say otherwise."""
    if not layout.config.is_file() or not layout.steps_with("*_metrics.json"):
        return  # nothing made yet
    recorded = yaml.safe_load(layout.config.read_text()) or {}
    current = config.model_copy(update={"run": RunPointer()}).model_dump(mode="json")
    changed = [
        line for line in differences(recorded, current) if line.split(".")[0].split(":")[0] not in CHANGEABLE_ON_RESUME
    ]
    if changed:
        raise UserError(
            f"work_dir {config.work_dir} holds a run made with another configuration ({layout.config}): "
            f"{'; '.join(changed)}; put the recorded values back to resume it, or start a new run in another work_dir"
        )
