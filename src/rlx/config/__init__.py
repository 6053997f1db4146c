"""The run's configuration: one typed tree, loaded from ``params.yaml``.

Field and section names follow XTuner v1's ``RLTrainerConfig`` (``load_from``, ``dataflow_config``,
``train_worker_cfg``, ...) so a user can carry a config over. Where rlx adds or differs, the field's
description says so. Every model forbids unknown keys: a typo is an error, never a silent default.

``load(path, overrides)`` is the single entry point; it raises :class:`ConfigError` whose message
names the field path, the bad value and what was expected. One module per part of the tree:
``trainer`` (the top level), ``rollout``, ``data``, ``judging``, ``training``, ``evaluation``,
``project`` (the demo's own task and model); ``fields`` holds what every section shares and
``loading`` reads files and overrides.
"""

from rlx.config.agent import AgentLoopConfig
from rlx.config.data import DatasetConfig, ReplayBufferConfig
from rlx.config.evaluation import EvalDatasetConfig, EvaluatorConfig
from rlx.config.fields import ConfigError, Section, unsupported_reason
from rlx.config.judging import JudgerConfig, JudgerItemConfig, OverlongBufferConfig
from rlx.config.loading import (
    apply_override,
    changed,
    json_schema,
    load,
    overrides_between,
    preset_overrides,
    read_yaml,
    to_yaml,
    validated,
)
from rlx.config.project import SyntheticTaskConfig, TinyModelConfig
from rlx.config.rollout import (
    AcceleratorResourcesConfig,
    CPUResourcesConfig,
    DataFlowConfig,
    RolloutConfig,
    SampleParams,
)
from rlx.config.teacher import TeacherConfig, TeacherItemConfig
from rlx.config.trainer import (
    LoadCheckpointConfig,
    RLTrainerConfig,
    RunPointer,
    WandbConfig,
    rollout_policy_step,
    staleness,
)
from rlx.config.training import (
    AdamWConfig,
    AdvantageEstimatorConfig,
    DeepSpeedConfig,
    KLControlConfig,
    LoraConfig,
    LossConfig,
    LRConfig,
    PolicyLossConfig,
    RolloutCorrectionConfig,
    WorkerConfig,
)

__all__ = [
    "AcceleratorResourcesConfig", "AdamWConfig", "AdvantageEstimatorConfig", "AgentLoopConfig", "ConfigError",
    "CPUResourcesConfig", "DataFlowConfig",
    "DatasetConfig", "DeepSpeedConfig", "EvalDatasetConfig", "EvaluatorConfig", "JudgerConfig", "JudgerItemConfig",
    "KLControlConfig", "LRConfig", "LoadCheckpointConfig", "LoraConfig", "LossConfig", "OverlongBufferConfig",
    "PolicyLossConfig", "RLTrainerConfig", "ReplayBufferConfig", "RolloutConfig", "RolloutCorrectionConfig",
    "RunPointer", "SampleParams", "Section", "SyntheticTaskConfig", "TeacherConfig",
    "TeacherItemConfig", "TinyModelConfig", "WandbConfig", "WorkerConfig",
    "apply_override", "changed", "json_schema", "load", "overrides_between", "preset_overrides", "read_yaml",
    "rollout_policy_step", "staleness", "to_yaml", "unsupported_reason", "validated",
]  # fmt: skip
