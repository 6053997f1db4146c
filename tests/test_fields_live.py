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


# ---- XTuner's RLTrainer fields that rlx added in issue 32: each acts (log_dir and debug act in the run of
# tests/test_pipeline.py, whose tracker and metrics they change) -----------------------------------


def weights_damaged(folder: Path, drop: str) -> Path:
    """A copy of a model folder whose weights miss ``drop`` and hold a tensor the model lacks."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    del weights[drop]
    weights["model.extra.weight"] = weights["model.norm.weight"].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_strict_load_refuses_weights_that_do_not_match_and_names_them(untrained_model, tmp_path, caplog):
    import shutil

    import torch

    from rlx.errors import UserError
    from rlx.training.loading import load_policy

    drop = "model.layers.0.mlp.up_proj.weight"
    folder = weights_damaged(Path(shutil.copytree(untrained_model[0].tiny_model.output_dir, tmp_path / "m")), drop)
    with pytest.raises(UserError, match=rf"1 missing \({drop}\); 1 unexpected \(model.extra.weight\); .*strict_load"):
        load_policy(folder)
    first, again = (load_policy(folder, strict=False).state_dict()[drop] for _ in range(2))
    assert torch.equal(first, again), "a missing weight must be drawn the same at every load (fingerprints compare)"
    assert f"loaded with strict_load false; weights 1 missing ({drop})" in caplog.text


def test_skip_checkpoint_validation_checks_sizes_not_hashes_and_says_so(tmp_path, caplog):
    from rlx.errors import UserError
    from rlx.store.artifacts import write_json
    from rlx.store.integrity import folder_records
    from rlx.training.restore import check_files

    step = tmp_path / "step-2"
    (step / "trainer_state").mkdir(parents=True)
    state = step / "trainer_state" / "optim_states.pt"
    state.write_bytes(b"\0" * 64)
    write_json(folder_records([state], step), step / "checkpoint_outputs.json")
    state.write_bytes(b"\1" * 64)  # corrupted, its size unchanged
    with pytest.raises(UserError, match="checkpoint of step 2 is damaged .*contents differ from what was written"):
        check_files(config.load(None, [f"work_dir={tmp_path}"]), 2)
    check_files(config.load(None, [f"work_dir={tmp_path}", "skip_checkpoint_validation=true"]), 2)
    assert "checkpoint of step 2: its files' hashes are not checked (skip_checkpoint_validation)" in caplog.text
    state.write_bytes(b"\1" * 63)  # truncated: the sizes are still checked
    with pytest.raises(UserError, match="63 bytes, 64 when written"):
        check_files(config.load(None, [f"work_dir={tmp_path}", "skip_checkpoint_validation=true"]), 2)


def test_display_all_workers_log_acts_only_where_there_are_ray_actors():
    with pytest.raises(config.ConfigError, match="display_all_workers_log true: the run has no Ray actors"):
        config.load(None, ["display_all_workers_log=true"])
    assert config.load(None, ["display_all_workers_log=true", "cpu_resources={num_workers: 1}"]).has_actors


def test_an_actor_not_shown_keeps_its_lines_in_log_dir(tmp_path):
    """Ray streams an actor's stdout and stderr to the console, each line after the actor's repr (its label);
    an actor not shown writes them to log_dir/workers/ instead (checked in a process of its own, whose
    descriptors it replaces)."""
    import subprocess
    import sys

    from conftest import child_env

    script = f"""
import logging, sys
from rlx.config import load
from rlx.workers.actors import Actor
config = load(None, ["log_dir={tmp_path / "logs"}", "cpu_resources={{num_workers: 2}}"])
shown = Actor("worker 0", True, config, {str(tmp_path)!r})
print(repr(shown), "shown", flush=True)
hidden = Actor("judge 1", False, config, {str(tmp_path)!r})
print(repr(hidden), "hidden", flush=True)
logging.getLogger("rlx.judgers").warning("a judger's warning")
"""
    done = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "worker 0 shown\n" and "judger's warning" not in done.stderr
    kept = (tmp_path / "logs" / "workers" / "judge-1.log").read_text()
    assert "judge 1 hidden" in kept and "a judger's warning" in kept
    assert sorted(p.name for p in (tmp_path / "logs" / "workers").iterdir()) == ["judge-1.log"]
