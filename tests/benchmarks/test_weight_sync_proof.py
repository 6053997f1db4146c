"""What proving a rollout worker's copy costs (rlx.workers.worker.proven_copy: each tensor against the one
sent, the whole against the policy's recorded fingerprint) against the sync it proves (the sent tensors
loaded into the engine's model, rlx.engines.Engines.take_policy), at 25 M and 200 M parameters (random-init
Qwen3 with the demo's tokenizer), the two sides alternated in one process."""

from __future__ import annotations

import statistics

import pytest
from harness import alternate, random_model, record

from conftest import make_project
from rlx.config import load
from rlx.engines import Engines
from rlx.lineage.fingerprint import fingerprint
from rlx.store.artifacts import write_json
from rlx.store.layout import RunLayout
from rlx.workers.worker import proven_copy

ROUNDS = 5


@pytest.mark.parametrize("size", ["25M", "200M"])
def test_proving_the_copy_against_the_sync_it_proves(benchmark, tmp_path, tiny_model, size):
    project = make_project(tmp_path, tiny_model)
    folder, parameters = random_model(project, size, tmp_path)
    config = load(None, [f"load_from={folder}", f"tokenizer_path={folder}", f"work_dir={tmp_path / 'run'}"])
    paths, sent = RunLayout(config.work_dir).step(0), dict(Engines(config).blank_policy().state_dict())
    paths.dir.mkdir(parents=True)
    engines = Engines(config)
    engines.take_policy(0, sent)
    write_json(fingerprint(engines.policy(0)), paths.weights_fingerprint)
    sides = {
        "sync": lambda: engines.take_policy(0, sent),
        "proof": lambda: proven_copy("rollout worker 0", engines.policy(0), sent, paths),
    }
    seconds = alternate(benchmark, sides, ROUNDS).seconds
    ratios = [proof / sync for sync, proof in zip(seconds["sync"], seconds["proof"], strict=True)]
    record(f"weight_sync_proof/{size}", {"parameters": parameters, "seconds": seconds, "ratios": ratios})
    assert statistics.median(seconds["proof"]) > 0
