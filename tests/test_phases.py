"""A long phase says how far it is and how long it has left, at most every few seconds; a short one is silent."""

from __future__ import annotations

from rlx import phases


def test_a_long_phase_prints_progress_lines_a_short_one_none(monkeypatch, capsys):
    now = [100.0]
    monkeypatch.setattr(phases.time, "monotonic", lambda: now[0])
    quick = phases.Phase("quick", 3)
    for _ in range(3):
        quick.advance()
    slow = phases.Phase("warm start", 10, every=5.0)
    for _ in range(10):
        now[0] += 2.0
        slow.advance()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warm start: 3/10, 6 s so far, about 14 s left",
        "warm start: 6/10, 12 s so far, about 8 s left",
        "warm start: 9/10, 18 s so far, about 2 s left",
    ]
