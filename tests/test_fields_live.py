"""Every config field is live: read by rlx, refused unless default, or warned about where a backend
ignores it (issue 17). A static check: a field counts as read when its name is accessed as an
attribute or a string key somewhere in src/rlx outside the config package, or in dvc.yaml. A field of a class
used in several sections (SampleParams, DatasetConfig) is read if any of them reads it; the places
where only some do (dataflow's ``sample_params.n``, the eval sets' ``sample_ratio`` and ``seed``)
have their own tests in test_config.py and test_evaluate.py."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlx import config
from rlx.config import RLTrainerConfig, unsupported_reason
from rlx.samplers import LMDEPLOY_ONLY

ROOT = Path(__file__).resolve().parents[1]


def section_types(annotation) -> list[type[BaseModel]]:
    """The config sections an annotation holds: a model, or one inside list[...], X | None, ..."""
    found = [t for arg in typing.get_args(annotation) for t in section_types(arg)]
    return found + ([annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else [])


def leaves(model: type[BaseModel], prefix: str = ""):
    """``(path, model, name)`` for every leaf of the schema, nested sections and lists of them included."""
    for name, info in model.model_fields.items():
        inner = section_types(info.annotation)
        if inner:
            for section in inner:
                yield from leaves(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", model, name


LEAVES = list(leaves(RLTrainerConfig))
SOURCE = "\n".join(
    [p.read_text() for p in (ROOT / "src/rlx").rglob("*.py") if p.parent.name != "config"]
    + [(ROOT / "dvc.yaml").read_text()]
)


def is_read(name: str, source: str = SOURCE) -> bool:
    return re.search(rf"\.{name}\b|[\"']{name}[\"']", source) is not None


def refusal(model: type[BaseModel], name: str) -> str | None:
    return unsupported_reason(model.model_fields[name])


# Fields rlx reads but one backend ignores: warned about once per run (rlx.run.preflight.check_setup).
WARNED = {f"rollout_config.{name}": "read by the lmdeploy backend only" for name in LMDEPLOY_ONLY}


def test_the_walk_reaches_every_kind_of_leaf():
    paths = {path for path, _, _ in LEAVES}
    assert {"seed", "evaluator_config.dataset_cfg.sample_params.seed", "train_worker_cfg.optim_cfg.lr"} <= paths
    assert "load_checkpoint_cfg.checkpoint_path" in paths and len(paths) > 150


@pytest.mark.parametrize(("path", "model", "name"), LEAVES, ids=[leaf[0] for leaf in LEAVES])
def test_every_field_is_read_refused_or_warned(path, model, name):
    reason = refusal(model, name)
    if reason:  # refused: the default loads, anything else is one clear line
        section, _, _ = path.rpartition(".")
        default = model.model_fields[name].get_default(call_default_factory=True)
        other = "elsewhere" if default is None else not default if isinstance(default, bool) else default + 1
        with pytest.raises(config.ConfigError, match=f"{path}: kept for XTuner compatibility, not supported: "):
            config.load(None, [f"{section}.{name}={other}"])
        assert reason in model.model_fields[name].description
        return
    assert is_read(name), f"{path}: nothing in src/rlx reads it; make it live, or refuse it with unsupported()"
    if path in WARNED:
        assert WARNED[path] in (ROOT / "src/rlx/run/preflight.py").read_text()


@pytest.mark.parametrize(("path", "model", "name"), LEAVES, ids=[leaf[0] for leaf in LEAVES])
def test_every_field_has_a_description(path, model, name):
    assert model.model_fields[name].description, f"{path}: no description"


CENTRAL = {  # field: a paper its description cites
    "advantage_estimator_config.type": "2402.03300",
    "dataflow_config.prompt_repeat_k": "2402.03300",
    "dataflow_config.enable_dynamic_sampling": "2503.14476",
    "dataflow_config.sample_params.temperature": "2503.14476",
    "dataflow_config.sample_params.max_tokens": "2503.14476",
    "train_worker_cfg.optim_cfg.lr": "2402.03300",
    "train_worker_cfg.loss_cfg.kl_loss_coef": "GRPO",
    "train_worker_cfg.loss_cfg.use_kl_loss": "2402.03300",
    "train_worker_cfg.loss_cfg.loss_agg_mode": "2503.20783",
    "train_worker_cfg.loss_cfg.policy_loss_cfg.cliprange_low": "2507.18071",
    "train_worker_cfg.loss_cfg.policy_loss_cfg.cliprange_high": "2503.14476",
    "train_worker_cfg.loss_cfg.policy_loss_cfg.loss_type": "2507.18071",
    "judger_config.overlong_buffer.len": "DAPO",
    "train_worker_cfg.loss_cfg.rollout_correction.threshold_high": "Yao et al.",
    "train_worker_cfg.loss_cfg.rollout_correction.mode": "2110.00641",
}


@pytest.mark.parametrize("path", sorted(CENTRAL))
def test_central_rl_fields_cite_their_paper(path):
    model, name = next((m, n) for p, m, n in LEAVES if p == path)
    assert CENTRAL[path] in model.model_fields[name].description


def test_the_check_fails_on_a_field_nothing_reads():
    assert not is_read("bogus_unread_field")
    assert is_read("bogus_unread_field", SOURCE + "\nx = config.bogus_unread_field\n")
