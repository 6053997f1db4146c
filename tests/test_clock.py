"""rlx.clock: a step's parts are counted once, nested ones apart, other threads' not at all."""

from __future__ import annotations

import threading
import time

import pytest

from rlx import clock


def in_the_background():
    with clock.part("checkpoint"):
        time.sleep(0.02)


def test_nested_parts_count_once_and_other_threads_parts_are_not_the_steps():
    with clock.step() as parts:
        started = time.perf_counter()
        with clock.part("rollout") as rollout:
            time.sleep(0.02)
            with clock.part("weight_sync") as sync:
                time.sleep(0.03)
        with clock.part("rollout"):  # a part met twice adds up
            time.sleep(0.01)
        elsewhere = threading.Thread(target=in_the_background)
        elsewhere.start()
        elsewhere.join()  # waited for in no part: its time is the step's "other"
        seconds = time.perf_counter() - started
    assert set(parts) == {"rollout", "weight_sync"} and sync.seconds >= 0.03 and rollout.seconds >= 0.05
    assert parts["weight_sync"] == sync.seconds and parts["rollout"] >= rollout.seconds - sync.seconds + 0.01
    times = clock.breakdown(seconds, parts)
    assert sum(times.values()) == pytest.approx(seconds) and times["time/step/other"] >= 0.02
    with clock.part("prepare") as outside:  # outside a step: timed, recorded nowhere
        pass
    assert outside.seconds >= 0 and "prepare" not in parts
