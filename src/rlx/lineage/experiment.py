"""A finished run as a DVC experiment: `dvc exp show` lists runs side by side with their params and
final metrics, and `dvc exp diff A B` compares two.

Two things make it so. After each step, `rlx fit` writes the step's metrics to ``metrics.json`` in the
project's folder, a fixed path that dvc.yaml declares as its top-level metrics: DVC compares metrics
by path, and a step's own metrics files lie under the run's folder and its step (one column per run
and step). When the run ends, the workspace (params.yaml, dvc.lock, metrics.json and every tracked
file as it is now, on top of the current commit) is committed to the ref DVC keeps experiments
under, named after the run's folder and the commit it started from (``demo-1a2b3c4``), as
`dvc exp save -n NAME -f` would record it. The commit is
written from the workspace's files without touching them: `dvc exp save` swaps the workspace to the
current commit and back while it works, so a kill in between would leave params.yaml empty, and it
would record the stages again (DVC's run-cache entries included) after rlx already recorded them.

DVC's experiments keep the last step's lock: the run's other steps stay in its folder (each step's
lock copy, ``step-N/dvc.lock.gz``), which the experiment's commit points at through params.yaml.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlx.store.artifacts import write_json
from rlx.store.layout import RunLayout

SUMMARY = "metrics.json"  # in the project's folder; dvc.yaml's top-level `metrics`
RECORDED = ("params.yaml", "dvc.lock", SUMMARY)  # committed even where git does not track them


def write_summary(project: Path, layout: RunLayout, step: int) -> None:
    """``metrics.json``: step ``step``'s metrics (its latest evaluation's, where it did not evaluate), the
    run's folder and the step, for `dvc metrics show` and `dvc exp show`."""
    evaluated = next(
        (n for n in range(step, 0, -1) if layout.step(n).metrics_checked("evaluate").get("eval/evaluated")), 0
    )
    latest = layout.step(evaluated).metrics_checked("evaluate") if evaluated else layout.step(0).metrics_checked("base")
    merged = {**layout.step_metrics(step), **latest}
    numbers = {k: v for k, v in merged.items() if isinstance(v, int | float) and not k.startswith("time/")}
    write_json({"step": step, "evaluated_at": evaluated, **numbers}, project / SUMMARY)


def experiment_name(work_dir: Path, project: Path, baseline: str) -> str:
    """A run's experiment name, unique across commits (DVC looks a name up in every commit's experiments, so
    two commits' ``demo`` runs would make ``dvc exp apply demo`` ambiguous) and readable: the work_dir below
    ``runs/`` (folders joined by ``-``; outside the project, its last folder), then the commit the run
    started from, as git shortens it."""
    work_dir, project = Path(work_dir), Path(project).resolve()
    if work_dir.is_absolute():
        work_dir = work_dir.relative_to(project) if work_dir.is_relative_to(project) else Path(work_dir.name)
    parts = work_dir.parts
    folders = parts[1:] if len(parts) > 1 and parts[0] == "runs" else parts
    return f"{'-'.join(folders)}-{baseline[:7]}"


def committed_repository(project: Path):
    """The git repository ``project`` lies in, with a commit; ValueError says why there is none."""
    import pygit2

    found = pygit2.discover_repository(str(project))
    if found is None:
        raise ValueError(f"{project} is not in a git repository")
    repo = pygit2.Repository(found)
    if repo.head_is_unborn:
        raise ValueError("its git repository has no commit yet")
    return repo


def save(project: Path, work_dir: Path) -> tuple[str, str]:
    """Commit the workspace as the DVC experiment of the run in ``work_dir`` on top of the current commit
    (replacing the experiment of that run there); returns its name and the commit's id. ValueError says why it
    cannot be saved."""
    import pygit2
    from dvc.repo.experiments.refs import ExpRefInfo

    repo = committed_repository(project)
    name = experiment_name(work_dir, project, str(repo.head.target))
    ref = str(ExpRefInfo(baseline_sha=str(repo.head.target), name=name))
    if "/" in name or not pygit2.reference_is_valid_name(ref):
        raise ValueError(f"{name!r} is not a valid experiment name (git's rules for branch names)")
    tree = workspace_tree(repo, Path(project).resolve())
    signature = default_signature(repo)
    commit = repo.create_commit(None, signature, signature, f"rlx fit: run {name}", tree, [repo.head.target])
    repo.references.create(ref, commit, force=True)
    return name, str(commit)


def workspace_tree(repo, project: Path):
    """The current commit's tree with every tracked file as the workspace has it, and the project's
    ``RECORDED`` files."""
    import pygit2

    root = Path(repo.workdir).resolve()
    index = pygit2.Index()
    index.read_tree(repo.head.peel(pygit2.Commit).tree)
    recorded = {(project / name).relative_to(root).as_posix() for name in RECORDED}
    for relative in sorted(set(repo.status(untracked_files="no")) | recorded):
        file = root / relative
        if file.is_file():
            mode = pygit2.enums.FileMode.BLOB_EXECUTABLE if os.access(file, os.X_OK) else pygit2.enums.FileMode.BLOB
            index.add(pygit2.IndexEntry(relative, repo.create_blob_fromdisk(str(file)), mode))
        elif relative in index:
            index.remove(relative)
    return index.write_tree(repo)


def default_signature(repo):
    """The user's git identity, or rlx's where git has none configured."""
    import pygit2

    try:
        return repo.default_signature
    except (KeyError, pygit2.GitError):
        return pygit2.Signature("rlx", "rlx@localhost")
