"""The prompt-row shape every rlx dataset uses (the verl/XTuner convention).

A row is ``{"data_source", "prompt": [chat messages], "ability", "reward_model": {"style",
"ground_truth"}, "extra_info": {"split", "index", "solution"}}``. ``data_source`` picks the judger;
``reward_model.ground_truth`` is the gold answer as a string.
"""

from __future__ import annotations

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def make_row(*, data_source: str, question: str, ground_truth: str, solution: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "solution": solution},
    }
