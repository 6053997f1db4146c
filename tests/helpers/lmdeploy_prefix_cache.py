"""LMDeploy 0.18.0's own scheduler and prefix-cache trie, run on CPU, with rlx's eviction after a sleep.

Run as ``python -m helpers.lmdeploy_prefix_cache RELEASE`` (from tests/), in a process of its own: the
release's package is imported there without its ``__init__`` (which starts the serving stack), a module
the paging code only needs to load (pybase64, mmengine, xgrammar: image coding, a registry, grammars)
stubbed; every line that schedules, caches and evicts is the release's. It prints what it found as JSON.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from unittest import mock

BLOCK, BLOCKS = 16, 16


def import_release(root: Path) -> None:
    for _ in range(20):
        for name in [name for name in sys.modules if name.split(".")[0] == "lmdeploy"]:
            del sys.modules[name]
        package = types.ModuleType("lmdeploy")
        package.__path__ = [str(root / "lmdeploy")]
        sys.modules["lmdeploy"] = package
        try:
            importlib.import_module("lmdeploy.pytorch.paging.scheduler")
            importlib.import_module("lmdeploy.pytorch.strategies.ar.sequence")
            return
        except ModuleNotFoundError as missing:
            if missing.name.split(".")[0] == "lmdeploy":
                raise
            sys.modules[missing.name] = mock.MagicMock(name=missing.name)
    raise RuntimeError("the release's paging code needs more than 20 modules this environment lacks")


def scheduler():
    """A scheduler as the engine makes one with ``enable_prefix_caching`` (rlx's agent rollouts)."""
    from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig
    from lmdeploy.pytorch.messages import SequenceMeta
    from lmdeploy.pytorch.paging.scheduler import Scheduler
    from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy

    return Scheduler(
        scheduler_config=SchedulerConfig(
            max_batches=2, max_session_len=256, max_request_output_len=64, eviction_type="recompute"
        ),
        cache_config=CacheConfig(
            max_batches=2, block_size=BLOCK, num_cpu_blocks=4, num_gpu_blocks=BLOCKS, enable_prefix_caching=True
        ),
        seq_meta=SequenceMeta(BLOCK, strategy=ARSequenceStrategy()),
    )


def hit_tokens(engine, session: int, prompt: list[int]) -> int:
    """The prompt's prefill scheduled in a new session, then the session ended (as a sleep ends every one):
    how many of its tokens the prefix cache served."""
    engine.block_trie.stats.reset()
    engine.add_session(session).add_sequence(prompt)
    engine.schedule(is_prefill=True)
    engine.end_session(session)
    return engine.block_trie.stats.num_hit_tokens


def main(release: Path) -> dict:
    import_release(release)
    from rlx.samplers.lmdeploy_backend import drop_prefix_cache

    engine, prompt = scheduler(), list(range(1, 54))  # three full blocks and five tokens
    hit_tokens(engine, 0, prompt)
    kept = hit_tokens(engine, 1, prompt)  # what a sleep alone leaves: the blocks, now zeros, served again
    freed = drop_prefix_cache(engine)
    free = engine.block_manager.get_num_free_gpu_blocks()
    return {"hits_kept": kept, "freed": freed, "free_blocks": free, "hits_after": hit_tokens(engine, 2, prompt)}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
