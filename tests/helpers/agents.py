"""Tools and environments used by the agent tests, loaded by name as a user's own would be."""

import os
import threading
import time

from rlx.samplers import InBatches


def add(a: int, b: int) -> str:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return str(a + b)


def broken(text: str) -> str:
    """A tool with a bug.

    Args:
        text: Anything.
    """
    raise RuntimeError("tool bug")


def sleepy(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "awake"


def numeric(text: str) -> int:
    """Answers with a number instead of text.

    Args:
        text: Anything.
    """
    return 42


def undocumented(text):
    return text


class Counter:
    """An environment: a counter per rollout, the reward its final value."""

    def reset(self, row: dict) -> str:
        self.count = 0
        return f"Count to {row['ground_truth']}."

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return str(self.count)

    def reward(self) -> float:
        return float(self.count)


class Picky(Counter):
    """An environment whose ``reset`` fails on some rows (a user's bug), as the rollout of such a row must survive."""

    def reset(self, row: dict) -> str:
        if row["ground_truth"].startswith("-"):
            raise ValueError(f"cannot count to {row['ground_truth']}")
        return super().reset(row)


TOOL_LOG = "tool_calls.log"  # in the working directory of the process that calls the tool


def ping() -> str:
    """Answer "pong", noting the call (with the caller's pid) in a log, so a test sees every call made."""
    with open(TOOL_LOG, "a") as log:
        log.write(f"{os.getpid()}\n")
    return "pong"


def pause() -> str:
    """Wait 50 ms, as a tool that calls a service would, then answer."""
    time.sleep(0.05)
    return "ok"


class Recorded(InBatches):
    """A sampler whose ``generate`` calls are kept (contexts, parameters, seeds) and timed: what an agent
    loop asked the model for, turn by turn, to check or to make again without the tools between the turns."""

    def __init__(self, sampler):
        self.sampler, self.calls, self.seconds = sampler, [], []

    def generate(self, prompts, params, seed):
        self.calls.append((prompts, params, seed))
        started = time.perf_counter()
        generated = self.sampler.generate(prompts, params, seed=seed)
        self.seconds.append(time.perf_counter() - started)
        return generated


def exits() -> str:
    """A tool that ends the program as a careless library might."""
    raise SystemExit(3)


def interrupted() -> str:
    raise KeyboardInterrupt("from a library")


class Stuck(Counter):
    """An environment whose ``reset`` never returns on some rows (a user's bug waiting on a service)."""

    def reset(self, row: dict) -> str:
        if row["ground_truth"] == "hang":
            threading.Event().wait()
        if row["ground_truth"] == "exit":
            raise SystemExit(1)
        return super().reset(row)


SPINS: dict[str, int] = {}  # label -> loops done by spin(label) so far
CLEANED: list[str] = []  # labels whose spin ran its cleanup


def spin(label: str) -> str:
    """A CPU-bound tool that never returns: Python code looping, its count in SPINS.

    Args:
        label: The key of its count.
    """
    SPINS[label] = 0
    try:
        while True:
            try:
                SPINS[label] += 1
            except Exception:  # noqa: BLE001 - as a tool's own error handling would: a stop is not an Exception
                pass
    finally:
        CLEANED.append(label)
