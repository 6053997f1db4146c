"""Security: model output is never code, weights are never pickles, secrets never reach disk.

- no ``eval``/``exec``/``compile``/unpickling anywhere in rlx's source (an AST scan);
- policies are saved and loaded as safetensors only; DeepSpeed's optimizer state (``*.pt``, the one
  pickle-based format in a run) is loaded with ``weights_only=True``, so a tampered file cannot run code;
- a finished run's artifacts hold no pickles, and the W&B API key of its environment is in none of them;
- judgers see a bounded tail of each response, however long the model made it.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import ROOT, make_project
from rlx.config import JudgerConfig
from rlx.errors import UserError

SECRET = "wandb-secret-0123456789abcdef"
UNSAFE_CALLS = {
    "eval", "exec", "compile", "__import__", "pickle.load", "pickle.loads", "marshal.load", "marshal.loads",
    "dill.load", "dill.loads", "cloudpickle.load", "cloudpickle.loads", "yaml.load", "yaml.unsafe_load",
    "shelve.open",
}  # fmt: skip
SHORT_ANSWERS = ["dataflow_config.sample_params.max_tokens=8", "evaluator_config.sample_params.max_tokens=8"]
PICKLE_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt"}


def dotted(node: ast.expr) -> str:
    """``a.b.c`` for a call's function, or '' when it is not a plain name chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = dotted(node.value)
        return f"{parent}.{node.attr}" if parent else ""
    return ""


def unsafe_calls(source: Path) -> list[str]:
    """Forbidden calls in a source file. ``module.function`` counts only where ``module`` is that imported
    module (``yaml.load`` on a ruamel ``YAML()`` object named ``yaml`` is a safe round-trip load)."""
    tree = ast.parse(source.read_text(), filename=str(source))
    modules = {
        alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        if "." in name and name.rsplit(".", 1)[0] not in modules:
            continue
        weights_only = any(
            k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        )
        if name in UNSAFE_CALLS or (name == "torch.load" and not weights_only):
            found.append(f"{source}:{node.lineno}: {name}(...)")
    return found


def test_no_code_is_ever_evaluated_or_unpickled_in_rlx():
    sources = sorted((ROOT / "src" / "rlx").rglob("*.py"))
    assert len(sources) > 30
    assert [hit for source in sources for hit in unsafe_calls(source)] == []


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan above is only worth something if it fails on the calls it forbids."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch, pickle\neval('1')\ntorch.load('x')\ntorch.load('x', weights_only=True)\npickle.loads(b'')\n"
    )
    assert [hit.rsplit(": ", 1)[1] for hit in unsafe_calls(sample)] == [
        "eval(...)",
        "torch.load(...)",
        "pickle.loads(...)",
    ]


@pytest.fixture(scope="module")
def finished(untrained_model, tmp_path_factory):
    """A short `rlx fit` (one step, the last: it evaluates and exports; W&B offline) run with a W&B API key in
    its environment."""
    from rlx.run.fit import fit

    project = make_project(tmp_path_factory.mktemp("secure"), untrained_model)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_API_KEY", SECRET)
        fit(project / "params.yaml", ["rollout_steps=1", *SHORT_ANSWERS])
    return project


def run_files(project: Path) -> list[Path]:
    return [path for path in (project / "runs" / "demo").rglob("*") if path.is_file()]


def test_the_api_key_is_in_no_file_of_the_run(finished):
    files = [path for path in finished.rglob("*") if path.is_file() and ".git" not in path.parts]
    assert any(path.match("runs/demo/wandb/*/run-*.wandb") for path in files), "the run logged no W&B data"
    assert (finished / "dvc.lock").is_file() and (finished / "runs" / "demo" / "tracker.jsonl").is_file()
    assert [str(path) for path in files if SECRET.encode() in path.read_bytes()] == []


def test_policies_are_safetensors_and_artifacts_hold_no_pickles(finished):
    files = run_files(finished)
    policies = {path.parent for path in files if path.name == "config.json"}
    assert {p.relative_to(finished / "runs/demo").as_posix() for p in policies} >= {
        "step-0/policy",
        "step-1/policy",
        "hf/step-1",
    }
    for folder in policies:
        assert list(folder.glob("*.safetensors")), folder
    # DeepSpeed's optimizer state is the one pickle-based format: it stays in trainer_state folders.
    pickled = [path for path in files if path.suffix in PICKLE_SUFFIXES and "trainer_state" not in path.parts]
    assert pickled == []
    for path in files:
        if path.suffix == ".parquet":
            schema = pq.read_schema(path)
            assert not any(binary_inside(f.type) for f in schema), f"{path} has a binary column"
            assert not (schema.metadata or {}), f"{path} carries metadata (e.g. pickled pandas objects)"
        elif path.suffix in {".json", ".jsonl"}:  # plain JSON data, line by line for .jsonl
            lines = path.read_text(encoding="utf-8").splitlines() if path.suffix == ".jsonl" else [path.read_text()]
            assert all(json.loads(line) is not None for line in lines if line.strip())


def binary_inside(kind: pa.DataType) -> bool:
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return True
    return any(binary_inside(kind.field(i).type) for i in range(kind.num_fields))


class Payload:
    """What a tampered checkpoint might hold: unpickling it would create ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_optimizer_state_loads_weights_only_and_refuses_a_tampered_file(finished, monkeypatch, tmp_path):
    from rlx.config import load
    from rlx.training.trainer import PolicyTrainer

    config = load(finished / "params.yaml")
    step = finished / "runs" / "demo" / "step-1"
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    PolicyTrainer(config.train_worker_cfg, step / "policy", step / "trainer_state", 4)
    assert calls and all(weights_only is True for weights_only in calls)

    tampered = tmp_path / "trainer_state"
    shutil.copytree(step / "trainer_state", tampered)
    state = next((step / "trainer_state").rglob("*optim_states.pt"))
    marker = tmp_path / "code-ran"
    torch.save({"optimizer_state_dict": Payload(marker)}, tampered / state.relative_to(step / "trainer_state"))
    with pytest.raises(UserError) as refused:
        PolicyTrainer(config.train_worker_cfg, step / "policy", tampered, 4)
    message = str(refused.value)
    assert f"{tampered}/" in message and "refused: it holds more than tensors and DeepSpeed's records" in message
    assert "nothing in it was run" in message and "weights_only" not in message
    assert not marker.exists(), "unpickling the tampered state ran its code"


def test_judgers_see_a_bounded_tail_of_each_response():
    from rlx.judgers import Panel

    assert JudgerConfig().max_response_chars == 16000
    panel = Panel(
        JudgerConfig(
            reward_judger_configs=[
                {"judger_name": "custom", "data_source": ["x"], "options": {"function": "helpers.judges:length"}}
            ],
            max_response_chars=100,
        )
    )
    long_response = "x" * 1_000_000 + "#### 4"
    verdict = panel.judge(long_response, "x", "4")
    assert verdict.error is None and verdict.reward == 100.0
    gsm8k = Panel(JudgerConfig(reward_judger_configs=[{"judger_name": "gsm8k", "data_source": ["x"]}]))
    assert gsm8k.judge(long_response, "x", "4").reward == 1.0  # the answer, at the end, is still read
