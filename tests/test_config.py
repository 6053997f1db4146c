"""The config tree: params.yaml round trip, validation of every section, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rlx import config, seeds
from rlx.cli import main
from rlx.config import ConfigError, RLTrainerConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def test_params_yaml_round_trips(tmp_path):
    tree = config.load(PARAMS)
    written = tmp_path / "resolved.yaml"
    written.write_text(config.to_yaml(tree))
    assert config.load(written) == tree
    assert yaml.safe_load(written.read_text())["dataflow_config"]["prompt_repeat_k"] == 8


def test_params_yaml_sets_only_known_fields_and_keeps_xtuner_names():
    raw = yaml.safe_load(PARAMS.read_text())
    xtuner_sections = {
        "resources", "rollout_config", "dataflow_config", "judger_config", "replay_buffer_config",
        "train_worker_cfg", "evaluator_config", "advantage_estimator_config",
    }  # fmt: skip
    assert xtuner_sections <= set(raw)
    assert set(raw) <= set(RLTrainerConfig.model_fields)


def test_overrides_reach_nested_fields_and_list_items():
    tree = config.load(
        PARAMS,
        [
            "dataflow_config.global_batch_size=32",
            'dataflow_config.sample_params.stops=["\\n\\n"]',
            "replay_buffer_config.dataset_cfg.0.anno_path=elsewhere.parquet",
            "train_worker_cfg.optim_cfg.lr=5e-4",
        ],
    )
    assert tree.dataflow_config.global_batch_size == 32
    assert tree.dataflow_config.sample_params.stops == ["\n\n"]
    assert tree.replay_buffer_config.dataset_cfg[0].anno_path == Path("elsewhere.parquet")
    assert tree.train_worker_cfg.optim_cfg.lr == 5e-4


def test_defaults_alone_are_a_valid_config():
    assert config.load(None).dataflow_config.prompt_repeat_k == 8


# One bad value per section: the message must name the path, the value, and what was expected.
SECTION_CASES = [
    ("total_epochs=0", "total_epochs: Input should be greater than 0; got 0"),
    ("checkpoint_interval=0", "checkpoint_interval must be a positive number or -1, got 0"),
    ("exp_tracker=mlflow", "exp_tracker: Input should be 'jsonl' or 'tensorboard'; got 'mlflow'"),
    ("wandb.mode=sometimes", "wandb.mode: Input should be 'offline', 'online' or 'disabled'; got 'sometimes'"),
    ("resources.num_workers=0", "resources.num_workers: Input should be greater than 0; got 0"),
    ("rollout_config.backend=vllm", "rollout_config.backend: Input should be 'transformers' or 'lmdeploy'; got 'vllm'"),
    ("dataflow_config.sample_params.top_p=1.5", "dataflow_config.sample_params.top_p: Input should be less than or equal to 1; got 1.5"),
    ("judger_config.timeout=-1", "judger_config.timeout: Input should be greater than 0; got -1"),
    ("replay_buffer_config.max_prompt_length=0", "replay_buffer_config.max_prompt_length: Input should be greater than 0; got 0"),
    ("train_worker_cfg.deepspeed.zero_stage=4", "train_worker_cfg.deepspeed.zero_stage: Input should be 0, 1, 2 or 3; got 4"),
    ("train_worker_cfg.loss_cfg.kl_loss_type=k9", "train_worker_cfg.loss_cfg.kl_loss_type: Input should be a registered KL estimator: 'k1', 'k2', 'k3' or 'abs'; got 'k9'"),
    ("train_worker_cfg.loss_cfg.rollout_correction.mode=clip", "train_worker_cfg.loss_cfg.rollout_correction.mode: Input should be a registered rollout correction mode: 'truncate', 'mask' or 'decoupled'; got 'clip'"),
    ("train_worker_cfg.lr_cfg.warmup_ratio=1", "train_worker_cfg.lr_cfg.warmup_ratio: Input should be less than 1; got 1"),
    ("evaluator_config.evaluate_step=0", "evaluator_config.evaluate_step: Input should be greater than 0; got 0"),
    ("advantage_estimator_config.eps=0", "advantage_estimator_config.eps: Input should be greater than 0; got 0"),
    ("load_checkpoint_cfg.load_dataset=maybe", "load_checkpoint_cfg.load_dataset: Input should be a valid boolean, unable to interpret input; got 'maybe'"),
    ("synthetic_task.num_operands=7", "synthetic_task.num_operands: Input should be less than or equal to 4; got 7"),
    ("tiny_model.hidden_size=130", "tiny_model: hidden_size (130) must be divisible by num_attention_heads (4)"),
    ("dataflow_config.prompt_repeat_k=1", "dataflow_config.prompt_repeat_k must be at least 2, got 1"),
    ("resources.num_workers=0", "resources.num_workers: Input should be greater than 0; got 0"),
    ("resources.num_cpus_per_worker=0", "resources.num_cpus_per_worker: Input should be greater than 0; got 0"),
    ("resources.pg_pack_strategy=TIGHT", "resources.pg_pack_strategy: Input should be 'PACK', 'SPREAD', 'STRICT_PACK' or 'STRICT_SPREAD'; got 'TIGHT'"),
    ("cpu_resources.num_workers=0", "cpu_resources.num_workers: Input should be greater than 0; got 0"),
    ("load_checkpoint_cfg.checkpoint_path=ckpt", "load_checkpoint_cfg.checkpoint_path: kept for XTuner compatibility, not supported: rlx resumes a run from its own work_dir (auto_resume) and starts from load_from; to start from another run's policy, point load_from at its HF export; got 'ckpt'"),
    ("dataflow_config.sample_params.n=4", "dataflow_config.sample_params.n 4: rollouts sample dataflow_config.prompt_repeat_k responses per prompt (n is read in evaluation only); set prompt_repeat_k instead"),
    ("evaluator_config.dataset_cfg.0.sample_ratio=2", "evaluator_config.dataset_cfg.0.sample_ratio: Input should be less than or equal to 1; got 2"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "message"), SECTION_CASES, ids=[case[0] for case in SECTION_CASES])
def test_every_section_is_validated(override, message):
    with pytest.raises(ConfigError) as caught:
        config.load(PARAMS, [override])
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{PARAMS}: invalid configuration: ")


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "params.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


BAD_FILES = [
    ("unknown key", "dataflow_config:\n  global_batchsize: 8\n",
     "dataflow_config.global_batchsize: unknown field (check the spelling; `rlx config schema` lists every field)"),
    ("wrong type", "dataflow_config:\n  global_batch_size: many\n",
     "dataflow_config.global_batch_size: Input should be a valid integer, unable to parse string as an integer; got 'many'"),
    ("out of range", "dataflow_config:\n  sample_params:\n    temperature: -0.5\n",
     "dataflow_config.sample_params.temperature: Input should be greater than or equal to 0; got -0.5"),
    ("missing required field", "replay_buffer_config:\n  dataset_cfg:\n    - name: gsm8k\n",
     "replay_buffer_config.dataset_cfg.0.anno_path: required field is missing"),
    ("not a mapping", "- just\n- a list\n", "expected a mapping of fields at the top level, got a list"),
    ("bad YAML", "dataflow_config: [unclosed\n", "not valid YAML at line 2, column 1"),
    ("not UTF-8", b"seed: \xff\xfe\n", "not UTF-8 text (byte 0xff at line 1, column 7); save it as UTF-8"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_files_give_one_clear_message(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        config.load(path)
    assert message in str(caught.value)
    assert str(caught.value).startswith(str(path))


def test_a_gpu_backend_without_its_extra_says_how_to_install_it():
    import importlib.util

    if importlib.util.find_spec("lmdeploy") is not None:
        pytest.skip("LMDeploy is installed here")
    with pytest.raises(ConfigError, match=r"needs LMDeploy and a GPU: pip install 'rlx\[gpu\]'"):
        config.load(PARAMS, ["rollout_config.backend=lmdeploy"])


def test_lmdeploy_training_rollouts_at_another_temperature_are_refused(monkeypatch):
    """LMDeploy 0.18 returns log-probs taken before temperature (tests/test_lmdeploy_contract.py)."""
    from helpers import lmdeploy_stand_in

    lmdeploy_stand_in.install(monkeypatch)
    lmdeploy = ["rollout_config.backend=lmdeploy"]
    with pytest.raises(ConfigError, match=r"temperature 0.7: LMDeploy returns the log-probs of its untempered"):
        config.load(PARAMS, [*lmdeploy, "dataflow_config.sample_params.temperature=0.7"])
    assert config.load(PARAMS, lmdeploy).rollout_config.backend == "lmdeploy"
    assert config.load(PARAMS, [*lmdeploy, "dataflow_config.sample_params.temperature=0"])


def test_training_rollouts_sampled_off_the_policy_are_refused_unless_allowed(monkeypatch):
    """top_k and top_p are scored over their support (rlx.algo.support); a repetition penalty or min_tokens,
    which the trainer cannot score, needs a leave, and a leave with nothing to allow is refused; LMDeploy
    returns log-probs before any of them act, so it samples training rollouts without them."""
    from helpers import lmdeploy_stand_in
    from rlx.stages.rollout import off_policy_advice

    sample = "dataflow_config.sample_params"
    assert config.load(PARAMS, [f"{sample}.top_p=0.9", f"{sample}.top_k=20"])
    with pytest.raises(ConfigError) as refused:
        config.load(PARAMS, [f"{sample}.repetition_penalty=1.2", f"{sample}.min_tokens=2"])
    assert str(refused.value).endswith(
        "dataflow_config.sample_params.repetition_penalty 1.2, dataflow_config.sample_params.min_tokens 2: training "
        "rollouts would sample from another distribution than the policy the trainer scores, so every update is "
        "off-policy; set dataflow_config.allow_off_policy_sampling: true to accept it (mismatch/k3_kl then says by "
        "how much, each step)"
    )
    allowed = config.load(PARAMS, [f"{sample}.min_tokens=2", "dataflow_config.allow_off_policy_sampling=true"])
    assert "min_tokens 2, which the trainer does not score" in off_policy_advice(allowed)  # said as the run starts
    with pytest.raises(ConfigError, match=r"allow_off_policy_sampling true: no setting .* so it cannot act"):
        config.load(PARAMS, ["dataflow_config.allow_off_policy_sampling=true"])
    lmdeploy_stand_in.install(monkeypatch)
    with pytest.raises(ConfigError, match=r"sample_params.top_p 0.9: LMDeploy returns each token's log-prob before"):
        config.load(PARAMS, ["rollout_config.backend=lmdeploy", f"{sample}.top_p=0.9"])


def test_a_lower_bound_the_correction_mode_cannot_use_is_refused():
    correction = "train_worker_cfg.loss_cfg.rollout_correction"
    with pytest.raises(ConfigError) as caught:
        config.load(PARAMS, [f"{correction}.mode=decoupled", f"{correction}.threshold_low=0.3"])
    assert str(caught.value) == (
        f"{PARAMS}: invalid configuration: {correction}.threshold_low: mode 'decoupled' has no lower bound, so "
        "threshold_low would change nothing; leave it at 0.5 or use mode 'mask'; got 0.3"
    )
    assert config.load(PARAMS, [f"{correction}.mode=mask", f"{correction}.threshold_low=0.3"])
    assert config.load(PARAMS, [f"{correction}.mode=decoupled", f"{correction}.threshold_low=0.5"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file"):
        config.load(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("no_equals_sign", "expected KEY=VALUE"),
        ("seed=[1, 2", "the value is not valid YAML"),
        ("replay_buffer_config.dataset_cfg.5.name=x", "expected a list index below 1, got '5'"),
        ("seed.inner=1", "seed is a int, not a section"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        config.load(PARAMS, [override])


def test_cli_reports_user_errors_without_traceback(tmp_path, capsys):
    path = write(tmp_path, "dataflow_config:\n  prompt_repeat_k: 0\n")
    with pytest.raises(SystemExit) as exited:
        main(["config", "show", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "dataflow_config.prompt_repeat_k: Input should be greater than 0; got 0" in err
    assert "Traceback" not in err


def test_cli_show_prints_resolved_yaml_with_overrides(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["config", "show", str(PARAMS), "-S", "seed=7"])
    assert exited.value.code == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["seed"] == 7
    assert shown["train_worker_cfg"]["loss_cfg"]["policy_loss_cfg"]["cliprange_high"] == 0.2


def test_cli_schema_lists_every_section(tmp_path):
    out = tmp_path / "schema.json"
    with pytest.raises(SystemExit) as exited:
        main(["config", "schema", "-o", str(out)])
    assert exited.value.code == 0
    schema = json.loads(out.read_text())
    assert set(schema["properties"]) == set(RLTrainerConfig.model_fields)
    assert "WorkerConfig" in schema["$defs"]


def test_cli_version_and_help(capsys):
    from rlx import __version__

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"rlx {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    for command in ("init-data", "init-model", "convert", "eval", "stage", "fit", "config"):
        assert command in help_text


@pytest.mark.parametrize("preset", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_is_a_valid_config(preset):
    """GPU presets are checked on a CPU machine too, with the CPU rollout backend swapped in."""
    import importlib.util

    from rlx.config import preset_overrides

    on_cpu = "gpu" in preset.parts and importlib.util.find_spec("lmdeploy") is None
    overrides = [*preset_overrides(preset), *(["rollout_config.backend=transformers"] if on_cpu else [])]
    assert config.load(PARAMS, overrides) != config.load(PARAMS)


def test_settings_that_cannot_act_here_are_refused_or_warned_once(recwarn):
    import torch

    from rlx.errors import UserError
    from rlx.run.preflight import check_setup

    check_setup(config.load(PARAMS))
    assert not [w for w in recwarn if "rollout_config" in str(w.message)]  # the demo sets none of them
    with pytest.warns(UserWarning, match=r"^rollout_config.context_length, rollout_config.extra_engine_args: read by "):
        check_setup(
            config.load(PARAMS, ["rollout_config.context_length=256", "rollout_config.extra_engine_args={a: 1}"])
        )
    zero3 = "train_worker_cfg.deepspeed.zero_stage=3"
    with pytest.raises(UserError, match=r"^train_worker_cfg.deepspeed.zero_stage 3 with train_worker_cfg.lora: "):
        check_setup(config.load(PARAMS, [zero3, "train_worker_cfg.lora={rank: 4}"]))
    check_setup(
        config.load(PARAMS, [zero3, "resources.num_workers=2"])
    )  # the cluster's devices are checked when it is joined
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"^resources.accelerator 'GPU': torch sees no CUDA device here"):
            check_setup(config.load(PARAMS, ["resources.accelerator=GPU"]))


def test_a_stage_refuses_an_accelerator_it_does_not_have_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible here")
    with pytest.raises(SystemExit) as exited:
        main(["stage", "prepare", str(PARAMS), "-S", "resources.accelerator=GPU"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "resources.accelerator 'GPU': torch sees no CUDA device here" in err and "Traceback" not in err


@pytest.mark.parametrize("seed", [0, 42, -1, 2**63 - 1, -(2**63)])
def test_every_seed_the_config_takes_gives_part_seeds_torch_takes(seed):
    """The config allows any 64-bit seed; a step's derived seed must still be one torch can be seeded with."""
    run = config.load(None, [f"seed={seed}"])
    for offset in (0, 1, 7919 * 30):
        derived = seeds.derive(run.seed, offset)
        assert 0 <= derived < 2**63
        torch.manual_seed(derived)
    assert seeds.derive(42, 3) == 42 * seeds.SPREAD + 3  # the demo's seeds are what they were


# ---- rlx.RLTrainer: XTuner v1's class over the same tree -------------------------------------------


def test_rl_trainer_takes_xtuners_keywords_as_sections_or_dicts_over_the_defaults():
    import inspect

    from rlx import RLTrainer

    named = set(inspect.signature(RLTrainer).parameters)
    xtuner = {  # XTuner v1's RLTrainer.__init__ (xtuner/v1/train/rl_trainer.py, 2026-04)
        "load_from", "resources", "cpu_resources", "rollout_config", "dataflow_config", "judger_config",
        "replay_buffer_config", "train_worker_cfg", "evaluator_config", "tokenizer_path", "work_dir", "log_dir",
        "total_epochs", "auto_resume", "load_checkpoint_cfg", "strict_load", "checkpoint_interval",
        "checkpoint_maxkeep", "checkpoint_no_save_optimizer", "skip_checkpoint_validation", "hf_interval",
        "hf_max_keep", "seed", "debug", "debug_rollout", "rollout_steps", "exp_tracker", "display_all_workers_log",
        "trainer_cfg", "advantage_estimator_config", "enable_evaluate",
    }  # fmt: skip
    assert xtuner <= named and "run" not in named
    as_objects = RLTrainer(
        dataflow_config=config.DataFlowConfig(global_batch_size=4, prompt_repeat_k=4),
        evaluator_config=config.EvaluatorConfig(evaluate_step=2),
        enable_evaluate=False,
        total_epochs=3,
    )
    as_dicts = RLTrainer(
        dataflow_config={"global_batch_size": 4, "prompt_repeat_k": 4},
        evaluator_config={"evaluate_step": 2, "enable_evaluate": True},
        enable_evaluate=False,  # the shortcut wins
        total_epochs=3,
    )
    expected = config.load(None, ["dataflow_config={global_batch_size: 4, prompt_repeat_k: 4}", "total_epochs=3",
                                  "evaluator_config={evaluate_step: 2, enable_evaluate: false}"])  # fmt: skip
    assert as_objects.config == as_dicts.config == expected
    demo = config.load(PARAMS)
    assert RLTrainer.from_config(demo).config == demo
    assert RLTrainer(trainer_cfg=demo, seed=7).config == demo.model_copy(update={"seed": 7})


def test_rl_trainer_lays_a_partial_section_over_trainer_cfg_field_by_field():
    """README: a field left out keeps trainer_cfg's value, at every depth, a section given as a dict or an object."""
    from rlx import RLTrainer

    base = config.load(None, ["dataflow_config.prompt_repeat_k=3", "dataflow_config.sample_params.max_tokens=48",
                              "dataflow_config.sample_params.top_p=0.9", "evaluator_config.evaluate_step=7"])  # fmt: skip
    for section in (
        {"global_batch_size": 4, "sample_params": {"max_tokens": 64}},
        config.DataFlowConfig(global_batch_size=4, sample_params=config.SampleParams(max_tokens=64)),
    ):
        got = RLTrainer(trainer_cfg=base, dataflow_config=section, enable_evaluate=False).config
        assert (got.dataflow_config.global_batch_size, got.dataflow_config.prompt_repeat_k) == (4, 3)
        assert (got.dataflow_config.sample_params.max_tokens, got.dataflow_config.sample_params.top_p) == (64, 0.9)
        assert (got.evaluator_config.evaluate_step, got.evaluator_config.enable_evaluate) == (7, False)


@pytest.mark.parametrize(
    ("keywords", "override"),
    [
        ({"dataflow_config": {"global_batch_size": -3}}, "dataflow_config.global_batch_size=-3"),
        ({"train_worker_cfg": {"optim_cfg": {"lr": "abc"}}}, "train_worker_cfg.optim_cfg.lr=abc"),
        ({"strict_laod": False}, "strict_laod=false"),
        ({"display_all_workers_log": True}, "display_all_workers_log=true"),
    ],
)
def test_a_bad_rl_trainer_parameter_gets_the_line_an_override_gets(keywords, override):
    from rlx import RLTrainer

    with pytest.raises(ConfigError) as from_python:
        RLTrainer(**keywords)
    with pytest.raises(ConfigError) as from_override:
        config.load(None, [override])
    assert str(from_python.value).removeprefix("RLTrainer: ") == str(from_override.value).removeprefix("config: ")
    assert "\n" not in str(from_python.value)


def test_rl_trainer_writes_only_the_fields_that_differ_into_the_params_file(tmp_path):
    """What RLTrainer.fit hands `rlx fit` as overrides: applied to the params file (as `rlx fit -S` applies
    them, keeping comments), they give the trainer's configuration; the demo's own gives none."""
    from rlx import RLTrainer
    from rlx.lineage.record import edit_params

    demo = config.load(PARAMS)
    assert config.overrides_between(demo, RLTrainer.from_config(demo).config) == []
    trainer = RLTrainer(rollout_steps=2, train_worker_cfg={"lora": {"rank": 4}}, cpu_resources={"num_workers": 2})
    overrides = config.overrides_between(demo, trainer.config)
    assert "rollout_steps=2" in overrides and "dataflow_config.sample_params.max_tokens=64" in overrides
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text())
    edit_params(params, overrides)
    assert config.load(params) == trainer.config.model_copy(update={"run": demo.run})
    assert "# base model: a HF folder" in params.read_text()


def test_rl_trainer_takes_a_function_object_and_records_its_module_and_name(tmp_path, monkeypatch):
    """TRL's ``reward_funcs=[function]`` habit: a function importable by every process rlx starts is recorded
    as its 'module:name', found from the project's folder as DVC's stages find it; one defined in the running
    program (a script's or a notebook's ``__main__``, or a closure) is refused with the way out."""
    import importlib

    from rlx import RLTrainer
    from rlx.errors import UserError

    (tmp_path / "my_rewards.py").write_text(
        "def exact(prompt, response, gold, row):\n    return float(gold in response)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    exact = importlib.import_module("my_rewards").exact
    judged = {"judger_name": "custom", "data_source": ["my/task"], "options": {"function": exact}}
    trainer = RLTrainer(judger_config={"reward_judger_configs": [judged]})
    assert trainer.config.judger_config.reward_judger_configs[0].options == {"function": "my_rewards:exact"}

    def inner(prompt, response, gold, row):
        return 1.0

    for unimportable in (inner, type("Scorer", (), {"__module__": "__main__"})):
        judged["options"]["function"] = unimportable
        with pytest.raises(UserError, match="RLTrainer.judger_config.reward_judger_configs.0.options.function: .* "
                                            "cannot be imported by the processes rlx starts; define it in a module"):  # fmt: skip
            RLTrainer(judger_config={"reward_judger_configs": [judged]})


def test_a_module_in_the_projects_folder_is_importable_by_name(tmp_path, monkeypatch):
    """`rlx fit` (a console script) has its own folder on sys.path, not the project's: a judger module beside
    params.yaml is found all the same, as DVC's stages, run from the project's folder, find it."""
    from rlx.plugins import load_callable

    (tmp_path / "beside_params.py").write_text("def score(**_):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert load_callable("beside_params:score", "custom judger")() == 1.0


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"trainer_cfg": 42}, "RLTrainer: trainer_cfg: expected an rlx.config.RLTrainerConfig, its dict or a params "
                              "file's path; got 42"),
        ({"trainer_cfg": "absent.yaml"}, "absent.yaml: no such file"),
        ({"params": None}, "RLTrainer: params: expected the path of the project's params file; got None"),
        ({"evaluator_config": None, "enable_evaluate": True}, "RLTrainer: enable_evaluate=True needs an "
                                                              "evaluator_config; got None"),
        ({"dataflow_config": 5}, "RLTrainer: invalid configuration: dataflow_config: Input should be a valid "
                                 "dictionary or instance of DataFlowConfig; got 5"),
    ],
)  # fmt: skip
def test_the_python_apis_bad_types_get_one_line_naming_the_argument(keywords, message):
    from rlx import RLTrainer

    with pytest.raises(ConfigError) as refused:
        RLTrainer(**keywords)
    assert str(refused.value) == message


def test_rl_trainer_takes_a_params_file_and_xtuners_no_evaluation():
    from rlx import RLTrainer

    demo = config.load(PARAMS)
    assert RLTrainer.from_config(PARAMS).config == RLTrainer(trainer_cfg=str(PARAMS)).config == demo
    assert RLTrainer(evaluator_config=None).config.evaluator_config.enable_evaluate is False


def test_an_override_of_the_staleness_moves_the_run_pointer_rlx_manages(tmp_path):
    """README's async command after a finished run: the user sets max_staleness, never run.rollout_policy."""
    from rlx.lineage.record import edit_params

    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text())
    edit_params(params, ["run.step=31", "run.prev=30", "run.checkpoint=30", "run.rollout_policy=30"])  # a finished run
    moved = config.load(params, ["dataflow_config.max_staleness=1", "work_dir=runs/async"])
    assert (moved.run.step, moved.run.rollout_policy) == (31, 29)
    with pytest.raises(
        ConfigError, match="run.rollout_policy must be run.prev less"
    ):  # a pointer set by hand is checked
        config.load(params, ["dataflow_config.max_staleness=1", "run.rollout_policy=30"])
