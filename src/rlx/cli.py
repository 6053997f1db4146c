"""The ``rlx`` command line (Typer). Heavy imports happen inside commands so ``--help`` stays fast.

Every command that reads params takes ``-S KEY=VALUE`` overrides with XTuner's field names. A
mistake of the user's (:class:`rlx.errors.UserError`) prints one message and exits with code 2.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from rlx.errors import UserError

app = typer.Typer(
    name="rlx",
    help="Reproducible RL post-training for language models: a DVC pipeline you can inspect step by step.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Show or describe the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

ParamsArg = Annotated[Path, typer.Argument(help="The run's params.yaml.")]
PresetsOpt = Annotated[
    list[Path] | None,
    typer.Option("--preset", "-p", help="Apply a preset file (e.g. configs/dapo.yaml) before the -S overrides."),
]
OverridesOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-S", help="Override a field: -S dataflow_config.global_batch_size=32 (repeatable)."),
]


def all_overrides(presets: list[Path] | None, overrides: list[str] | None) -> list[str]:
    """Presets first, each as the overrides of its leaves, then the -S overrides (which win)."""
    from rlx.config import preset_overrides

    return [o for preset in presets or [] for o in preset_overrides(preset)] + list(overrides or [])


def load_config(params: Path, overrides: list[str] | None, presets: list[Path] | None = None):
    from rlx.config import load

    return load(params, all_overrides(presets, overrides))


def version_callback(value: bool) -> None:
    if value:
        from rlx import __version__

        console.print(f"rlx {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """rlx: prepare → rollout → judge → train → evaluate → export, versioned with DVC."""


@config_app.command("show")
def config_show(
    params: ParamsArg = Path("params.yaml"), presets: PresetsOpt = None, overrides: OverridesOpt = None
) -> None:
    """Print the resolved configuration (defaults filled in, presets and overrides applied) as YAML."""
    from rlx.config import to_yaml

    console.print(to_yaml(load_config(params, overrides, presets)), end="", markup=False, highlight=False)


@config_app.command("schema")
def config_schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file instead of stdout.")] = None,
) -> None:
    """Write the JSON schema of params.yaml (every field, type, default and description)."""
    from rlx.config import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        err_console.print(f"schema written to {output}")


@app.command("init-data")
def init_data(params: ParamsArg = Path("params.yaml"), overrides: OverridesOpt = None) -> None:
    """Generate the synthetic arithmetic task (train and held-out parquet files)."""
    from rlx.tasks.arith import write_dataset

    for split, path in write_dataset(load_config(params, overrides).synthetic_task).items():
        console.print(f"{split}: {path}")


@app.command("init-model")
def init_model(params: ParamsArg = Path("params.yaml"), overrides: OverridesOpt = None) -> None:
    """Build the tiny Qwen3 base model: local tokenizer, random init, short supervised warm start."""
    from rlx.tiny_model import build

    config = load_config(params, overrides)
    started = time.perf_counter()
    metrics = build(config)
    console.print(f"model saved to {config.tiny_model.output_dir} in {time.perf_counter() - started:.0f} s")
    console.print_json(data=metrics)


@app.command("stage")
def stage(
    name: Annotated[str, typer.Argument(help="base, prepare, rollout, judge, train, evaluate or export.")],
    params: ParamsArg = Path("params.yaml"),
    overrides: OverridesOpt = None,
) -> None:
    """Run one pipeline stage for the step in params.yaml's `run.step` (what dvc.yaml calls)."""
    from rlx.engines import Engines
    from rlx.stages import STAGES, run_stage

    if name not in STAGES:
        raise UserError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    config = load_config(params, overrides)
    metrics = run_stage(name, config, config.run.step, Engines(config))
    console.print_json(data=metrics)


@app.command("fit")
def fit(params: ParamsArg = Path("params.yaml"), presets: PresetsOpt = None, overrides: OverridesOpt = None) -> None:
    """Run the whole RL run, step after step through the DVC stages; rerun to resume.

    Presets and -S overrides are written into params.yaml first (as `dvc exp run -S` does), so DVC
    records the configuration that ran."""
    from rlx.fit import fit as run_fit

    run_fit(params, all_overrides(presets, overrides), console=console)


@app.command("convert-gsm8k")
def convert_gsm8k(
    source: Annotated[Path, typer.Argument(help="GSM8K jsonl (keys question, answer).")],
    output: Annotated[Path, typer.Argument(help="Parquet file to write, in rlx's row shape.")],
    split: Annotated[str, typer.Option(help="Recorded in extra_info.split.")] = "test",
) -> None:
    """Convert GSM8K's jsonl into rlx prompt rows, so a config can train or evaluate on it."""
    from rlx.tasks.gsm8k import convert

    console.print(f"written {convert(source, output, split)}")


def quiet_libraries() -> None:
    """Keep the terminal for rlx's own progress: no per-file bars or chatter from the libraries."""
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("dvc").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one message and exit code 2, never a traceback."""
    quiet_libraries()
    try:
        app(args=argv, prog_name="rlx")
    except UserError as exc:
        err_console.print("[bold red]error:[/bold red]", escape(str(exc)), highlight=False)
        sys.exit(2)
