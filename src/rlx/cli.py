"""The ``rlx`` command line (Typer). Heavy imports happen inside commands so ``--help`` stays fast.

Every command that reads params takes ``-S KEY=VALUE`` overrides with XTuner's field names. A
mistake of the user's (:class:`rlx.errors.UserError`) prints one message and exits with code 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from rlx.debugging import quiet_libraries
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
    from rlx.store.targets import guard, json_mark

    command = "rlx config schema"
    if output is not None:
        guard(output, "--output", command, folder=False)
    text = json.dumps({**(json_mark(command) if output else {}), **json_schema()}, indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        from rlx.store.artifacts import write_text

        write_text(text, output)
        err_console.print(f"schema written to {output}")


@app.command("init-data")
def init_data(params: ParamsArg = Path("params.yaml"), overrides: OverridesOpt = None) -> None:
    """Generate the synthetic arithmetic task (train and held-out parquet files)."""
    from rlx.store.targets import guard
    from rlx.tasks.arith import write_dataset

    task = load_config(params, overrides).synthetic_task
    guard(task.output_dir, "synthetic_task.output_dir", "rlx init-data", folder=True)
    for split, path in write_dataset(task).items():
        console.print(f"{split}: {path}")


@app.command("init-model")
def init_model(params: ParamsArg = Path("params.yaml"), overrides: OverridesOpt = None) -> None:
    """Build the tiny Qwen3 base model: local tokenizer, random init, short supervised warm start."""
    from rlx.store.targets import guard
    from rlx.tasks.tiny_model import build

    config = load_config(params, overrides)
    inputs = [config.synthetic_task.output_dir]
    guard(config.tiny_model.output_dir, "tiny_model.output_dir", "rlx init-model", folder=True, inputs=inputs)
    guard(config.tiny_model.metrics_path, "tiny_model.metrics_path", "rlx init-model", folder=False, inputs=inputs)
    started = time.perf_counter()
    metrics = build(config)
    console.print(f"model saved to {config.tiny_model.output_dir} in {time.perf_counter() - started:.0f} s")
    console.print_json(data=metrics)


@app.command("sync-deps")
def sync_deps(params: ParamsArg = Path("params.yaml"), overrides: OverridesOpt = None) -> None:
    """Write dvc.yaml's code and dataset deps from the import graph and params.yaml (rlx fit does it first)."""
    from rlx.lineage.dvcdeps import sync

    changed = sync(params.parent / "dvc.yaml", load_config(params, overrides))
    console.print(f"{params.parent / 'dvc.yaml'}: {'deps rewritten' if changed else 'up to date'}")


@app.command("stage")
def stage(
    name: Annotated[str, typer.Argument(help="base, prepare, rollout, judge, train, checkpoint, evaluate or export.")],
    params: ParamsArg = Path("params.yaml"),
    overrides: OverridesOpt = None,
) -> None:
    """Run one pipeline stage for the step in params.yaml's `run.step` (`run.checkpoint` for the
    checkpoint stage): what dvc.yaml calls. It takes the same locks and makes the same checks as
    `rlx fit`, and a run's first stage records the run's configuration, which its later stages must keep."""
    from rlx.lineage.dvcdeps import undeclared_datasets
    from rlx.run.preflight import entered, record_configuration
    from rlx.stages import run_stage
    from rlx.store.layout import STAGES
    from rlx.workers.group import warm_engines

    if name not in STAGES:
        raise UserError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    config = load_config(params, overrides)
    problem = undeclared_datasets(params.parent / "dvc.yaml", config, name)
    if problem:
        raise UserError(problem)
    step = config.run.checkpoint if name == "checkpoint" else config.run.step
    with entered(params, config), warm_engines(config) as engines:  # several workers: started for this stage
        record_configuration(config, keep=True)
        metrics = run_stage(name, config, step, engines)
    console.print_json(data=metrics)


@app.command("fit")
def fit(params: ParamsArg = Path("params.yaml"), presets: PresetsOpt = None, overrides: OverridesOpt = None) -> None:
    """Run the whole RL run, step after step through the DVC stages; rerun to resume.

    Presets and -S overrides are written into params.yaml first (as `dvc exp run -S` does), so DVC
    records the configuration that ran."""
    from rlx.lineage.record import make_room_for_the_recorder

    make_room_for_the_recorder()  # before rlx.run.fit imports torch
    from rlx.run.fit import fit as run_fit

    run_fit(params, all_overrides(presets, overrides), console=console)


@app.command("reset")
def reset(params: ParamsArg = Path("params.yaml")) -> None:
    """Put the committed pipeline back: params.yaml, dvc.yaml and dvc.lock as the last commit holds them, and
    the data they record from DVC's cache. Every run writes its parameters into params.yaml (as `dvc exp run`
    does) and the next run starts from them; this returns to the committed demo. Runs' folders are kept."""
    from rlx.lineage.workspace import reset as reset_workspace
    from rlx.run.worklock import hold_repository

    with hold_repository(params.parent):
        restored = reset_workspace(params.parent)
    console.print(f"put back as committed: {', '.join(restored) or 'nothing differed'}; data checked out")


@app.command("convert")
def convert(
    dataset: Annotated[str, typer.Argument(help="gsm8k, math500, or qa (your own question/answer jsonl).")],
    source: Annotated[Path, typer.Argument(help="The set's jsonl (e.g. data/gsm8k/test.jsonl).")],
    output: Annotated[Path, typer.Argument(help="Parquet file to write, in rlx's row shape.")],
    split: Annotated[str, typer.Option(help="Recorded in extra_info.split.")] = "test",
    data_source: Annotated[str | None, typer.Option(help="qa: the rows' data_source, which picks judgers.")] = None,
) -> None:
    """Convert a public set (GSM8K, MATH-500, with the field's prompt template) or a jsonl of your own
    ``{"question", "answer"}`` objects (qa, with --data-source) into rlx prompt rows."""
    from functools import partial

    from rlx.store.targets import guard
    from rlx.tasks import gsm8k, math500, qa

    converters = {
        "gsm8k": gsm8k.convert,
        "math500": math500.convert,
        "qa": partial(qa.convert, data_source=data_source),
    }
    if dataset not in converters:
        raise UserError(f"unknown dataset {dataset!r}; convertible: {', '.join(converters)}")
    if (dataset == "qa") != (data_source is not None):
        raise UserError("--data-source names the rows' data_source of a qa set (and of no other): give it with qa")
    guard(output, "OUTPUT", "rlx convert", folder=False, inputs=[source])
    console.print(f"written {converters[dataset](source, output, split)}")


@app.command("materialize")
def materialize(
    run: Annotated[Path, typer.Argument(help="A run's work_dir, e.g. runs/demo.")],
    step: Annotated[int, typer.Option(help="The step whose policy to write.")],
    out: Annotated[Path | None, typer.Option(help="Where to write it; default: RUN/materialized/step-N.")] = None,
) -> None:
    """Write any step's policy as a HF folder: loaded from its checkpoint, or re-created by replaying
    the recorded updates after the newest checkpoint before it (each replayed step's fingerprint checked)."""
    from rlx.explore import Run
    from rlx.store.targets import guard

    if out is not None:
        guard(out, "--out", "rlx materialize", folder=True, inputs=[run])
    folder = Run(run).policy(step, out)
    console.print(f"step {step}'s policy written to {folder}")


@app.command("eval")
def evaluate(
    model_dir: Annotated[
        Path, typer.Argument(help="A HF model folder (e.g. runs/demo/hf/step-30), or a run's work_dir with --step.")
    ],
    data: Annotated[list[Path], typer.Option("--data", "-d", help="An rlx prompt dataset (repeatable).")],
    judger: Annotated[str | None, typer.Option(help="Judger for every set; default: by data_source.")] = None,
    n: Annotated[int, typer.Option(help="Samples per prompt (pass@k, maj@k).")] = 1,
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    max_tokens: Annotated[int, typer.Option(help="New tokens per response.")] = 512,
    output: Annotated[Path | None, typer.Option(help="Write the judged samples here (parquet).")] = None,
    params: Annotated[Path | None, typer.Option(help="Take rollout and judger settings from a params.yaml.")] = None,
    step: Annotated[int | None, typer.Option(help="With a run's work_dir: the step whose policy to score.")] = None,
    overrides: OverridesOpt = None,
) -> None:
    """Evaluate any HF model folder, or any step of a run, outside a run: accuracy, pass@k, maj@k per set."""
    from rich.table import Table

    from rlx.config import load
    from rlx.engines import Engines
    from rlx.explore import Run
    from rlx.stages.evaluate import SAMPLE_SCHEMA, evaluate_policy
    from rlx.store.artifacts import write_rows
    from rlx.store.targets import guard

    if output is not None:
        guard(output, "--output", "rlx eval", folder=False, inputs=[model_dir, *data])
    if step is not None:
        model_dir = Run(model_dir).policy(step)

    sets = [{"name": path.stem, "anno_path": str(path), "judger_name": judger} for path in data]
    sampling = {"n": n, "temperature": temperature, "do_sample": temperature > 0, "max_tokens": max_tokens}
    config = load(
        params,
        [
            f"load_from={model_dir}",
            f"tokenizer_path={model_dir}",
            f"evaluator_config.dataset_cfg={json.dumps(sets)}",
            f"evaluator_config.sample_params={json.dumps(sampling)}",
            *(overrides or []),
        ],
    )
    judges_every_set(config)  # before the model loads: a mistake in seconds, not after it
    engines = Engines(config)
    samples, metrics = evaluate_policy(config, engines.sampler_at(model_dir), engines.tokenizer, step=0)
    table = Table("metric", "value")
    for name, value in metrics.items():
        table.add_row(name, f"{value:.4f}")
    console.print(table)
    if output:
        write_rows(samples, output, schema=SAMPLE_SCHEMA, made_by="rlx eval")
        console.print(f"samples written to {output}")


def judges_every_set(config) -> None:
    """`rlx eval`'s sets each have a judger: by data_source from params, or the one ``--judger`` names."""
    from rlx.judgers import available
    from rlx.run.preflight import check_judging
    from rlx.tasks.data import load_rows

    try:
        check_judging(config, {d.anno_path: load_rows(d.anno_path) for d in config.evaluator_config.dataset_cfg})
    except UserError as problem:
        names = ", ".join(available())
        raise UserError(f"{problem}; or judge every set with --judger NAME ({names})") from None


@app.command("show")
def show(
    run: Annotated[Path, typer.Argument(help="A run's work_dir, e.g. runs/demo.")],
    step: Annotated[int | None, typer.Option(help="The step; default: the last completed one.")] = None,
    rows: Annotated[int, typer.Option(help="How many responses to list.")] = 24,
) -> None:
    """A step's responses, one line each at any terminal width: group.sample, question, response, the
    answer read from it and the gold, reward and advantage; the finish reason, how many
    updates stale the generating policy was (dataflow_config.max_staleness) and an agent's turns and calls
    where they say something. First, any step whose rollouts' engine held other weights than its policy."""
    from rlx.explore import Run, response_table

    explored = Run(run)
    if step is None:
        if not explored.steps():
            raise UserError(f"{run}: no step has finished yet; give one with --step")
        step = explored.steps()[-1]
    for problem in explored.unproven_rollouts():
        console.print(f"[bold red]{problem}[/]", highlight=False, soft_wrap=True)
    samples = explored.samples(step)
    title = f"{explored.name}, step {step}: mean reward {samples['reward'].mean():.3f}"
    console.print(response_table(samples.head(rows).to_dict("records"), title))
    if "reverse_kl" in samples:
        show_disagreements(explored.disagreements(step, top=10), step)


def show_disagreements(tokens, step: int) -> None:
    """A distilled step's tokens where the student's log-prob is furthest from its teacher's."""
    from rich.table import Table

    table = Table("group.sample", "position", "token", "student", "teacher", "gap", "teacher name",
                  title=f"step {step}: where the student disagrees most with its teacher (log-probs)")  # fmt: skip
    for row in tokens.itertuples():
        table.add_row(f"{row.group}.{row.sample}", str(row.position), repr(row.text), f"{row.student:.3f}",
                      f"{row.teacher:.3f}", f"{row.gap:+.3f}", row.teacher_name)  # fmt: skip
    console.print(table)


@app.command("compare")
def compare_runs(
    first: Annotated[Path, typer.Argument(help="A run's work_dir.")],
    second: Annotated[Path, typer.Argument(help="Another run's work_dir.")],
) -> None:
    """Two runs side by side: the params that differ, then their last metrics."""
    from rich.table import Table

    from rlx.explore import Run, compare

    params, last = compare(Run(first), Run(second))
    for title, frame in (("params that differ", params), ("last step", last)):
        table = Table("", *frame.columns, title=title)
        for name, values in frame.iterrows():
            table.add_row(str(name), *(str(v) if not isinstance(v, float) else f"{v:.4g}" for v in values))
        console.print(table)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one message and exit code 2, never a traceback."""
    quiet_libraries()
    try:
        app(args=argv, prog_name="rlx")
    except UserError as exc:
        err_console.print("[bold red]error:[/bold red]", escape(str(exc)), highlight=False)
        sys.exit(2)
