"""dvc.yaml declares what each stage really reads: its code is the stage's import closure, its data every
dataset of the dataset_cfg lists it reads (the import graph's own rules: tests/test_house.py)."""

from __future__ import annotations

import yaml

from conftest import PARAMS, ROOT
from rlx import config as rlx_config
from rlx.lineage import dvcdeps
from rlx.store.layout import STAGES


def declared() -> dict[str, list[str]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stages[name]["deps"] for name in STAGES}


def test_code_deps_are_each_stages_import_closure():
    for name, deps in declared().items():
        files = dvcdeps.expanded(deps)
        wanted = dvcdeps.code_files(name)
        assert files == wanted, f"{name}: undeclared {sorted(wanted - files)}, not imported {sorted(files - wanted)}"


def test_every_dataset_of_every_list_a_stage_reads_is_a_dep():
    config = rlx_config.load(PARAMS)
    for name, deps in declared().items():
        assert [d for d in deps if ".dataset_cfg[" in d] == dvcdeps.dataset_deps(name, config), name
        assert dvcdeps.stage_deps(name, deps, config) == deps, f"{name}: run rlx.lineage.dvcdeps.sync"
    assert "${replay_buffer_config.dataset_cfg[0].anno_path}" in declared()["prepare"]
    two = rlx_config.load(
        PARAMS,
        [
            'evaluator_config.dataset_cfg=[{"name": "a", "anno_path": "a.parquet"}, '
            '{"name": "b", "anno_path": "b.parquet"}]'
        ],
    )
    assert dvcdeps.dataset_deps("evaluate", two) == [
        "${evaluator_config.dataset_cfg[0].anno_path}",
        "${evaluator_config.dataset_cfg[1].anno_path}",
    ]
    dvc_yaml = ROOT / "dvc.yaml"
    assert dvcdeps.undeclared_datasets(dvc_yaml, config, "evaluate") is None
    assert "run `rlx sync-deps`" in dvcdeps.undeclared_datasets(dvc_yaml, two, "evaluate")
    assert dvcdeps.undeclared_datasets(dvc_yaml, two, "train") is None  # train reads no dataset_cfg


def test_sync_rewrites_only_the_deps(tmp_path):
    dvc_yaml = tmp_path / "dvc.yaml"
    original = (ROOT / "dvc.yaml").read_text()
    dvc_yaml.write_text(original.replace("      - src/rlx/stages/judge.py\n", ""))
    assert dvcdeps.sync(dvc_yaml, rlx_config.load(PARAMS))
    assert dvc_yaml.read_text() == original
    assert not dvcdeps.sync(dvc_yaml, rlx_config.load(PARAMS))


def test_stages_that_do_not_judge_import_no_judger():
    for name in ("prepare", "train", "checkpoint", "export"):
        assert not any(f.startswith("src/rlx/judgers") for f in dvcdeps.code_files(name)), name
    for name in ("base", "rollout", "judge", "evaluate"):
        assert "src/rlx/judgers/rows.py" in dvcdeps.code_files(name), name
