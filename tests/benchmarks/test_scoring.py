"""Scoring only the response positions (``logits_to_keep``) against every position, at a real
vocabulary: one forward and backward of the policy-gradient log-probs on a random Qwen3 with Qwen's
151,936 tokens, 8 sequences of about 280 prompt and 200 response tokens, each side in a fresh process
(its peak RSS its own), the sides alternating for 3 rounds."""

from __future__ import annotations

from harness import record, run_workload

ROUNDS = 3
SHAPE = {"vocab": 151_936, "prompt_len": 300, "response_len": 200, "rows": 8}


def test_scoring_response_positions_vs_whole_sequence(benchmark, tmp_path):
    measured = {"whole": [], "responses": []}

    def one_round():
        for side in measured:
            measured[side].append(run_workload("scoring", tmp_path, whole=side == "whole", **SHAPE))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    for side, runs in measured.items():
        record(f"scoring/{side}", {"shape": SHAPE, "runs": runs})
    assert all(
        r["peak_rise_mb"] < w["peak_rise_mb"] for r, w in zip(measured["responses"], measured["whole"], strict=True)
    )
