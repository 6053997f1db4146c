"""dvc.yaml's dependencies of the RL iteration, derived from the code and the config instead of kept by hand.

A stage's code is the static import closure (imports inside functions included) of its module and of
what every stage runs in (``rlx.stages``, ``rlx.engines``), restricted to rlx; a package whose every
module is in it is listed as its folder. The command line (``rlx.cli``) is left out: it parses the
arguments and calls ``run_stage``, and the train stage's replay it hands the engines re-creates a
policy that the stage's fingerprint dependency already pins. Its data are every dataset of the
``dataset_cfg`` lists it reads, as ``${...}`` references to params.yaml, so a changed path needs no
rewrite, a changed number of datasets does (``sync``, which `rlx fit` calls).
"""

from __future__ import annotations

import ast
import io
from functools import cache
from pathlib import Path

import yaml

from rlx.config import RLTrainerConfig
from rlx.config.loading import round_trip_yaml
from rlx.store.artifacts import write_text
from rlx.store.layout import STAGES

PACKAGE = Path(__file__).resolve().parents[1]  # src/rlx
RUNNER = ("rlx.stages", "rlx.engines")  # what every stage runs in
# What runs a stage's work in Ray actors (several workers; cpu_resources): by module name, as the actors
# load it. How prompts are dealt to the workers (rlx.workers.group) is no dep: the responses do not depend on it.
POLICY_STAGES = ("base", "rollout", "evaluate", "train", "checkpoint", "export")
EXTRA = {**dict.fromkeys(POLICY_STAGES, ("rlx.workers.worker",)), "judge": ("rlx.workers.judges",)}
DATASETS = {  # the dataset_cfg lists a stage reads
    "base": ("evaluator_config",),
    "prepare": ("replay_buffer_config",),
    "evaluate": ("evaluator_config",),
}


def module_file(name: str) -> Path | None:
    """The source file of rlx module ``name`` (a package's ``__init__.py``), or None if there is none."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@cache
def imports(name: str) -> frozenset[str]:
    """The rlx modules that module ``name`` imports anywhere in its code (inside functions too)."""
    tree = ast.parse(module_file(name).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(m for m in found if m.split(".")[0] == "rlx" and module_file(m))


def packages(name: str) -> list[str]:
    """``name`` and the packages above it, which importing it imports first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(roots) -> set[str]:
    """Every rlx module that importing ``roots`` can import, the roots and their packages included."""
    todo = [package for root in roots for package in packages(root)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(package for module in imports(name) for package in packages(module))
    return seen


def code_files(stage: str) -> set[str]:
    """The source files stage ``stage`` runs, relative to the project (``src/rlx/...``)."""
    modules = closure([f"rlx.stages.{stage}", *RUNNER, *EXTRA.get(stage, ())])
    return {project_path(module_file(m)) for m in modules}


def project_path(file: Path) -> str:
    """How dvc.yaml names a source file: under ``src/``, beside it (wherever this copy of rlx is installed)."""
    return f"src/{file.relative_to(PACKAGE.parent).as_posix()}"


def folded(files: set[str]) -> list[str]:
    """``files`` with each sub-package whose every module is among them listed as its folder."""
    out = set(files)
    for init in sorted((f for f in files if f.endswith("/__init__.py")), key=len):
        folder = init.removesuffix("/__init__.py")
        members = {project_path(p) for p in (PACKAGE.parent / folder.removeprefix("src/")).rglob("*.py")}
        if folder != "src/rlx" and members <= files and all(not m.startswith(folder + "/") for m in out - members):
            out = (out - members) | {folder}
    return sorted(out)


def expanded(deps: list[str]) -> set[str]:
    """The code files that dvc.yaml's ``deps`` entries name (folders file by file)."""
    files = set()
    for dep in (d for d in deps if d.startswith("src/")):
        path = PACKAGE.parent / dep.removeprefix("src/")
        files |= {project_path(p) for p in path.rglob("*.py")} if path.is_dir() else {dep}
    return files


def dataset_deps(stage: str, config: RLTrainerConfig) -> list[str]:
    """``${...}`` references to every dataset of the ``dataset_cfg`` lists the stage reads."""
    return [
        f"${{{section}.dataset_cfg[{i}].anno_path}}"
        for section in DATASETS.get(stage, ())
        for i in range(len(getattr(config, section).dataset_cfg))
    ]


def stage_deps(stage: str, declared: list[str], config: RLTrainerConfig) -> list[str]:
    """A stage's deps: its declared artifacts as they are, then its datasets, then its code."""
    artifacts = [d for d in declared if not d.startswith("src/") and ".dataset_cfg[" not in d]
    return [*artifacts, *dataset_deps(stage, config), *folded(code_files(stage))]


def sync(dvc_yaml: Path, config: RLTrainerConfig) -> bool:
    """Rewrite the iteration stages' deps in ``dvc_yaml`` (comments kept) where they differ from what
    the code and the config give; returns whether it changed the file."""
    round_trip = round_trip_yaml()
    round_trip.width = 4096  # no re-wrapped lines
    tree = round_trip.load(dvc_yaml.read_text())
    changed = False
    for name in STAGES:
        deps = tree["stages"][name]["deps"]
        wanted = stage_deps(name, list(deps), config)
        if list(deps) != wanted:
            deps[:] = wanted
            changed = True
    if changed:
        text = io.StringIO()
        round_trip.dump(tree, text)
        write_text(text.getvalue(), dvc_yaml)
    return changed


def undeclared_datasets(dvc_yaml: Path, config: RLTrainerConfig, stage: str) -> str | None:
    """Why ``dvc_yaml`` does not declare every dataset stage ``stage`` reads (a list grew or shrank since
    it was written), or None: `dvc repro` would then not rerun the stage when such a dataset changes."""
    if stage not in DATASETS or not dvc_yaml.is_file():
        return None
    declared = yaml.CSafeLoader(dvc_yaml.read_text()).get_single_data()["stages"][stage]["deps"]
    if [d for d in declared if ".dataset_cfg[" in d] == dataset_deps(stage, config):
        return None
    return (
        f"{dvc_yaml} does not declare the datasets of {', '.join(DATASETS[stage])} as the {stage} stage's deps "
        "(a dataset_cfg list changed length); run `rlx sync-deps` (rlx fit does it first) and repro again"
    )
