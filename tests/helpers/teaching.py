"""Models taught a rollout by heart, so that agent tests see real tool calls from a model too small
to learn them from RL in a test's time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import AutoTokenizer

from rlx.agents.format import tool_turn_ids
from rlx.tasks.data import load_rows
from rlx.tokens import prompt_ids
from rlx.training.loading import load_policy

AGENT_RUN = [  # configs/agent_calculator.yaml's loop, with the test tool that logs its calls (helpers.agents)
    "dataflow_config.agent_loop_config.tools=[helpers.agents:ping]",
    "dataflow_config.agent_loop_config.max_turns=2",
    "dataflow_config.agent_loop_config.max_tool_response_tokens=16",
    "dataflow_config.agent_loop_config.tool_timeout=5.0",
    "dataflow_config.sample_params.max_tokens=128",  # the untrained tokenizer spells a call in ~55 tokens
]


def teach(
    model_dir: Path, folder: Path, examples: list[tuple[list[int], list[list[int]]]], steps: int, lr: float = 1e-2
) -> None:
    """The model in ``model_dir`` trained on ``(prompt, pieces)`` examples, saved to ``folder``: the pieces
    alternate the model's turns (in the loss) and the tools' tokens (out of it), as an agent rollout's mask.
    On the GPU where there is one (load_policy's choice), in float32."""
    model = load_policy(model_dir)
    sequences, labels = [], []
    for prompt, pieces in examples:
        sequences.append([*prompt, *(i for piece in pieces for i in piece)])
        labels.append([-100] * len(prompt) + [i if n % 2 == 0 else -100 for n, p in enumerate(pieces) for i in p])
    width = max(map(len, sequences))
    pad = lambda rows, value: torch.tensor([row + [value] * (width - len(row)) for row in rows])  # noqa: E731
    ids, targets = pad(sequences, 0).to(model.device), pad(labels, -100).to(model.device)
    attention = pad([[1] * len(row) for row in sequences], 0).to(model.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(steps):
        model(input_ids=ids, attention_mask=attention, labels=targets).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)


def agent_inputs(untrained_model, base: Path, problems: int = 8, lr: float = 1e-2):
    """The untrained model's inputs for an agent run: its first ``problems`` training problems (and 4 held-out
    ones), and the model taught on each to call ``ping`` and answer with the problem's gold answer (60
    steps: sampled, it gets the call right in about half of its rollouts, so rewards vary within a
    group). Shaped like the ``untrained_model`` fixture, for ``make_project``."""
    from rlx.config import AgentLoopConfig

    cfg, metrics = untrained_model
    data = base / "arith"
    data.mkdir(parents=True)
    for split, count in (("train", problems), ("test", 4)):
        table = pq.read_table(cfg.synthetic_task.output_dir / f"{split}.parquet")
        pq.write_table(table.slice(0, count), data / f"{split}.parquet")
    tokenizer = AutoTokenizer.from_pretrained(cfg.tiny_model.output_dir)
    schemas = AgentLoopConfig(tools=["helpers.agents:ping"]).toolbox().schemas
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tokenizer.eos_token_id
    call = [*encode('<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'), eos]
    result = tool_turn_ids(tokenizer, [{"role": "tool", "content": "pong"}])
    answer = lambda row: [*encode(f"#### {row['reward_model']['ground_truth']}"), eos]  # noqa: E731
    rows = load_rows(data / "train.parquet")
    examples = [(prompt_ids(tokenizer, row["prompt"], schemas), [call, result, answer(row)]) for row in rows]
    teach(cfg.tiny_model.output_dir, base / "model", examples, steps=60, lr=lr)
    shutil.copy2(cfg.tiny_model.metrics_path, base / "warm_start.json")
    tiny = cfg.tiny_model.model_copy(update={"output_dir": base / "model", "metrics_path": base / "warm_start.json"})
    task = cfg.synthetic_task.model_copy(update={"output_dir": data})
    return cfg.model_copy(update={"tiny_model": tiny, "synthetic_task": task}), metrics


def check_tool_tokens(rows: list[dict], tokenizer) -> int:
    """Assert what an agent run's rollouts.parquet rows must hold: the tools' tokens (mask 0) have no
    log-prob and the model's all have one, and each turn's tool tokens are the chat template's rendering
    of the results its calls show (cut where the response budget ran out). Returns how many rows call."""
    from rlx.agents.format import tool_turns_ids
    from rlx.explore import segments

    calling = 0
    for row in rows:
        assert [p is None for p in row["rollout_logprobs"]] == [m == 0 for m in row["response_mask"]]
        calls = json.loads(row["tool_calls"])
        turns = sorted({call["turn"] for call in calls})
        shown = [
            [{"role": "tool", "name": c["tool"], "content": c["result"]} for c in calls if c["turn"] == t]
            for t in turns
        ]
        found = [ids for trained, ids in segments(row["response_ids"], row["response_mask"]) if not trained]
        assert found == [ids[: len(got)] for ids, got in zip(tool_turns_ids(tokenizer, shown), found, strict=True)]
        calling += bool(calls)
    return calling
