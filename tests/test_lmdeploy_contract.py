"""The LMDeploy contract: the stand-in the CPU tests run the backend against is LMDeploy 0.18.0.

``make lmdeploy-contract`` installs the pinned wheel without its dependencies into
``.venv-lmdeploy`` and runs this file with ``tests/test_rollout_backends.py`` (the backend run
against the stand-in). Here, the stand-in's every name, signature, field and attribute is compared
with the release's source, and the release's behaviours the backend relies on are found in it.
Without the unpacked release these tests skip, unless ``RLX_LMDEPLOY_REQUIRED=1`` (set by make).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import lmdeploy_source, lmdeploy_stand_in

ROOT = Path(__file__).resolve().parents[1]
RELEASE = Path(os.environ.get("RLX_LMDEPLOY_SOURCE", ROOT / ".venv-lmdeploy"))


@pytest.fixture(scope="module")
def release() -> Path:
    if not (RELEASE / "lmdeploy" / "__init__.py").is_file():
        message = f"no unpacked LMDeploy release in {RELEASE} (make lmdeploy-contract installs it)"
        if os.environ.get("RLX_LMDEPLOY_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    version = (RELEASE / "lmdeploy" / "version.py").read_text()
    assert "__version__ = '0.18.0'" in version, "the contract is for LMDeploy 0.18.0, the version the gpu extra pins"
    return RELEASE


def test_the_stand_in_has_the_release_signatures_fields_and_attributes(release):
    problems = lmdeploy_source.differences(Path(lmdeploy_stand_in.__file__), lmdeploy_stand_in.REAL, release)
    assert problems == []


def ordered(*patterns: str):
    """A source check: every pattern is there, in this order."""

    def check(source: str) -> bool:
        at = 0
        for pattern in patterns:
            found = re.compile(pattern).search(source, at)
            if found is None:
                return False
            at = found.end()
        return True

    return check


def absent(pattern: str):
    return lambda source: re.search(pattern, source) is None


# (module, function or class, check on its source, what the backend relies on)
BEHAVIOURS = [
    ("lmdeploy.serve.core.async_engine", "AsyncEngine.generate",
     ordered(r"if not isinstance\(request, PreprocessedRequest\):\s+raise TypeError"),
     "generate takes only what preprocess made (token ids go in through preprocess(input_ids=...))"),
    ("lmdeploy.serve.core.async_engine", "AsyncEngine.generate",
     ordered(r"token_ids \+= outputs\.token_ids\[:output_len - hit_stop_token\]",
             r"gen_config\.include_stop_str_in_output and finish_reason == 'stop'",
             r"token_ids = outputs\.token_ids\[-1:\]", r"logprobs = outputs\.logprobs\[-1:\]"),
     "a response comes in pieces, the stop token and its log-prob last and alone: rlx concatenates them"),
    ("lmdeploy.serve.core.async_engine", "AsyncEngine.preprocess",
     ordered(r"if \(messages is not None\) \^ \(input_ids is None\)"),
     "messages must be None when input_ids are given"),
    ("lmdeploy.pytorch.engine.logits_process", "FusedLogitsProcessor.__call__",
     ordered(r"elif self\.logprobs_mode == 'raw_logprobs':\s+logprobs = scores\.log_softmax", r"else:\s+logprobs = None",
             r"_process_temperature_"),
     "log-probs come back only with logprobs_mode='raw_logprobs', taken before temperature (so rlx "
     "samples training rollouts at temperature 1 with LMDeploy)"),
    ("lmdeploy.pytorch.engine.logits_process", "FusedLogitsProcessor.compute_logprobs",
     ordered(r"logprobs = raw_logprobs\.gather\(-1, indices\)", r"torch\.cat\(\[logprobs, topk_logprobs\]"),
     "the sampled token's log-prob is always among those returned, whatever the top-k"),
    ("lmdeploy.pytorch.engine.engine_loop", "EngineLoop._update_logprobs",
     ordered(r"dict\(zip\(indices, vals\)\)"),
     "per generated token, a {token_id: logprob} map"),
    ("lmdeploy.pytorch.engine.executor.uni_executor", "UniExecutor", absent(r"def update_params\("),
     "the single-GPU executor has no update_params (its base raises NotImplementedError): rlx gives "
     "update requests to its model agent"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent.update_params",
     ordered(r"args\[6\] = torch\.cuda\.current_device\(\)", r"ipc_tensor = func\(\*args\)",
             r"ForkingPickler\.loads\(pybase64\.b64decode\(serialized_data\)\)", r"if request\.finished:"),
     "tensors arrive as (func, args) with args[6] set to the device: rlx's in-process table relies on it"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent.sleep",
     ordered(r"device = 'cpu' if level == 1 else 'meta'"),
     "level-2 sleep discards the weights, so every weight is sent after waking them"),
    ("lmdeploy.serve.core.async_engine", "AsyncEngine", absent(r"def \w*(adapter|lora)\w*\("),
     "a running engine has no call that loads or replaces a LoRA adapter (adapters come from "
     "PytorchEngineConfig.adapters at start): rlx sends a LoRA policy as merged weights"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent", absent(r"def \w*(adapter|lora)\w*\("),
     "nor has its model agent: its update_params takes plain weights by the model's names"),
    ("lmdeploy.pytorch.engine.engine", "Engine.sleep",
     ordered(r"self\._cancel_and_end_all_sessions\(\)", r"await self\.executor\.sleep\(level\)"),
     "a sleep ends every session before it frees the KV cache, so the prefix trie is the only holder of the blocks "
     "rlx then evicts (rlx.samplers.lmdeploy_backend.drop_prefix_cache)"),
    ("lmdeploy.pytorch.engine.engine", "Engine.sleep", absent(r"block_trie|evict|prefix"),
     "a sleep still leaves the prefix trie as it was (LMDeploy #4917): when a release clears it itself, rlx's "
     "eviction after the sleep is redundant and can go"),
    ("lmdeploy.pytorch.engine.engine", "Engine.wakeup", absent(r"block_trie|evict|prefix"),
     "a wakeup still leaves the prefix trie as it was (LMDeploy #4917)"),
    ("lmdeploy.pytorch.engine.engine", "Engine.wakeup",
     ordered(r"if not self\._sleeping_tags:\s+# enable ADD_MESSAGE and ADD_SESSION\s+self\._unblock_new_inputs\(\)"),
     "requests are accepted again only once weights and KV cache are both awake"),
    ("lmdeploy.pytorch.paging.scheduler", "Scheduler.__init__",
     ordered(r"self\.block_trie = BlockTrie\(", r"enabled=self\.cache_config\.enable_prefix_caching"),
     "prefix caching is the scheduler's block trie, on with enable_prefix_caching: an agent's next turn, whose "
     "ids start with the conversation so far, reuses its cached blocks"),
]  # fmt: skip


@pytest.mark.parametrize("module, name, check, why", BEHAVIOURS, ids=[f"{b[1]}:{i}" for i, b in enumerate(BEHAVIOURS)])
def test_the_release_behaves_as_the_backend_assumes(release, module, name, check, why):
    source = lmdeploy_source.function_source(release, module, name)
    assert source is not None, f"{module}.{name} is not in the release"
    assert check(source), f"{module}.{name} no longer shows that {why}"


def test_the_engine_settings_the_gpu_check_sweeps_are_fields_of_the_releases_engine_config(release):
    """The GPU check restarts the engine with each setting of tests/helpers/engine_pace.ENGINE_SWEEP, passed
    through ``extra_engine_args`` as they are: a name 0.18.0's PytorchEngineConfig lacks would fail there."""
    from helpers.engine_pace import ENGINE_SWEEP

    fields = lmdeploy_source.fields(lmdeploy_source.definition(release, "lmdeploy", "PytorchEngineConfig"))
    swept = {name for setting in ENGINE_SWEEP.values() for name in setting.get("extra_engine_args", {})}
    assert swept and swept <= set(fields), sorted(swept - set(fields))


def test_after_a_sleep_no_prefix_cached_before_it_is_served(release):
    """LMDeploy 0.18.0's own scheduler and trie, run on CPU (tests/helpers/lmdeploy_prefix_cache.py): a
    53-token prompt prefilled, its session ended as a sleep ends every one, then the same prompt again is
    served 48 tokens from blocks a level-2 sleep has zeroed (LMDeploy #4917). After rlx's eviction every
    block is free and the prompt scores no hit."""
    done = subprocess.run(
        [sys.executable, "-m", "helpers.lmdeploy_prefix_cache", str(release.resolve())],
        cwd=ROOT / "tests", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"hits_kept": 48, "freed": 3, "free_blocks": 16, "hits_after": 0}
