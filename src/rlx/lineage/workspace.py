"""The workspace against its last commit. As in DVC, params.yaml is the workspace's experiment: every run
writes its parameters there, and the next run starts from them. So a run says which fields differ from the
committed params.yaml, and `rlx reset` puts the committed pipeline back (params, dvc.yaml, dvc.lock and the
data they record), as `git checkout` plus `dvc checkout` would.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rlx.config import ConfigError, RLTrainerConfig, validated
from rlx.config.loading import changed
from rlx.errors import UserError
from rlx.lineage.experiment import committed_repository

PIPELINE_FILES = ("params.yaml", "dvc.yaml", "dvc.lock")  # what a run rewrites besides its work_dir
SHOWN = 4  # differing fields named in the one line; the rest counted


def committed_text(project: Path, name: str) -> str | None:
    """``name`` (in ``project``) as the repository's last commit holds it; None outside git, before the
    first commit, or where the file is not committed."""
    try:
        repo = committed_repository(project)
    except ValueError:
        return None
    path = (Path(project).resolve() / name).relative_to(Path(repo.workdir).resolve()).as_posix()
    try:
        return repo.revparse_single(f"HEAD:{path}").data.decode()
    except KeyError:
        return None


def differences_from_committed(params: Path, config: RLTrainerConfig) -> str | None:
    """One line naming the fields in which ``config`` differs from the committed params file (``run``,
    rlx's own pointer, left out), or None where they agree or nothing is committed."""
    text = committed_text(params.parent, params.name)
    try:
        committed = validated(yaml.safe_load(text), "committed") if text else None
    except (yaml.YAMLError, ConfigError):
        return None  # a commit whose params no longer validate has no field-by-field comparison
    if committed is None:
        return None
    trees = [c.model_dump(mode="json", exclude={"run"}) for c in (committed, config)]
    fields = [f"{path} {old!r} -> {new!r}" for path, old, new in changed(*trees)]
    if not fields:
        return None
    more = f" and {len(fields) - SHOWN} more" if len(fields) > SHOWN else ""
    return (
        f"{params.name} differs from its committed version in {len(fields)} field(s): {', '.join(fields[:SHOWN])}"
        f"{more}; `rlx reset` puts the committed one back"
    )


def reset(project: Path) -> list[str]:
    """params.yaml, dvc.yaml and dvc.lock as committed, then the data they record as DVC's cache holds it;
    returns the files put back. The caller holds the repository's lock, so no run is disturbed."""
    project = Path(project).resolve()
    texts = {name: committed_text(project, name) for name in PIPELINE_FILES}
    if texts["params.yaml"] is None:
        raise UserError(f"{project}: no committed params.yaml to return to (a git repository with a commit)")
    restored = [name for name, text in texts.items() if text is not None and restore(project / name, text)]
    recorded = yaml.safe_load(texts["dvc.lock"] or "{}") or {}
    checkout_recorded_data(project, sorted(recorded.get("stages", {})))
    return restored


def restore(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` if it differs; whether it did."""
    from rlx.store.artifacts import write_text

    if path.is_file() and path.read_text() == text:
        return False
    write_text(text, path)
    return True


def checkout_recorded_data(project: Path, stages: list[str]) -> None:
    """The outputs of the ``stages`` dvc.lock records, from DVC's cache (a missing entry is rebuilt by
    `dvc repro`); the stages it does not record have nothing to check out."""
    from dvc.exceptions import CheckoutError
    from dvc.repo import Repo

    if not stages:
        return
    with Repo(str(project)) as repo:
        try:
            repo.checkout(targets=stages, force=True)
        except CheckoutError as missing:
            raise UserError(
                f"params.yaml, dvc.yaml and dvc.lock are as committed, but DVC's cache lacks some of the data they "
                f"record ({len(missing.target_infos)} outputs); `dvc repro` builds them again"
            ) from None
