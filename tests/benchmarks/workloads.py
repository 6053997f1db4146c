"""What the benchmarks run in a child process of their own: a fresh interpreter per measurement, so
peak memory (the process's RSS high-water mark) belongs to that workload alone and DeepSpeed's and
accelerate's process-wide set-up cannot meet in one process.

Usage: ``python workloads.py KIND ARGS_JSON OUT_JSON``; ``KIND`` is one of :data:`WORKLOADS`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path


def peak_rss_mb() -> float:
    """This program's RSS high-water mark so far. Not ``getrusage``'s ``ru_maxrss``: Linux carries that
    over from the forking parent across exec, so a child would start at pytest's size."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def step_mark(step: int, started: float) -> dict:
    """When a step ended and the memory then."""
    return {
        "step": step,
        "at_s": time.perf_counter() - started,
        "peak_rss_mb": peak_rss_mb(),
        "rss_mb": rss_mb(),
    }


class StepWatcher(threading.Thread):
    """Notes when each ``step-N/done.json`` of a run appears (the step's end, as `rlx fit` marks it)
    and the process's memory at that moment, without reaching into the driver."""

    def __init__(self, work_dir: Path, poll_s: float = 0.02):
        super().__init__(daemon=True)
        self.work_dir, self.poll_s = work_dir, poll_s
        self.started = time.perf_counter()
        self.marks: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        step = 1
        while not self.stop.is_set():
            if (self.work_dir / f"step-{step}" / "done.json").is_file():
                self.marks.append(step_mark(step, self.started))
                step += 1
            else:
                time.sleep(self.poll_s)


def fit_run(project: str, overrides: list[str], work_dir: str) -> dict:
    """`rlx fit` on a project with ``overrides``; each step's metrics, end time and memory."""
    from rlx.lineage.record import make_room_for_the_recorder

    make_room_for_the_recorder()  # before torch loads, as the `rlx fit` command does
    import torch
    from rich.console import Console

    from rlx.run.fit import fit

    watcher = StepWatcher(Path(project) / work_dir)
    watcher.start()
    params = Path(project) / "params.yaml"
    pristine = params.read_text()
    try:
        history = fit(params, [*overrides, f"work_dir={work_dir}"], console=Console(quiet=True))
    finally:  # `rlx fit` writes its overrides into params.yaml: the next workload must not inherit them
        params.write_text(pristine)
    time.sleep(3 * watcher.poll_s)
    watcher.stop.set()
    watcher.join()
    return {"history": history, "steps": watcher.marks, "torch_threads": torch.get_num_threads()}


def arith_reward(completions, ground_truth, **_) -> list[float]:
    """rlx's ``arith`` judger as a TRL reward function: the same rule scores both trainers' responses."""
    from rlx.judgers import get

    judger = get("arith")
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [judger.score(text, gold) for text, gold in zip(texts, ground_truth, strict=True)]


def trl_run(model_dir: str, train_file: str, out_dir: str, steps: int, settings: dict) -> dict:
    """TRL's ``GRPOTrainer`` for ``steps`` optimizer steps on CPU; each step's end time and memory."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlx.tasks.data import load_rows

    torch.manual_seed(settings["seed"])
    rows = load_rows(Path(train_file))
    dataset = Dataset.from_list(
        [{"prompt": row["prompt"], "ground_truth": str(row["reward_model"]["ground_truth"])} for row in rows]
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    responses = settings["prompts"] * settings["num_generations"]
    args = GRPOConfig(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=settings["micro_batch"],
        gradient_accumulation_steps=responses // settings["micro_batch"],  # one optimizer step per rollout batch
        num_generations=settings["num_generations"],
        max_completion_length=settings["max_tokens"],
        temperature=settings["temperature"],
        top_p=settings["top_p"],
        top_k=settings["top_k"],
        learning_rate=settings["lr"],
        adam_beta1=settings["betas"][0],
        adam_beta2=settings["betas"][1],
        adam_epsilon=settings["eps"],
        weight_decay=settings["weight_decay"],
        max_grad_norm=settings["max_grad_norm"],
        lr_scheduler_type="constant",
        optim="adamw_torch",
        beta=0.0,  # no KL term, no reference model (rlx: use_kl_loss false)
        epsilon=settings["cliprange"],
        loss_type="dapo",  # token-mean over the whole batch's tokens, as rlx's token-mean
        scale_rewards="group",
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        use_vllm=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=settings["seed"],
    )
    watcher = {"started": time.perf_counter(), "marks": []}

    class StepEnds(TrainerCallback):
        def on_step_end(self, _args, state, _control, **__):
            watcher["marks"].append(step_mark(state.global_step, watcher["started"]))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arith_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepEnds()],
    )
    watcher["started"] = time.perf_counter()
    trainer.train()
    return {"steps": watcher["marks"], "torch_threads": torch.get_num_threads()}


def train_memory(params: str, overrides: list[str], model_dir: str, train_file: str, response_len: int) -> dict:
    """Peak memory of one train-stage update (old log-probs, micro-batch losses, optimizer step) of
    the run's batch with every response exactly ``response_len`` tokens: the rise of the RSS
    high-water mark over that of the loaded trainer and batch."""
    import random

    import torch
    from train_loop import prepare, rlx_update, rollout_rows
    from transformers import AutoTokenizer

    from rlx.config import load
    from rlx.tasks.data import load_rows
    from rlx.tokens import prompt_ids
    from rlx.training.trainer import PolicyTrainer

    config = load(Path(params), overrides)
    flow, worker = config.dataflow_config, config.train_worker_cfg
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = PolicyTrainer(worker, Path(model_dir), Path(model_dir) / "no-state", total_optimizer_steps=1)
    rows = load_rows(Path(train_file))[: flow.global_batch_size]
    prompts = [prompt_ids(tokenizer, row["prompt"]) for row in rows for _ in range(flow.prompt_repeat_k)]
    draw = random.Random(0)  # responses of exactly response_len tokens, none a special token
    responses = [[draw.randrange(8, tokenizer.vocab_size) for _ in range(response_len)] for _ in prompts]
    batch = rollout_rows(prompts, responses, set())
    rewards = torch.tensor([float(draw.random() < 0.5) for _ in batch])
    before = peak_rss_mb()
    micros = prepare(config, batch, rewards, trainer, tokenizer)
    rlx_update(trainer, config, micros)
    return {"baseline_peak_rss_mb": before, "peak_rss_mb": peak_rss_mb(), "micro_batches": len(micros)}


def random_model(tokenizer_dir: str, out_dir: str, hidden: int, layers: int) -> dict:
    """A random-init Qwen3 with the demo tokenizer (``hidden`` wide, ``layers`` deep, MLP 3x), saved as a
    HF folder: a model of a real size that builds in seconds and downloads nothing."""
    from transformers import AutoTokenizer

    from rlx.config import TinyModelConfig
    from rlx.tasks.tiny_model import create_model, save

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = {"hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers}
    model = create_model(TinyModelConfig(**shape, num_attention_heads=8, num_key_value_heads=4), tokenizer)
    save(model, tokenizer, Path(out_dir))
    return {"parameters": sum(p.numel() for p in model.parameters())}


def materialize(project: str, work_dir: str, step: int, out: str) -> dict:
    """Re-create a step's policy by replay (`rlx materialize`): the whole call's seconds and the replay's."""
    import os

    from rlx.config import load
    from rlx.workers.group import engines_here

    os.chdir(project)
    started = time.perf_counter()
    engines = engines_here(load(Path(work_dir) / "config.yaml", [f"work_dir={work_dir}"]))
    engines.home.write_policy(step, Path(out))
    return {"seconds": time.perf_counter() - started, "replay_s": engines.replay_seconds}


def scoring(whole: bool, vocab: int, prompt_len: int, response_len: int, rows: int) -> dict:
    """One forward and backward of the policy-gradient log-probs (``rlx.training.trainer.token_logprobs``) on a
    random Qwen3 with a real vocabulary: scoring only the response positions, or (``whole``) every
    position, as before ``logits_to_keep``. Returns the seconds and the peak RSS rise it took."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlx.training import trainer as rlx_trainer

    torch.manual_seed(0)
    shape = {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2}
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, num_hidden_layers=2, head_dim=64, **shape))
    if whole:
        rlx_trainer.takes_logits_to_keep = lambda _model: False
    prompts = [torch.randint(5, vocab, (prompt_len - 10 * (row % 5),)).tolist() for row in range(rows)]
    responses = [torch.randint(5, vocab, (response_len,)).tolist() for _ in range(rows)]
    batch = rlx_trainer.TokenBatch.from_ids(prompts, responses, pad_id=0)
    before, started = peak_rss_mb(), time.perf_counter()
    logp, _ = rlx_trainer.token_logprobs(model, batch)
    ((logp * batch.mask).sum() / batch.mask.sum()).backward()
    return {"seconds": time.perf_counter() - started, "peak_rise_mb": peak_rss_mb() - before}


WORKLOADS = {
    "scoring": scoring,
    "fit": fit_run,
    "trl": trl_run,
    "train_memory": train_memory,
    "random_model": random_model,
    "materialize": materialize,
}

if __name__ == "__main__":
    kind, arguments, out = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(Path(__file__).parent))
    result = WORKLOADS[kind](**arguments)
    result["peak_rss_mb_at_exit"] = peak_rss_mb()
    out.write_text(json.dumps(result, default=float))
