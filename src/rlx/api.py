"""The run from Python (a notebook): :class:`RLTrainer`, XTuner v1's class field for field, and
``rlx.train``; both do what `rlx fit` does, in this process."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlx.config import ConfigError, RLTrainerConfig, load, overrides_between, validated
from rlx.debugging import quiet_libraries
from rlx.lineage.record import make_room_for_the_recorder
from rlx.plugins import spec_of


def train(params="params.yaml", overrides=(), work_dir=None):
    """Run (or resume) the run of ``params`` as `rlx fit PARAMS -S ...` does, in this process, and return
    its :class:`rlx.explore.Run`. As with `-S`, the overrides (and ``work_dir``) are written into the
    params file, so DVC records what ran; paths in it are relative to its folder."""
    make_room_for_the_recorder()
    quiet_libraries()  # as `rlx fit` is: a notebook shows rlx's lines, not the libraries' bars
    from rich.console import Console

    from rlx.explore import Run
    from rlx.run.fit import fit

    params = Path(params).resolve()
    overrides = [*overrides, *([f"work_dir={work_dir}"] if work_dir is not None else [])]
    fit(params, overrides, notebook_console() if "ipykernel" in sys.modules else Console())
    return Run(params.parent / load(params).work_dir)  # an absolute work_dir stays as it is


def notebook_console():
    """A console for a notebook's output: plain lines, one a step (rich's Jupyter display recurses from the
    progress thread, and a bar redrawn as a terminal's left hundreds of fragments in the cell's output)."""
    from rich.console import Console

    return Console(force_jupyter=False, force_terminal=False)


class RLTrainer:
    """XTuner v1's ``RLTrainer``: its keyword parameters are the fields of :class:`rlx.config.RLTrainerConfig`,
    the tree params.yaml holds, each section given as rlx's config object or as a plain dict. A field
    left out takes ``trainer_cfg``'s value when that is given, else its default (the tiny CPU demo's);
    ``enable_evaluate`` is the shortcut for ``evaluator_config.enable_evaluate``. A bad parameter raises
    :class:`rlx.config.ConfigError` with the field's path, the line `rlx fit -S` prints.

    rlx addition: ``params``, the params file of the DVC project the run is made and recorded in.
    :meth:`fit` writes the parameters into it and runs the run as `rlx fit` does::

        trainer = RLTrainer(load_from="data/tiny-qwen3", dataflow_config={"global_batch_size": 4}, total_epochs=1)
        run = trainer.fit()          # an rlx.explore.Run: run.history(), run.samples(step), ...
    """

    def __init__(self, *, params="params.yaml", trainer_cfg=None, enable_evaluate: bool | None = None, **fields):
        make_room_for_the_recorder()  # validating the algorithms' names imports torch
        if "run" in fields:
            raise ConfigError("RLTrainer: run: the pipeline's pointer to its step, which fit sets; not a parameter")
        if not isinstance(params, str | Path):
            raise ConfigError(f"RLTrainer: params: expected the path of the project's params file; got {params!r}")
        tree = merged(base_tree(trainer_cfg), named_functions(fields))
        if tree.get("evaluator_config", {}) is None:  # XTuner's "no evaluation"
            if enable_evaluate:
                raise ConfigError("RLTrainer: enable_evaluate=True needs an evaluator_config; got None")
            tree["evaluator_config"] = {"enable_evaluate": False}
        if enable_evaluate is not None:
            tree["evaluator_config"] = {**as_tree(tree.get("evaluator_config", {})), "enable_evaluate": enable_evaluate}
        self.params = Path(params)
        self.config = validated(tree, "RLTrainer")

    @classmethod
    def from_config(cls, config: RLTrainerConfig | str | Path, params="params.yaml") -> RLTrainer:
        """The trainer of a whole configuration (``rlx.config.load("params.yaml")``, or that file's path)."""
        return cls(params=params, trainer_cfg=config)

    def fit(self):
        """Run (or resume) the run: the fields that differ from what ``params`` holds are written into it
        (its comments kept), as `rlx fit -S` writes overrides, so DVC records what ran; returns the run's
        :class:`rlx.explore.Run`."""
        return train(self.params, overrides_between(load(self.params), self.config))


def base_tree(trainer_cfg: Any) -> dict:
    """What ``trainer_cfg`` gives the fields left out: a whole configuration, its dict, or a params file's path."""
    if trainer_cfg is None:
        return {}
    if isinstance(trainer_cfg, str | Path):
        return load(trainer_cfg).model_dump()
    if isinstance(trainer_cfg, RLTrainerConfig | dict):
        return as_tree(trainer_cfg)
    raise ConfigError(
        f"RLTrainer: trainer_cfg: expected an rlx.config.RLTrainerConfig, its dict or a params file's path; "
        f"got {trainer_cfg!r}"
    )


def named_functions(tree: Any, path: str = "RLTrainer") -> Any:
    """``tree`` with each function in it (a custom judger, an agent tool, ...) as the ``module:name`` the
    config records, as TRL takes ``reward_funcs=[function]``."""
    if isinstance(tree, dict):
        return {key: named_functions(value, f"{path}.{key}") for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return [named_functions(value, f"{path}.{index}") for index, value in enumerate(tree)]
    return spec_of(tree, path) if callable(tree) else tree


def merged(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` laid over it field by field, at every depth: a section given in part keeps
    ``base``'s other fields, and a section given as a config object brings only the fields it was given."""
    tree = dict(base)
    for key, value in changes.items():
        value = value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value
        tree[key] = merged(tree[key], value) if isinstance(tree.get(key), dict) and isinstance(value, dict) else value
    return tree


def as_tree(section: Any) -> dict:
    """A section (or the whole config) as the dict that validates to it; a dict as a copy."""
    return section.model_dump() if isinstance(section, BaseModel) else dict(section)


def signature() -> inspect.Signature:
    """RLTrainer's keyword parameters, as help() and a notebook's completion show them: every field of
    the config (but ``run``) with its default, then XTuner's shortcuts and rlx's ``params``."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    fields = [
        inspect.Parameter(
            name, keyword, default=info.get_default(call_default_factory=True), annotation=info.annotation
        )
        for name, info in RLTrainerConfig.model_fields.items()
        if name != "run"
    ]
    shortcuts = [
        inspect.Parameter("enable_evaluate", keyword, default=None, annotation=bool | None),
        inspect.Parameter("trainer_cfg", keyword, default=None, annotation=RLTrainerConfig | dict | None),
        inspect.Parameter("params", keyword, default="params.yaml", annotation=str | Path),
    ]
    return inspect.Signature([*fields, *shortcuts])


RLTrainer.__signature__ = signature()
