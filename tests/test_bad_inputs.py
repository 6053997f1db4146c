"""Bad input, row by row: each row is a mistake a user can make and the exact message rlx answers with.

Every row runs the real command line (`rlx config show`, `rlx stage ...`, `rlx eval`, `rlx convert`)
in this process and checks that it exits with code 2 after printing that one line, and nothing else
(no traceback). Faults of a running step that are not the user's input (a judger that raises or hangs,
a NaN loss, a full disk) are tested below the table: each is survived or stopped with a clear message,
and nothing already saved is lost.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import PARAMS
from rlx import config as rlx_config
from rlx.cli import main
from rlx.errors import UserError
from rlx.lineage.fingerprint import fingerprint
from rlx.stages import record_outputs, run_stage
from rlx.store.artifacts import DiskFullError, read_json, read_rows, write_rows
from rlx.store.layout import StepPaths
from rlx.workers.group import engines_here


@pytest.fixture(scope="module")
def inputs(untrained_model, tmp_path_factory) -> dict[str, Path]:
    """A valid params.yaml over the small untrained model and its task; each row breaks one thing."""
    cfg, _ = untrained_model
    base = tmp_path_factory.mktemp("bad-inputs")
    params = base / "params.yaml"
    shutil.copy2(PARAMS, params)
    model, data = cfg.tiny_model.output_dir, cfg.synthetic_task.output_dir
    overrides = [
        f"load_from={model}",
        f"tokenizer_path={model}",
        f"work_dir={base / 'run'}",
        f"replay_buffer_config.dataset_cfg.0.anno_path={data / 'train.parquet'}",
        f"evaluator_config.dataset_cfg.0.anno_path={data / 'test.parquet'}",
        "wandb.enabled=false",
        "run.step=1",  # the repo's params.yaml points at a later step after a local `make fit`
        "run.prev=0",
        "run.rollout_policy=0",
        "run.checkpoint=0",
    ]
    params.write_text(rlx_config.to_yaml(rlx_config.load(params, overrides)))
    return {"params": params, "model": model, "train": data / "train.parquet", "test": data / "test.parquet"}


# ---- how rows build their broken inputs --------------------------------------------------------


def copy_model(name: str, edit: Callable[[Path], None]) -> Callable[[Path, dict], None]:
    """A row's setup: the good model folder copied to ``{d}/name``, then broken by ``edit``."""

    def setup(folder: Path, inputs: dict) -> None:
        target = folder / name
        shutil.copytree(inputs["model"], target)
        edit(target)

    return setup


def drop_chat_template(folder: Path) -> None:
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(
        json.dumps({k: v for k, v in json.loads(config_file.read_text()).items() if k != "chat_template"})
    )


def chat_template(text: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / "chat_template.jinja").write_text(text)

    return edit


def shrink_vocabulary(folder: Path) -> None:
    config_file = folder / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "vocab_size": 64}))


def only_pickled_weights(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def no_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (folder / name).unlink(missing_ok=True)


def no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def rollouts_of(*data_sources: str) -> Callable[[Path, dict], None]:
    """A row's setup: step 1's rollouts in ``{d}/run`` (one response per data source, each its own group of
    one), recorded as the rollout stage records its outputs, ready for `rlx stage judge`."""

    def setup(folder: Path, inputs: dict) -> None:
        rows = [
            {"step": 1, "group": group, "sample": 0, "data_source": source, "ground_truth": "4",
             "response_text": "#### 4", "response_len": 3}
            for group, source in enumerate(data_sources)
        ]  # fmt: skip
        write_rows(rows, folder / "run" / "step-1" / "rollouts.parquet")
        record_outputs("rollout", StepPaths(folder / "run" / "step-1"))  # as the rollout stage records them

    return setup


def perturbed(folder: Path) -> None:
    """Other weights than the student's (a teacher that is no copy of it)."""
    from safetensors.torch import save_file

    weights = load_file(folder / "model.safetensors")
    first = sorted(weights)[0]
    weights[first] = weights[first] + 0.01
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def a_run_with_no_steps(folder: Path, inputs: dict) -> None:
    (folder / "older").mkdir()
    (folder / "older" / "config.yaml").write_text("seed: 1\n")


def commented_template(folder: Path) -> None:
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "{# a teacher's own template #}")


FIT = ["fit", "{params}"]


def teacher(path: str, extra: str = "") -> str:
    """A -S override naming one teacher, its braces doubled for the row's ``str.format``."""
    return f"teacher_config={{{{teachers: [{{{{name: t, path: {path}{extra}}}}}]}}}}"


GOOD_ROW = '{"data_source": "rlx/arith", "prompt": [{"role": "user", "content": "What is 2 + 2?"}], "reward_model": {"ground_truth": "4"}}\n'  # noqa: E501
PREPARE = ["stage", "prepare", "{params}"]
OWN_DATA = ["-S", "replay_buffer_config.dataset_cfg.0.anno_path={d}/rows.jsonl"]
NO_LMDEPLOY = importlib.util.find_spec("lmdeploy") is None


@dataclass
class Row:
    """A bad input: the files it needs (under ``{d}``), the command, and the exact message."""

    id: str
    argv: list[str]
    message: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path, dict], None] | None = None


def show(text: str | bytes) -> dict:
    return {"argv": ["config", "show", "{d}/params.yaml"], "files": {"params.yaml": text}}


INVALID = "{d}/params.yaml: invalid configuration: "

ROWS = [
    # ---- params: the file, its fields, the -S overrides
    Row("unknown key", **show("seeed: 1\n"),
        message=INVALID + "seeed: unknown field (check the spelling; `rlx config schema` lists every field)"),
    Row("wrong type", **show("seed: abc\n"),
        message=INVALID + "seed: Input should be a valid integer, unable to parse string as an integer; got 'abc'"),
    Row("out of range", **show("dataflow_config:\n  global_batch_size: 0\n"),
        message=INVALID + "dataflow_config.global_batch_size: Input should be greater than 0; got 0"),
    Row("group estimator with groups of one", **show("dataflow_config:\n  prompt_repeat_k: 1\n"),
        message=INVALID + "advantage_estimator_config.type 'grpo' compares responses within a group: "
        "dataflow_config.prompt_repeat_k must be at least 2, got 1"),
    Row("unknown algorithm name", **show("train_worker_cfg:\n  loss_cfg:\n    policy_loss_cfg:\n      loss_type: ppo2\n"),
        message=INVALID + "train_worker_cfg.loss_cfg.policy_loss_cfg.loss_type: Input should be a registered policy "
        "loss: 'vanilla', 'gspo' or 'cispo'; got 'ppo2'"),
    Row("pass@k above the group size",
        **show("advantage_estimator_config:\n  type: pass_at_k\n  k: 16\n"),
        message=INVALID + "advantage_estimator_config.k (16) cannot exceed dataflow_config.prompt_repeat_k (8)"),
    Row("GPU backend on a CPU machine", **show("rollout_config:\n  backend: lmdeploy\n"),
        message=INVALID + "rollout_config.backend 'lmdeploy' needs LMDeploy and a GPU: pip install 'rlx[gpu]' "
        "(or use backend 'transformers')"),
    Row("LoRA of rank 0", ["config", "show", "{params}", "-S", "train_worker_cfg.lora.rank=0"],
        "{params}: invalid configuration: train_worker_cfg.lora.rank: Input should be greater than 0; got 0"),
    Row("LoRA on a module the model lacks", ["fit", "{params}", "-S", "train_worker_cfg.lora.target_modules=[q_proj, attn]"],
        "train_worker_cfg.lora.target_modules: attn not among the linear modules of the model in load_from {model}: "
        "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or all-linear)"),
    Row("LoRA on a dotted path the model lacks",
        ["fit", "{params}", "-S", "train_worker_cfg.lora.target_modules=[self_attn.q_proj, mlp.q_proj]"],
        "train_worker_cfg.lora.target_modules: mlp.q_proj not among the linear modules of the model in load_from "
        "{model}: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or all-linear)"),
    Row("bad YAML", **show("dataflow_config: [unclosed\n"),
        message="{d}/params.yaml: not valid YAML at line 2, column 1 (expected ',' or ']', but got '<stream end>')"),
    Row("duplicate key", **show("seed: 1\ndataflow_config:\n  prompt_repeat_k: 4\n  prompt_repeat_k: 8\n"),
        message="{d}/params.yaml: duplicate key dataflow_config.prompt_repeat_k at line 4 (already set at line 3); "
        "keep one of them"),
    Row("not UTF-8", **show(b"seed: 1\nwork_dir: runs/caf\xe9\n"),
        message="{d}/params.yaml: not UTF-8 text (byte 0xe9 at line 2, column 19); save it as UTF-8"),
    Row("not a mapping", **show("- seed\n"),
        message="{d}/params.yaml: expected a mapping of fields at the top level, got a list"),
    Row("params file missing", ["config", "show", "{d}/absent.yaml"], "{d}/absent.yaml: no such file"),
    Row("-S without =", ["config", "show", "{params}", "-S", "seed"],
        "override 'seed': expected KEY=VALUE, e.g. dataflow_config.global_batch_size=32"),
    Row("-S value not YAML", ["config", "show", "{params}", "-S", "seed=[1"],
        "override 'seed=[1': the value is not valid YAML (expected ',' or ']', but got '<stream end>')"),
    Row("-S into a value", ["config", "show", "{params}", "-S", "seed.inner=1"],
        "override 'seed.inner=1': seed is a int, not a section"),
    Row("-S past a list's end", ["config", "show", "{params}", "-S", "replay_buffer_config.dataset_cfg.3.name=x"],
        "override path replay_buffer_config.dataset_cfg.3: expected a list index below 1, got '3'"),
    Row("unknown stage", ["stage", "nope", "{params}"],
        "unknown stage 'nope'; stages: base, teachers, prepare, rollout, judge, teacher, train, checkpoint, evaluate, "
        "export"),
    # ---- teachers (on-policy distillation): refused before anything is written
    Row("teacher path missing", [*FIT, "-S", teacher("{d}/absent")],
        "teacher_config.teachers.0.path {d}/absent: no such folder (a HF model folder, or an rlx run's work_dir "
        "with step)"),
    Row("teacher is the student's folder", [*FIT, "-S", teacher("{model}")],
        "teacher_config.teachers.0.path {model}: is the student's own model (load_from); a teacher must differ"),
    Row("teacher is a copy of the student", [*FIT, "-S", teacher("{d}/copy")],
        "teacher_config.teachers.0.path {d}/copy: is the student's own model (load_from); a teacher must differ",
        setup=copy_model("copy", lambda folder: None)),
    Row("teacher step the run lacks", [*FIT, "-S", teacher("{d}/older", ", step: 7")],
        "teacher_config.teachers.0.step 7: {d}/older has no such step (its steps: none)", setup=a_run_with_no_steps),
    Row("teacher of another chat template", [*FIT, "-S", teacher("{d}/other")],
        "teacher_config.teachers.0 (t): its tokenizer {d}/other has another chat template than the student's "
        "tokenizer_path {model}; a teacher must share the student's tokenizer",
        setup=copy_model("other", lambda folder: (perturbed(folder), commented_template(folder)))),
    Row("teacher routed to a data_source no row has",
        [*FIT, "-S", teacher("{d}/other", ", data_source: [gsm8k]")],
        "teacher_config.teachers.0.data_source ['gsm8k']: no training row has it (the datasets' data sources: "
        "['rlx/arith'])", setup=copy_model("other", perturbed)),
    # ---- files the params name
    Row("tokenizer_path missing", [*PREPARE, "-S", "tokenizer_path={d}/absent"],
        "tokenizer_path {d}/absent: no tokenizer there (build the demo model with `dvc repro`)"),
    Row("dataset anno_path missing", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: no such dataset file (build the demo data with `dvc repro` or `rlx init-data`)"),
    Row("load_from missing", [*PREPARE, "-S", "load_from={d}/absent"],
        "load_from {d}/absent: not a model folder (no config.json)"),
    Row("eval of a missing model", ["eval", "{d}/absent", "--data", "{test}"],
        "{d}/absent: not a model folder (no config.json)"),
    Row("eval of a set no judger scores", ["eval", "{d}/absent", "--data", "{d}/rows.jsonl"],
        "no judger scores data_source 'my/wordmath'; judger_config.reward_judger_configs covers ['rlx/arith']; "
        "or judge every set with --judger NAME (arith, custom, environment, format, gsm8k, math, reward_model)",
        files={"rows.jsonl": GOOD_ROW.replace("rlx/arith", "my/wordmath")}),  # said before the model is read
    # ---- the model folder
    Row("model folder without weights", ["eval", "{d}/model", "--data", "{test}"],
        "{d}/model: no *.safetensors weights (found *.bin: none); rlx loads safetensors only: "
        "save the model with save_pretrained(..., safe_serialization=True)", setup=copy_model("model", no_weights)),
    Row("pickled weights only", ["eval", "{d}/model", "--data", "{test}"],
        "{d}/model: no *.safetensors weights (found *.bin: pytorch_model.bin); rlx loads safetensors only: "
        "save the model with save_pretrained(..., safe_serialization=True)",
        setup=copy_model("model", only_pickled_weights)),
    Row("not a model folder", [*PREPARE, "-S", "load_from={d}/model"],
        "load_from {d}/model: not a model folder (no config.json)", setup=copy_model("model", no_config)),
    Row("model folder without tokenizer", [*PREPARE, "-S", "tokenizer_path={d}/model"],
        "tokenizer_path {d}/model: no tokenizer there (build the demo model with `dvc repro`)",
        setup=copy_model("model", no_tokenizer)),
    Row("tokenizer without chat template", [*PREPARE, "-S", "tokenizer_path={d}/model"],
        "tokenizer_path {d}/model: the tokenizer has no chat template (rlx renders prompts as chat messages; "
        "use an instruct model's tokenizer or set tokenizer.chat_template and save it)",
        setup=copy_model("model", drop_chat_template)),
    Row("chat template the sandbox refuses", [*PREPARE, "-S", "tokenizer_path={d}/model"],
        "tokenizer_path {d}/model: the chat template fails (access to attribute '__class__' of 'str' object is "
        "unsafe.)", setup=copy_model("model", chat_template("{{ ''.__class__.__mro__ }}"))),
    Row("chat template that never ends", [*PREPARE, "-S", "tokenizer_path={d}/model"],
        "tokenizer_path {d}/model: the chat template did not render one prompt in 10 s",
        setup=copy_model("model", chat_template(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"))),
    Row("step's inputs missing", ["stage", "train", "{params}", "-S", "work_dir={d}/run"],
        "stage train of step 1: an input is missing ({d}/run/step-1: no rollouts.parquet or judged.parquet); "
        "run the stages before it first (`dvc repro` runs them in order)"),
    Row("tokenizer larger than the model's vocabulary", [*PREPARE, "-S", "load_from={d}/model"],
        "tokenizer_path {model}: the tokenizer has {vocab} tokens but the model in load_from {d}/model embeds "
        "only 64 (vocab_size); use the tokenizer the model was trained with",
        setup=copy_model("model", shrink_vocabulary)),
    # ---- prompt data
    Row("empty dataset", [*PREPARE, *OWN_DATA], "{d}/rows.jsonl: the dataset is empty", files={"rows.jsonl": ""}),
    Row("missing columns", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: row 0: missing columns 'prompt', 'reward_model'",
        files={"rows.jsonl": '{"data_source": "rlx/arith"}\n'}),
    Row("empty gold answer", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: row 1: empty 'reward_model.ground_truth' (the gold answer), got ''",
        files={"rows.jsonl": GOOD_ROW + GOOD_ROW.replace('"ground_truth": "4"', '"ground_truth": ""')}),
    Row("gold answer as a list", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: row 0: 'reward_model.ground_truth' must be the gold answer as a string (or a number), "
        "got ['13']; write several answers as one string, e.g. '3, 5'",
        files={"rows.jsonl": GOOD_ROW.replace('"ground_truth": "4"', '"ground_truth": ["13"]')}),
    Row("unknown chat role", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: row 0: 'prompt' has a message with role 'narrator'; chat roles are system, user, "
        "assistant, tool", files={"rows.jsonl": GOOD_ROW.replace('"role": "user"', '"role": "narrator"')}),
    Row("empty params file", **show(""),
        message="{d}/params.yaml: the file is empty; write the fields to set (see `rlx config show`)"),
    Row("aliases past the limit", **show("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join([f'*{chr(97 + n)}'] * 10)}]\n" for n in range(5))),
        message="{d}/params.yaml: its aliases expand to more than 100,000 values; write the values out"),
    Row("params file too large", **show("seed: 1\n" + "#" * (1 << 20)),
        message="{d}/params.yaml: 1,048,584 bytes, more than a params file can be (1 MiB)"),
    Row("int past 64 bits", ["config", "show", "{params}", "-S", "seed=100000000000000000000000"],
        "{params}: invalid configuration: seed: must fit in 64 bits (below 2^63 in size); got 100000000000000000000000"),
    Row("a flag as a count", ["config", "show", "{params}", "-S", "dataflow_config.max_staleness=true"],
        "{params}: invalid configuration: dataflow_config.max_staleness: Input should be a whole number, written "
        "without a point and not as true or false; got True"),
    Row("a count with a point", ["config", "show", "{params}", "-S", "rollout_steps=2.0"],
        "{params}: invalid configuration: rollout_steps: Input should be a whole number, written without a point "
        "and not as true or false; got 2.0"),
    Row("more mini-batches than responses", ["config", "show", "{params}", "-S", "train_worker_cfg.optimizer_steps=129"],
        "{params}: invalid configuration: train_worker_cfg.optimizer_steps 129: a step holds 128 responses "
        "(dataflow_config.global_batch_size x prompt_repeat_k), fewer than one per mini-batch"),
    Row("a minimum past the budget", ["config", "show", "{params}", "-S", "evaluator_config.sample_params.min_tokens=33"],
        "{params}: invalid configuration: evaluator_config.sample_params: min_tokens 33 is more than max_tokens 32: "
        "no response could end before its budget"),
    Row("a count as a flag", ["config", "show", "{params}", "-S", "auto_resume=1"],
        "{params}: invalid configuration: auto_resume: Input should be true or false; got 1"),
    Row("infinite float", ["config", "show", "{params}", "-S", "train_worker_cfg.optim_cfg.lr=.inf"],
        "{params}: invalid configuration: train_worker_cfg.optim_cfg.lr: Input should be a finite number; got inf"),
    Row("reward weight past any real reward", ["config", "show", "{params}", "-S",
                                                "judger_config.reward_judger_configs.0.weight=1.0e+300"],
        "{params}: invalid configuration: judger_config.reward_judger_configs.0.weight: Input should be less than "
        "or equal to 1000000; got 1e+300"),
    Row("judger time limit no clock can wait", ["config", "show", "{params}", "-S", "judger_config.timeout=1.0e+300"],
        "{params}: invalid configuration: judger_config.timeout: Input should be less than or equal to 86400; "
        "got 1e+300"),
    Row("agent tool that cannot be imported", ["config", "show", "{params}", "-S",
                                               "dataflow_config.agent_loop_config.tools=[nope.tools:add]"],
        "{params}: invalid configuration: dataflow_config.agent_loop_config: tools entry 'nope.tools:add': cannot "
        "import it (No module named 'nope')"),
    Row("agent tool without a schema", ["config", "show", "{params}", "-S",
                                        "dataflow_config.agent_loop_config.tools=[helpers.agents:undocumented]"],
        "{params}: invalid configuration: dataflow_config.agent_loop_config: tools entry "
        "'helpers.agents:undocumented': no tool schema from its type hints and docstring (Cannot generate JSON "
        "schema for undocumented because it has no docstring!)"),
    Row("agent without turns", ["config", "show", "{params}", "-S", "dataflow_config.agent_loop_config.max_turns=0"],
        "{params}: invalid configuration: dataflow_config.agent_loop_config.max_turns: Input should be greater than "
        "or equal to 1; got 0"),
    Row("dataset repeated past memory", ["config", "show", "{params}", "-S",
                                         "replay_buffer_config.dataset_cfg.0.sample_ratio=1.0e+300"],
        "{params}: invalid configuration: replay_buffer_config.dataset_cfg.0.sample_ratio: Input should be less "
        "than or equal to 100; got 1e+300"),
    Row("wrong type in a column", [*PREPARE, *OWN_DATA],
        "{d}/rows.jsonl: row 2: 'prompt' must be a non-empty list of {{role, content}} messages, got 'What is 2 + 2?'",
        files={"rows.jsonl": GOOD_ROW * 2 + GOOD_ROW.replace('[{"role": "user", "content": "What is 2 + 2?"}]',
                                                               '"What is 2 + 2?"')}),
    Row("line not JSON", [*PREPARE, *OWN_DATA], "{d}/rows.jsonl:2: not valid JSON (Expecting property name enclosed in double quotes)",
        files={"rows.jsonl": GOOD_ROW + "{oops\n"}),
    Row("line not UTF-8", [*PREPARE, *OWN_DATA], "{d}/rows.jsonl:2: not UTF-8 text (byte 0xff)",
        files={"rows.jsonl": GOOD_ROW.encode() + b'{"data_source": "\xff"}\n'}),
    Row("every prompt too long", [*PREPARE, "-S", "replay_buffer_config.max_prompt_length=4"],
        "every prompt (400) is longer than replay_buffer_config.max_prompt_length=4 tokens; "
        "raise the limit or shorten the prompts"),
    Row("fewer prompts than a batch", [*PREPARE, *OWN_DATA],
        "only 2 usable prompts (0 more were longer than replay_buffer_config.max_prompt_length), "
        "fewer than dataflow_config.global_batch_size=16", files={"rows.jsonl": GOOD_ROW * 2}),
    Row("convert: line not UTF-8", ["convert", "gsm8k", "{d}/in.jsonl", "{d}/out.parquet"],
        "{d}/in.jsonl:2: not UTF-8 text (byte 0xe9)",
        files={"in.jsonl": b'{"question": "q", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n'}),
    Row("convert: missing key", ["convert", "gsm8k", "{d}/in.jsonl", "{d}/out.parquet"],
        "{d}/in.jsonl:1: not a GSM8K row (missing key 'answer')", files={"in.jsonl": '{"question": "q"}\n'}),
    Row("convert: no gold answer", ["convert", "gsm8k", "{d}/in.jsonl", "{d}/out.parquet"],
        "{d}/in.jsonl:1: not a GSM8K row (no '#### answer' at the end of the solution)",
        files={"in.jsonl": '{"question": "q", "answer": "it is 2"}\n'}),
    Row("convert: missing file", ["convert", "gsm8k", "{d}/absent.jsonl", "{d}/out.parquet"],
        "{d}/absent.jsonl: no such file"),
    Row("convert qa: no data source", ["convert", "qa", "{d}/in.jsonl", "{d}/out.parquet"],
        "--data-source names the rows' data_source of a qa set (and of no other): give it with qa",
        files={"in.jsonl": '{"question": "q", "answer": 1}\n'}),
    Row("convert qa: answer not text", ["convert", "qa", "{d}/in.jsonl", "{d}/out.parquet", "--data-source", "my/qa"],
        "{d}/in.jsonl:2: not a question/answer row ('answer' must be text or a number, got [1, 2])",
        files={"in.jsonl": '{"question": "q", "answer": 1}\n{"question": "q", "answer": [1, 2]}\n'}),
    # ---- judging
    Row("data_source no judger scores", ["stage", "judge", "{params}", "-S", "work_dir={d}/run"],
        "no judger scores data_source 'someone/else'; judger_config.reward_judger_configs covers ['rlx/arith']",
        setup=rollouts_of("rlx/arith", "someone/else")),
    Row("unknown judger", ["stage", "judge", "{params}", "-S", "work_dir={d}/run",
                           "-S", "judger_config.reward_judger_configs.0.judger_name=nope"],
        "unknown judger 'nope'; available: arith, custom, environment, format, gsm8k, math, reward_model",
        setup=rollouts_of("rlx/arith")),
    Row("bad judger option", ["stage", "judge", "{params}", "-S", "work_dir={d}/run",
                              "-S", "judger_config.reward_judger_configs.0.judger_name=math",
                              "-S", "judger_config.reward_judger_configs.0.options={{extraction: last}}"],
        "judger 'math': option extraction must be one of math_verify, boxed; got 'last'",
        setup=rollouts_of("rlx/arith")),
]  # fmt: skip

MARKS = {"GPU backend on a CPU machine": pytest.mark.skipif(not NO_LMDEPLOY, reason="LMDeploy is installed here")}


def fill(text: str, folder: Path, inputs: dict, vocab: int) -> str:
    return text.format(d=folder, vocab=vocab, **inputs)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=MARKS.get(r.id, ())) for r in ROWS])
def test_bad_input_gets_one_exact_line_and_exit_code_2(row, inputs, untrained_model, tmp_path, capsys):
    for name, content in row.files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    if row.setup:
        row.setup(tmp_path, inputs)
    vocab = untrained_model[1]["vocab_size"]
    code, out, err = run_cli([fill(arg, tmp_path, inputs, vocab) for arg in row.argv], capsys)
    assert (code, out, err) == (2, "", f"error: {fill(row.message, tmp_path, inputs, vocab)}\n")


def test_the_table_covers_enough_mistakes():
    assert len(ROWS) >= 25 and len({row.id for row in ROWS}) == len(ROWS)


# ---- faults while a step runs ------------------------------------------------------------------


def test_too_long_prompts_are_dropped_and_counted(inputs, tmp_path, capsys):
    argv = [*PREPARE, "-S", f"work_dir={tmp_path}", "-S", "replay_buffer_config.max_prompt_length=53"]
    code, out, _ = run_cli([fill(a, tmp_path, inputs, 0) for a in argv], capsys)
    metrics = json.loads(out)
    assert code == 0 and 0 < metrics["prompts/dropped_too_long"] < 400
    assert metrics["prompts/pool_size"] == 400 - metrics["prompts/dropped_too_long"]


def test_a_judger_that_raises_hangs_or_scores_nonsense_scores_zero_and_is_counted(inputs, tmp_path, capsys):
    """The run goes on: each failure is a reward of 0, its error is kept per response and counted. A NaN
    would skip every update and an infinity zero the advantages, so they are failures too."""
    functions = {"bug": "broken", "slow": "sleepy", "nan": "not_a_number", "inf": "infinite", "huge": "absurd"}
    rollouts_of(*functions)(tmp_path, inputs)
    judgers = [
        {"judger_name": "custom", "data_source": [source], "options": {"function": f"helpers.judges:{function}"}}
        for source, function in functions.items()
    ] + [{"judger_name": "arith", "data_source": ["rlx/arith"]}]  # the datasets' own rows (checked before the stage)
    argv = ["stage", "judge", str(inputs["params"]), "-S", f"work_dir={tmp_path / 'run'}", "-S",
            f"judger_config.reward_judger_configs={json.dumps(judgers)}", "-S", "judger_config.timeout=3",
            "-S", "dataflow_config.prompt_repeat_k=1", "-S", "advantage_estimator_config.type=reinforce_plus_plus"]  # fmt: skip
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and json.loads(out)["judge/errors"] == 5
    judged = read_rows(tmp_path / "run" / "step-1" / "judged.parquet")
    assert [row["reward"] for row in judged] == [0.0] * 5
    assert [row["error"] for row in judged] == [
        "custom: RuntimeError: judger bug",
        "custom: timeout: no score within 3.0 s",
        "custom: ValueError: returned nan, not a finite score within +-1e+06",
        "custom: ValueError: returned -inf, not a finite score within +-1e+06",
        "custom: ValueError: returned 1e+308, not a finite score within +-1e+06",
    ]


@pytest.fixture(scope="module")
def judged_step(inputs, untrained_model, tmp_path_factory) -> Path:
    """A work_dir whose step 1 is prepared, rolled out and judged (train not yet run), on the real stages."""
    work_dir = tmp_path_factory.mktemp("judged") / "run"
    config = step_config(inputs, work_dir)
    engines = engines_here(config)
    for name in ("base", "prepare", "rollout", "judge"):
        run_stage(name, config, 1, engines)
    return work_dir


def step_config(inputs: dict, work_dir: Path, *overrides: str):
    return rlx_config.load(
        inputs["params"],
        [
            f"work_dir={work_dir}",
            "evaluator_config.enable_initial_evaluate=false",
            "dataflow_config.global_batch_size=2",
            "dataflow_config.prompt_repeat_k=2",
            "dataflow_config.sample_params.max_tokens=8",
            *overrides,
        ],
    )


def copy_run(judged_step: Path, tmp_path: Path) -> Path:
    work_dir = tmp_path / "run"
    shutil.copytree(judged_step, work_dir)
    return work_dir


def optimizer_state(trainer) -> str:
    """DeepSpeed's optimizer state, every tensor written out, to compare exactly."""
    state = {k: v for k, v in trainer.engine.optimizer.state_dict().items() if k != "overflow"}  # its skip flag
    return json.dumps(
        state,
        default=lambda o: o.tolist() if isinstance(o, torch.Tensor) else repr(o),
        sort_keys=True,
    )


@pytest.mark.parametrize("zero_stage", [1, 0], ids=["ZeRO-1: DeepSpeed skips", "no ZeRO: rlx skips"])
def test_nonfinite_loss_skips_the_update_and_too_many_in_a_row_stop_the_run(
    inputs, judged_step, tmp_path, monkeypatch, caplog, zero_stage
):
    import rlx.training.microbatch as microbatch

    real_loss = microbatch.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(microbatch, "policy_loss", nan_loss)
    work_dir = copy_run(judged_step, tmp_path)
    config = step_config(
        inputs,
        work_dir,
        "train_worker_cfg.max_consecutive_nonfinite=2",
        f"train_worker_cfg.deepspeed.zero_stage={zero_stage}",
    )
    norm = "inf" if zero_stage else "nan"  # ZeRO reports the norm it refused; without ZeRO none is computed
    engines = engines_here(config)
    trainer = engines.trainer(0)
    weights = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    optimizer = optimizer_state(trainer)

    metrics = run_stage("train", config, 1, engines)
    assert metrics["train/skipped_updates"] == 1
    assert f"step 1, mini-batch 1: loss nan, grad norm {norm} are not finite; the update was skipped" in caplog.text
    assert all(torch.equal(weights[k], v) for k, v in trainer.module.state_dict().items()), "weights changed"
    assert read_json(work_dir / "step-1" / "fingerprint.json") == fingerprint(trainer.module)
    assert optimizer_state(trainer) == optimizer, "the optimizer state changed"
    assert trainer.state["nonfinite_in_a_row"] == 1

    # The count survives a restart (a fresh Engines re-creates step 1 by replay): the next skip is the second.
    engines = engines_here(config)
    for name in ("prepare", "rollout", "judge"):
        run_stage(name, config, 2, engines)
    with pytest.raises(UserError) as stopped:
        run_stage("train", config, 2, engines)
    assert str(stopped.value) == (
        "train: 2 optimizer steps in a row had a non-finite loss or gradient norm (the last at step 2, mini-batch 1: "
        f"loss nan, grad norm {norm}), reaching train_worker_cfg.max_consecutive_nonfinite=2; nothing of step 2 was "
        "recorded, step 1 is the last good one. Check the rewards (judge/errors) or lower "
        "train_worker_cfg.optim_cfg.lr, then rerun"
    )
    assert not (work_dir / "step-2" / "update.parquet").exists()
    assert not (work_dir / "step-2" / "train_metrics.json").exists()


def test_non_finite_weights_are_found_without_false_alarms():
    """The check after every update clears a parameter by its sum: NaN and +-inf are found, a finite
    tensor whose sum overflows is not taken for one, and a frozen parameter (LoRA's base) is not read."""
    from rlx.training.trainer import nonfinite_parameter

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(3e38)  # every element finite, their float32 sum infinite
    assert nonfinite_parameter(model) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            model[1].bias[1] = bad
        assert nonfinite_parameter(model) == "1.bias", bad
    model[1].bias.requires_grad_(False)
    assert nonfinite_parameter(model) is None


@pytest.mark.parametrize("part", ["policy", "trainer_state"])
def test_disk_full_while_saving_a_checkpoint_keeps_the_previous_one(inputs, judged_step, tmp_path, monkeypatch, part):
    import transformers

    from rlx.training.safe_checkpoint import SnapshotCheckpointEngine

    def disk_full(folder):
        (Path(folder) / "partial").write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    # what writes each folder: the policy's HF files, and the trainer state's copy that the
    # checkpoint engine took in memory (DeepSpeed's save_checkpoint itself writes nothing there)
    if part == "policy":
        target = (transformers.PreTrainedModel, "save_pretrained", lambda self, folder, *a, **k: disk_full(folder))
    else:
        target = (SnapshotCheckpointEngine, "write", lambda self, states, folder: disk_full(folder))
    work_dir = copy_run(judged_step, tmp_path)
    config = step_config(inputs, work_dir, "checkpoint_interval=1")
    engines = engines_here(config)
    for name, step in (("checkpoint", 0), ("train", 1)):
        run_stage(name, config, step, engines)
    monkeypatch.setattr(*target, disk_full)
    before = load_file(work_dir / "step-0" / "policy" / "model.safetensors")
    with pytest.raises(DiskFullError) as failed:
        run_stage("checkpoint", config, 1, engines)
    assert str(failed.value) == (
        f"no space left on device while writing {work_dir}/step-1/{part}; the previous checkpoint step-0 is intact: "
        "free some space and rerun to resume from it"
    )
    assert not list((work_dir / "step-1").glob(".*tmp*")), "the partial copy was left behind"
    assert not (work_dir / "step-1" / "checkpoint_metrics.json").exists()
    after = load_file(work_dir / "step-0" / "policy" / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("field", ["log_dir", "work_dir"])
@pytest.mark.parametrize("place", [".git", ".git/logs", ".dvc/tmp", "src/rlx", "."])
def test_logs_and_runs_stay_out_of_what_git_dvc_and_the_code_keep(field, place, tmp_path, monkeypatch):
    from rlx.config import load
    from rlx.run.preflight import check_overlaps

    monkeypatch.chdir(tmp_path)  # rlx's checks run in the project's folder
    config = load(PARAMS, [f"{field}={place}"])
    with pytest.raises(UserError, match=rf"^{field} {re.escape(place)} overlaps {re.escape(str(tmp_path))}/"):
        check_overlaps(config, tmp_path)


def test_rollouts_sampled_from_other_weights_stop_the_run_before_the_step_is_recorded(
    inputs, judged_step, tmp_path, monkeypatch
):
    """A weight sync that left one tensor wrong (the output head, here): the engine samples from weights that
    are not the policy the step records. mismatch/k3_kl, the engine's log-probs against the trainer's, is then
    far past rollout_config.max_mismatch_kl, and the train stage stops with one line, nothing recorded."""
    import copy

    from rlx.samplers import TransformersSampler

    work_dir = copy_run(judged_step, tmp_path)
    config = step_config(inputs, work_dir)
    engines = engines_here(config)
    wrong = copy.deepcopy(engines.policy(0))
    with torch.no_grad():
        wrong.get_output_embeddings().weight.mul_(10)
    sampler = TransformersSampler(wrong, engines.tokenizer, config.rollout_config)
    monkeypatch.setattr(engines.home, "sampler", lambda step: sampler)
    for name in ("rollout", "judge"):
        run_stage(name, config, 1, engines)
    with pytest.raises(UserError) as stopped:
        run_stage("train", config, 1, engines)
    assert re.fullmatch(
        r"train: step 1's rollouts are mismatch/k3_kl [0-9.]+ from the trainer's log-probs, past "
        r"rollout_config.max_mismatch_kl 0.1: the rollout engine did not sample from the policy the run records "
        r"\(a weight sync that failed\?\); nothing of step 1 was recorded. Rerun to resume from step 0, or raise "
        r"the bound if this mismatch is expected",
        str(stopped.value),
    )
    assert not (work_dir / "step-1" / "update.parquet").exists()
    engines = engines_here(step_config(inputs, work_dir, "rollout_config.max_mismatch_kl=null"))
    assert run_stage("train", engines.config, 1, engines)["mismatch/k3_kl"] > 0.1
