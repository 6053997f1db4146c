"""Shared fixtures: the demo task and the tiny model are built once per session, in a temp folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from rlx import config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
DATA = ROOT / "data"


def demo_config(base: Path, *overrides: str):
    """The demo's params with every output under ``base``."""
    return config.load(
        PARAMS,
        [
            f"synthetic_task.output_dir={base / 'arith'}",
            f"tiny_model.output_dir={base / 'tiny-qwen3'}",
            f"tiny_model.metrics_path={base / 'warm_start.json'}",
            *overrides,
        ],
    )


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory):
    from rlx.tasks.arith import write_dataset

    cfg = demo_config(tmp_path_factory.mktemp("demo"))
    write_dataset(cfg.synthetic_task)
    return cfg


@pytest.fixture(scope="session")
def tiny_model(demo_data):
    """The demo's base model, built exactly as `rlx init-model params.yaml` builds it."""
    from rlx.tiny_model import build

    return demo_data, build(demo_data)
