"""What `rlx fit` checks before it writes anything: a run refused for a bad input leaves params.yaml,
the work_dir and the DVC record as they were.

Besides what this machine and backend can act on (:func:`check_setup`), three kinds of check:
the inputs the run reads but does not make (datasets, model, tokenizer) are readable; the run's
folder overlaps no other stage's output; and a resumed run still has the configuration its steps
were made with (a step's record must say what it used).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml

from rlx.config import RLTrainerConfig, RunPointer, changed, to_yaml
from rlx.debugging import debug_logging
from rlx.errors import UserError
from rlx.run import worklock
from rlx.store.artifacts import remove_temporaries, write_text
from rlx.store.layout import STAGES, RunLayout
from rlx.tasks.data import PromptPool, load_rows

# Fields a resumed run may change: they decide what is logged, kept or checked, or where the workers run (a run
# may resume on another cluster), never what a step computes (the number of workers does: it stays).
CHANGEABLE_ON_RESUME = {
    *("auto_resume", "wandb", "exp_tracker", "debug_rollout", "checkpoint_maxkeep", "hf_max_keep"),
    *("log_dir", "debug", "display_all_workers_log", "skip_checkpoint_validation"),
    *("resources.ray_address", "resources.num_cpus_per_worker", "resources.cpu_memory_per_worker"),
    "resources.pg_pack_strategy",
}
CONVERTED_SETS = [Path("data/gsm8k/train.parquet"), Path("data/gsm8k/test.parquet"), Path("data/math500/test.parquet")]


@contextlib.contextmanager
def entered(params: Path, config: RLTrainerConfig) -> Iterator[bool]:
    """What every way into a run goes through, `rlx fit` and `rlx stage` (so `dvc repro`) alike: rlx's log
    lines as ``debug`` asks, in the project's folder (paths in params.yaml are relative to it), the
    repository's lock, every check before anything is written, then the run's lock; yields whether the
    work_dir existed before."""
    project = Path(params).resolve().parent
    with debug_logging(config.debug), contextlib.chdir(project), worklock.hold_repository(project):
        check(config, project)
        existed = Path(config.work_dir).exists()
        with worklock.hold_work_dir(config.work_dir):
            for folder in written_by_the_run(config, project):
                remove_temporaries(folder)  # what killed writers left, here or in an earlier run
            yield existed


def written_by_the_run(config: RLTrainerConfig, project: Path) -> set[Path]:
    """The folders a run writes files in: the project's, the run's, its logs' and those of the pipeline's stages."""
    return {project, Path(config.work_dir), config.log_folder, *(Path(p).parent for p in made_by_the_pipeline(config))}


def check(config: RLTrainerConfig, project: Path) -> None:
    check_setup(config)
    check_pipeline(project)
    check_overlaps(config, project)
    check_inputs(config)
    check_unchanged(config, RunLayout(config.work_dir))


def check_setup(config: RLTrainerConfig) -> None:
    """Refuse (or warn about, once) settings this machine or backend cannot act on, before a run starts:
    ``resources.accelerator`` against the devices torch sees (several workers: against the Ray cluster,
    rlx.workers.cluster), LMDeploy-only rollout fields under another backend."""
    from rlx.samplers import ignored_settings

    resources, cuda = config.resources, torch.cuda.is_available()
    if config.train_worker_cfg.lora and config.train_worker_cfg.deepspeed.zero_stage == 3:
        raise UserError(
            "train_worker_cfg.deepspeed.zero_stage 3 with train_worker_cfg.lora: the policy is sampled from a whole "
            "copy gathered from ZeRO-3's pieces, which rlx does not merge with an adapter; use zero_stage 2 (an "
            "adapter's optimizer state is small) or lora: null"
        )
    if resources.accelerator == "GPU" and not cuda and not resources.on_ray:
        raise UserError("resources.accelerator 'GPU': torch sees no CUDA device here; set it to 'CPU' or run on a GPU")
    if resources.accelerator == "CPU" and cuda:
        warnings.warn(
            "resources.accelerator is 'CPU' but a CUDA GPU is visible, and rlx samples and trains on it; "
            "set resources.accelerator: GPU (or hide the GPU with CUDA_VISIBLE_DEVICES=)",
            stacklevel=2,
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


def check_pipeline(project: Path) -> None:
    """rlx's stages in the project's dvc.yaml run as rlx writes them (`rlx stage NAME params.yaml`): a
    command edited by hand would run something else than what DVC records as the stage's inputs."""
    dvc_yaml = project / "dvc.yaml"
    if not dvc_yaml.is_file():
        return
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})
    for name in (name for name in STAGES if name in stages):
        command = stages[name].get("cmd")
        if command != f"rlx stage {name} params.yaml" or "wdir" in stages[name]:
            where = f"runs `{command}`" if "wdir" not in stages[name] else f"runs in wdir {stages[name]['wdir']}"
            raise UserError(
                f"{dvc_yaml}: stage {name} {where}; rlx runs it as `rlx stage {name} params.yaml` in the project's "
                "folder, so that what DVC records is what ran: put it back (its configuration belongs in params.yaml)"
            )


def check_overlaps(config: RLTrainerConfig, project: Path) -> None:
    """DVC refuses two stages with overlapping outputs only once params.yaml says so, in words about
    its stages; say it first, in the fields' words. DVC records only what lies inside its project, so
    the run must too."""
    if Path(config.work_dir).is_file():
        raise UserError(f"work_dir {config.work_dir}: is a file; give a folder (it holds the run's steps)")
    root = next((folder for folder in [project, *project.parents] if (folder / ".dvc").is_dir()), None)
    if root is not None and not Path(config.work_dir).resolve().is_relative_to(root):
        raise UserError(
            f"work_dir {config.work_dir}: outside the DVC project {root}, where DVC records each step; "
            "choose a work_dir inside it, e.g. runs/NAME"
        )
    if config.log_dir is not None and Path(config.log_dir).is_file():
        raise UserError(f"log_dir {config.log_dir}: is a file; give a folder (it holds the run's logs)")
    folders = {"work_dir": config.work_dir, "log_dir": config.log_dir}
    kept = [project / ".git", project / ".dvc", project / "src", project / "dvc.yaml", project / "params.yaml"]
    for (field, folder), place in itertools.product(folders.items(), kept):
        if folder is not None and overlaps(folder, place):
            raise UserError(
                f"{field} {folder} overlaps {place}, which git, DVC or the pipeline's code keep; "
                f"choose a {field} of its own, e.g. runs/NAME"
            )
    for (field, folder), output in itertools.product(folders.items(), made_by_the_pipeline(config)):
        if folder is not None and overlaps(folder, output):
            raise UserError(
                f"{field} {folder} overlaps {output}, which a pipeline stage writes (see dvc.yaml); "
                f"choose a {field} outside it, e.g. runs/NAME"
            )
    if Path(config.load_from).resolve().is_relative_to(Path(config.work_dir).resolve()):
        raise UserError(
            f"load_from {config.load_from} is inside work_dir {config.work_dir}: the run would train from its "
            "own outputs; copy the model out (`rlx materialize RUN --step N --out models/NAME`) or use another work_dir"
        )


def check_inputs(config: RLTrainerConfig) -> None:
    """Datasets, model and tokenizer, each read as the run will read it, and what the run asks of them:
    judgers for every data source, a batch's worth of usable prompts, sizes the model and the machine
    can hold. What the pipeline makes is left to it (made by rlx's own code, after the run starts)."""
    pending = [path for path in made_by_the_pipeline(config) if not Path(path).exists()]

    def ready(path) -> bool:
        return not any(overlaps(path, output) for output in pending)

    train = [d.anno_path for d in config.replay_buffer_config.dataset_cfg]
    evaluated = [d.anno_path for d in config.evaluator_config.dataset_cfg]
    rows = {path: load_rows(path) for path in [*train, *evaluated] if ready(path)}
    check_judging(config, rows)
    if ready(config.load_from):
        tokenizer = check_model(config)
        check_sizes(config)
        check_teachers(config, tokenizer, [row for path in train for row in rows.get(path, [])])
        if all(ready(path) for path in train):
            PromptPool.load(config, tokenizer).steps_per_epoch(config.dataflow_config.global_batch_size)


def check_teachers(config: RLTrainerConfig, tokenizer, rows: list[dict]) -> None:
    """Each teacher is there (a model folder, or a step its run holds), is not the student, shares the
    student's tokenizer, and is routed only to data sources the training rows have."""
    from rlx.training.teachers import check_tokenizer, located

    for teacher in located(config):
        check_tokenizer(teacher, tokenizer, config)
    sources = {row["data_source"] for row in rows}
    for i, item in enumerate(config.teacher_config.teachers if config.teacher_config and rows else []):
        unknown = sorted(set(item.data_source or []) - sources)
        if unknown:
            raise UserError(
                f"teacher_config.teachers.{i}.data_source {unknown}: no training row has it (the datasets' "
                f"data sources: {sorted(sources)})"
            )


def check_judging(config: RLTrainerConfig, rows: dict[Path, list[dict]]) -> None:
    """Every judger the run names exists and takes its options, and every data source of the datasets
    has one (the message the judge stage would give in its step, given before the run starts)."""
    from rlx.judgers import Panel, get

    panel = Panel(config.judger_config)
    for dataset in config.replay_buffer_config.dataset_cfg:
        for source in sorted({row["data_source"] for row in rows.get(dataset.anno_path, [])}):
            panel.seats_for(source)
    for dataset in config.evaluator_config.dataset_cfg:
        if dataset.judger_name is not None:
            get(dataset.judger_name, **dataset.judger_options)
            continue
        for source in sorted({row["data_source"] for row in rows.get(dataset.anno_path, [])}):
            panel.seats_for(source)


def check_model(config: RLTrainerConfig):
    """The base model's folder, the headers of its weights (a truncated file is found here, not in the
    middle of step 0) and the tokenizer with its chat template, which it returns."""
    from safetensors import SafetensorError, safe_open

    from rlx.training.loading import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer_path, config.load_from)  # checked: chat template, vocabulary
    if config.train_worker_cfg.lora is not None:
        from rlx.training.lora import check_model as check_lora

        check_lora(config.train_worker_cfg.lora, config.load_from)
    for weights in sorted(Path(config.load_from).glob("*.safetensors")):
        try:
            with safe_open(weights, "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise UserError(f"load_from {config.load_from}: {weights.name} is damaged ({exc})") from None
    return tokenizer


BYTES_PER_ROLLOUT_TOKEN = 16  # a response token's id and log-prob, its text, and the tables' copies of them


def check_sizes(config: RLTrainerConfig) -> None:
    """Sizes the model and the machine can hold: a prompt and its response within the model's context,
    and one step's rollouts within this machine's memory (a group of a million responses would run on
    for days before it failed)."""
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(config.load_from).get_text_config().max_position_embeddings
    flow, longest = config.dataflow_config, config.replay_buffer_config.max_prompt_length
    for path, params in [("dataflow_config", flow.sample_params), *evaluation_sampling(config)]:
        if longest + params.max_tokens > context:
            raise UserError(
                f"{path}.sample_params.max_tokens: {params.max_tokens} new tokens after a prompt of up to "
                f"replay_buffer_config.max_prompt_length={longest} exceed the model's context of {context} tokens "
                f"(max_position_embeddings in load_from {config.load_from})"
            )
    responses = flow.global_batch_size * flow.prompt_repeat_k
    needed = responses * (longest + flow.sample_params.max_tokens) * BYTES_PER_ROLLOUT_TOKEN
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory:
        raise UserError(
            f"dataflow_config: a step of {flow.global_batch_size} prompts x {flow.prompt_repeat_k} responses "
            f"(prompt_repeat_k) of up to {longest + flow.sample_params.max_tokens} tokens needs about "
            f"{needed / 2**30:,.0f} GiB to hold its rollouts, more than this machine's {memory / 2**30:,.0f} GiB"
        )


def evaluation_sampling(config: RLTrainerConfig) -> list[tuple[str, object]]:
    """(field path, sampling) of every evaluated set: its own, or the evaluator's."""
    evaluator = config.evaluator_config
    return [
        (f"evaluator_config.dataset_cfg.{i}", d.sample_params)
        if d.sample_params
        else ("evaluator_config", evaluator.sample_params)
        for i, d in enumerate(evaluator.dataset_cfg)
    ]


def record_configuration(config: RLTrainerConfig, keep: bool = False) -> None:
    """Write the run's configuration (``config.yaml``), which :func:`check_unchanged` holds its later
    steps to; ``keep``: only if the run has none yet."""
    layout = RunLayout(config.work_dir)
    if not (keep and layout.config.is_file()):
        write_text(to_yaml(config.model_copy(update={"run": RunPointer()})), layout.config)


def changeable(path: str) -> bool:
    """Whether the config field at ``path`` (``a.b.c``) lies in one a resumed run may change."""
    return any(path == field or path.startswith(f"{field}.") for field in CHANGEABLE_ON_RESUME)


def check_unchanged(config: RLTrainerConfig, layout: RunLayout) -> None:
    """A resumed run's configuration equals the one its steps were made with (config.yaml, written
    when it started): otherwise the new values would be recorded while a restored optimizer state, or
    the steps already made, say otherwise."""
    if not layout.config.is_file() or not layout.steps_with("*_metrics.json"):
        return  # nothing made yet
    recorded = yaml.safe_load(layout.config.read_text()) or {}
    current = config.model_copy(update={"run": RunPointer()}).model_dump(mode="json")
    altered = [f"{path}: {old!r} -> {new!r}" for path, old, new in changed(recorded, current) if not changeable(path)]
    if altered:
        raise UserError(
            f"work_dir {config.work_dir} holds a run made with another configuration ({layout.config}): "
            f"{'; '.join(altered)}; put the recorded values back to resume it, or start a new run in another work_dir"
        )
