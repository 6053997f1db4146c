"""The synthetic verifiable task of the CPU demo: arithmetic word problems with integer answers.

A problem chains ``num_operands`` quantities with ``+``, ``-`` or ``*`` (results never go below
zero). Its reference solution works one operation per line and ends with ``#### <answer>``, the
GSM8K convention, so the same answer extraction serves both tasks.

Train and test never share a question. ``holdout_by: question`` (the default, as in GSM8K) lets
the same arithmetic appear in both under other wording; ``holdout_by: arithmetic`` keeps every
held-out sequence of numbers and operations out of training, so accuracy measures arithmetic that
generalises rather than facts seen before.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from rlx.config import SyntheticTaskConfig
from rlx.errors import UserError
from rlx.store.artifacts import atomic_dir, write_rows, write_text
from rlx.store.targets import FOLDER_MARK, folder_mark
from rlx.tasks.rows import INSTRUCTION, make_row

DATA_SOURCE = "rlx/arith"

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jon", "Kemi", "Lea", "Mo", "Nia"]
ITEMS = ["apples", "books", "coins", "marbles", "stickers", "pencils", "cards", "shells", "stamps", "cookies"]
PHRASES = {
    "+": ["gets {n} more", "finds {n} more", "buys {n} more", "is given {n} more"],
    "-": ["gives away {n}", "loses {n}", "sells {n}", "uses {n}"],
    "*": ["makes the pile {n} times as big", "multiplies them by {n}"],
}


@dataclass(frozen=True)
class Problem:
    """One problem: its numbers and operations (the split key), and its wording."""

    numbers: tuple[int, ...]
    operations: tuple[str, ...]
    name: str
    item: str
    phrase_ids: tuple[int, ...]

    def key(self, holdout_by: str) -> tuple:
        """What must differ between a held-out and a training problem."""
        if holdout_by == "arithmetic":
            return self.numbers, self.operations
        return self.numbers, self.operations, self.name, self.item, self.phrase_ids

    def question(self) -> str:
        sentences = [f"{self.name} has {self.numbers[0]} {self.item}."]
        for number, op, phrase_id in zip(self.numbers[1:], self.operations, self.phrase_ids, strict=True):
            sentences.append(f"Then {self.name} {PHRASES[op][phrase_id].format(n=number)}.")
        sentences.append(f"How many {self.item} does {self.name} have now?")
        return " ".join(sentences)

    def solution(self) -> str:
        """The worked answer the warm start imitates: one operation per line, then ``#### answer``."""
        lines, total = [], self.numbers[0]
        for number, op in zip(self.numbers[1:], self.operations, strict=True):
            result = apply(total, op, number)
            lines.append(f"{total} {op} {number} = {result}")
            total = result
        lines.append(f"#### {total}")
        return "\n".join(lines)

    def answer(self) -> int:
        total = self.numbers[0]
        for number, op in zip(self.numbers[1:], self.operations, strict=True):
            total = apply(total, op, number)
        return total


def apply(left: int, op: str, right: int) -> int:
    return {"+": left + right, "-": left - right, "*": left * right}[op]


def sample_problem(rng: random.Random, cfg: SyntheticTaskConfig) -> Problem:
    """Draw one problem; a subtraction never takes more than there is."""
    total = rng.randint(1, cfg.max_operand)
    numbers, operations = [total], []
    for _ in range(cfg.num_operands - 1):
        op = rng.choice(cfg.operations)
        if op == "-" and total < 1:
            op = "+"
        high = min(cfg.max_operand, total) if op == "-" else cfg.max_operand
        number = rng.randint(1, high) if op != "*" else rng.randint(2, min(cfg.max_operand, 9))
        numbers.append(number)
        operations.append(op)
        total = apply(total, op, number)
    phrase_ids = tuple(rng.randrange(len(PHRASES[op])) for op in operations)
    return Problem(tuple(numbers), tuple(operations), rng.choice(NAMES), rng.choice(ITEMS), phrase_ids)


def generate_splits(cfg: SyntheticTaskConfig) -> dict[str, list[Problem]]:
    """Held-out problems first, then training problems whose arithmetic differs from all of them."""
    rng = random.Random(cfg.seed)
    test: list[Problem] = []
    test_keys: set[tuple] = set()
    for _ in range(cfg.test_size * 100):
        if len(test) == cfg.test_size:
            break
        problem = sample_problem(rng, cfg)
        if problem.key(cfg.holdout_by) not in test_keys:
            test_keys.add(problem.key(cfg.holdout_by))
            test.append(problem)
    train: list[Problem] = []
    for _ in range(cfg.train_size * 100):
        if len(train) == cfg.train_size:
            break
        problem = sample_problem(rng, cfg)
        if problem.key(cfg.holdout_by) not in test_keys:
            train.append(problem)
    if len(test) < cfg.test_size or len(train) < cfg.train_size:
        raise UserError(
            f"synthetic_task: only {len(test)} distinct held-out and {len(train)} training problems exist "
            f"with max_operand={cfg.max_operand} and num_operands={cfg.num_operands}; raise max_operand or "
            "lower test_size"
        )
    return {"train": train, "test": test}


def to_row(problem: Problem, split: str, index: int) -> dict:
    return make_row(
        data_source=DATA_SOURCE,
        question=f"{problem.question()} {INSTRUCTION}",
        ground_truth=str(problem.answer()),
        solution=problem.solution(),
        split=split,
        index=index,
    )


def write_dataset(cfg: SyntheticTaskConfig) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` in the folder ``cfg.output_dir`` (whole, marked as
    rlx init-data's: rlx.store.targets); return their paths."""
    splits = generate_splits(cfg)
    with atomic_dir(cfg.output_dir) as folder:
        for split, problems in splits.items():
            write_rows([to_row(p, split, i) for i, p in enumerate(problems)], folder / f"{split}.parquet")
        write_text(folder_mark("rlx init-data"), folder / FOLDER_MARK)
    return {split: cfg.output_dir / f"{split}.parquet" for split in splits}
