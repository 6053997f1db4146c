"""The prompt-row shape every rlx dataset uses (the verl/XTuner convention).

A row is ``{"data_source", "prompt": [chat messages], "ability", "reward_model": {"style",
"ground_truth"}, "extra_info": {"split", "index", "solution"}}``. ``data_source`` picks the judger;
``reward_model.ground_truth`` is the gold answer as a string.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlx.errors import UserError
from rlx.store.artifacts import write_rows
from rlx.tasks.data import jsonl_records

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def make_row(*, data_source: str, question: str, ground_truth: str, solution: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "solution": solution},
    }


def convert_jsonl(source: Path, output: Path, name: str, to_row: Callable[[dict, int], dict]) -> Path:
    """Read a public set's jsonl, turn each record into a row with ``to_row(record, index)``, and
    write them as parquet; a broken line is reported by number."""
    if not Path(source).is_file():
        raise UserError(f"{source}: no such file")
    rows = []
    for number, record in jsonl_records(source):
        try:
            if not isinstance(record, dict):
                raise TypeError(f"expected a JSON object, got {type(record).__name__}")
            rows.append(to_row(record, len(rows)))
        except KeyError as exc:
            raise UserError(f"{source}:{number}: not a {name} row (missing key {exc})") from None
        except (ValueError, TypeError) as exc:
            raise UserError(f"{source}:{number}: not a {name} row ({exc})") from None
    if not rows:
        raise UserError(f"{source}: no rows (the file is empty)")
    return write_rows(rows, output, made_by="rlx convert")
