"""The checkpoint engine's host copies (rlx.training.safe_checkpoint): independent of what training does next,
each shared tensor copied once. From a GPU they are page-locked: tests/gpu measures that path."""

from __future__ import annotations

import pytest
import torch

from rlx.training.safe_checkpoint import host_copy


def test_a_host_copy_is_independent_and_copies_a_shared_tensor_once():
    weight = torch.arange(6.0).view(2, 3)
    state = {"module": {"embed": weight, "head": weight}, "moments": [weight.t()], "step": 3}
    copies: dict = {}
    copied = host_copy(state, copies)
    weight.add_(100)  # the next update
    assert torch.equal(copied["module"]["embed"], torch.arange(6.0).view(2, 3))
    assert copied["module"]["embed"] is copied["module"]["head"]  # tied: one copy
    assert torch.equal(copied["moments"][0], torch.arange(6.0).view(2, 3).t()) and copied["step"] == 3
    assert len(copies) == 2  # the weight and its transposed view


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the call where no GPU is: tests/gpu runs it")
def test_the_page_locked_copy_is_a_call_torch_accepts():
    """Without a GPU the page-locked path cannot run; torch must still know its arguments (a renamed or
    dropped one would be a TypeError on the GPU machine only)."""
    with pytest.raises(RuntimeError, match="pin_memory"):
        torch.empty_like(torch.ones(2), device="cpu", pin_memory=True)


def test_background_writes_run_one_at_a_time_in_order_and_an_error_surfaces_at_the_next_wait():
    """rlx.store.background: the checkpoint writer of the run's process and of every worker rank."""
    import threading
    import time

    from rlx.store.background import BackgroundWriter

    writer, log, running = BackgroundWriter("rlx-test-write"), [], threading.Lock()

    def write(name: str, seconds: float) -> None:
        assert running.acquire(blocking=False), "two writes at once"
        time.sleep(seconds)
        log.append(name)
        running.release()

    writer.start(write, "first", 0.2)
    writer.start(write, "second", 0.0)  # waits for the first to end
    assert log == ["first"] and writer.wait() >= 0.0 and log == ["first", "second"]
    writer.start(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.wait()
    writer.close()
