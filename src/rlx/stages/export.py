"""Stage ``export``: the policy as a standalone HF folder every ``hf_interval`` steps and at the end.

Output ``step-N/export.json``: whether the step exported, where, and each file's sha256. The folder
itself is ``hf/step-N`` (config, safetensors, tokenizer, chat template), written from the policy in
memory (or re-created by replay), so an export needs no checkpoint; only the newest ``hf_max_keep`` stay.
"""

from __future__ import annotations

import shutil

from rlx.config import RLTrainerConfig
from rlx.store.artifacts import write_json
from rlx.store.integrity import file_hash
from rlx.store.layout import StepPaths, step_number


def is_due(config: RLTrainerConfig, step: int, total_steps: int) -> bool:
    return step == total_steps or (config.hf_interval > 0 and step % config.hf_interval == 0)


def run(config: RLTrainerConfig, step: int, paths: StepPaths, engines) -> dict:
    layout = paths.run
    record = {"step": step, "exported": False}
    if is_due(config, step, paths.recorded_length()):
        target = engines.home.write_policy(step, layout.hf_export(step))
        files = {
            str(f.relative_to(target)): file_hash(f, "sha256")  # the Hub's content hash; 16 GB at 8 B
            for f in sorted(target.rglob("*"))
            if f.is_file()  # a LoRA export's adapter/ included
        }
        record.update(exported=True, path=str(target), files=files)
        prune_exports(layout, config.hf_max_keep)
    write_json(record, paths.export_record)
    return {"export/exported": int(record["exported"])}


def prune_exports(layout, keep: int) -> None:
    if keep < 0:
        return
    exports = sorted(layout.hf_export(0).parent.glob("step-*"), key=step_number)
    for old in exports[: max(0, len(exports) - keep)]:
        shutil.rmtree(old)


def outputs(paths) -> list:
    return [paths.export_record]
