"""Reading params.yaml safely (size, aliases, duplicate keys, encoding), ``-S`` overrides and
presets, and validation errors as one line per field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlx.config.fields import ConfigError
from rlx.config.trainer import RLTrainerConfig, rollout_policy_step


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Set ``a.b.c=value`` in a nested dict; the value is parsed as YAML (``32``, ``true``, ``[1, 2]``)."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r}: expected KEY=VALUE, e.g. dataflow_config.global_batch_size=32")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({exc.problem})") from None
    *parents, leaf = key.strip().split(".")
    node: Any = tree
    for depth, part in enumerate(parents):
        path = ".".join(parents[: depth + 1])
        if isinstance(node, list):
            node = node[_list_index(node, part, path)]
        elif isinstance(node, dict):
            if node.get(part) is None:  # a section left out or off (``lora: null``): setting a field in it turns it on
                node[part] = {}
            node = node[part]
        else:
            raise ConfigError(f"override {override!r}: {path} is a {type(node).__name__}, not a section")
    if isinstance(node, list):
        node[_list_index(node, leaf, key)] = value
    elif isinstance(node, dict):
        node[leaf] = value
    else:
        raise ConfigError(f"override {override!r}: {'.'.join(parents)} is a {type(node).__name__}, not a section")


def preset_overrides(path: Path) -> list[str]:
    """A preset file (a partial params.yaml) as ``KEY=VALUE`` overrides, one per leaf."""
    overrides: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            overrides.append(f"{prefix}={yaml_value(node)}")

    walk("", read_yaml(Path(path)))
    return overrides


def yaml_value(value: Any) -> str:
    """``value`` as the VALUE of a ``KEY=VALUE`` override, which :func:`apply_override` reads back equal."""
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def changed(old: dict, new: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(path, old value, new value)`` for each leaf that differs between two config trees; a list, or a
    section present on one side only (or null there), counts as one leaf."""
    found = []
    for key in sorted(set(old) | set(new), key=str):
        before, after, path = old.get(key), new.get(key), f"{prefix}{key}"
        if isinstance(before, dict) and isinstance(after, dict):
            found += changed(before, after, f"{path}.")
        elif before != after:
            found.append((path, before, after))
    return found


def overrides_between(old: RLTrainerConfig, new: RLTrainerConfig) -> list[str]:
    """The ``KEY=VALUE`` overrides that make a params file holding ``old`` hold ``new``, one per leaf that
    differs, so the file keeps its comments and everything else as written. ``run`` is left out: it is
    the pipeline's pointer, which `rlx fit` sets."""
    trees = [config.model_dump(mode="json", exclude={"run"}) for config in (old, new)]
    return [f"{path}={yaml_value(value)}" for path, _, value in changed(*trees)]


def _list_index(items: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"override path {path}: expected a list index below {len(items)}, got {part!r}")
    return int(part)


def format_validation_error(error: ValidationError, source: str) -> str:
    """One readable line per problem: the field path, the bad value and what was expected (a single
    problem is reported on the same line as the file)."""
    count = error.error_count()
    lines = [f"{source}: invalid configuration" + (f" ({count} problems)" if count > 1 else ":")]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        indent = "  " if count > 1 else " "
        prefix = f"{indent}{path}: " if path else indent
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"{prefix}unknown field (check the spelling; `rlx config schema` lists every field)")
        elif item["type"] == "missing":
            lines.append(f"{prefix}required field is missing")
        elif isinstance(item["input"], (dict, list)):  # a cross-field rule: its message names the fields
            lines.append(f"{prefix}{message}")
        else:
            lines.append(f"{prefix}{message}; got {item['input']!r}")
    return "\n".join(lines) if count > 1 else "".join(lines)


def not_utf8(exc: UnicodeDecodeError) -> str:
    """Where a decoding error is, as a person finds it in an editor: the byte, its line and column."""
    before = exc.object[: exc.start]
    line, column = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at line {line}, column {column})"


def duplicate_key(node: yaml.Node, path: str = "") -> str | None:
    """The first key a YAML mapping sets twice, as ``key.path at line N (already set at line M)``.
    PyYAML keeps the last of the two silently, so a params file could mean something it does not say."""
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = f"{path}.{key_node.value}" if path else str(key_node.value)
            if key in first_line:
                return f"{key} at line {key_node.start_mark.line + 1} (already set at line {first_line[key]})"
            first_line[key] = key_node.start_mark.line + 1
            children.append((key, value_node))
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{path}.{index}", item) for index, item in enumerate(node.value)]
    return next((found for key, child in children if (found := duplicate_key(child, key))), None)


MAX_PARAMS_BYTES = 1 << 20  # a params file is kilobytes; past this it is a mistake (or an attack)


MAX_YAML_NODES = 100_000  # values a file may stand for once its aliases are expanded (billion laughs)


def expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` stands for with every alias expanded, counted once per distinct node."""
    if id(node) not in sizes:
        sizes[id(node)] = 0  # a cycle counts as nothing more
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        sizes[id(node)] = min(MAX_YAML_NODES + 1, 1 + sum(expanded_size(child, sizes) for child in children))
    return sizes[id(node)]


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, turning every way it can fail into a ConfigError."""
    try:
        if Path(path).stat().st_size > MAX_PARAMS_BYTES:
            raise ConfigError(f"{path}: {Path(path).stat().st_size:,} bytes, more than a params file can be (1 MiB)")
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {not_utf8(exc)}; save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and expanded_size(node, {}) > MAX_YAML_NODES:
            raise ConfigError(
                f"{path}: its aliases expand to more than {MAX_YAML_NODES:,} values; write the values out"
            )
        duplicate = duplicate_key(node) if node is not None else None
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', exc)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a params file") from None
    if duplicate:
        raise ConfigError(f"{path}: duplicate key {duplicate}; keep one of them")
    if tree is None:
        raise ConfigError(f"{path}: the file is empty; write the fields to set (see `rlx config show`)")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level, got a {type(tree).__name__}")
    return tree


def load(path: str | Path | None = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> RLTrainerConfig:
    """Read ``path`` (None: the defaults alone), apply ``KEY=VALUE`` overrides, and validate."""
    tree = read_yaml(Path(path)) if path is not None else {}
    for override in overrides:
        apply_override(tree, override)
    if not any(override.startswith("run.") for override in overrides):
        follow_the_run_pointer(tree)
    return validated(tree, str(path or "config"))


def follow_the_run_pointer(tree: dict[str, Any]) -> None:
    """``run.rollout_policy`` as the step and ``dataflow_config.max_staleness`` make it: an override that
    changes the staleness moves the pointer rlx manages, which the user never sets (`rlx fit` writes both)."""
    run, flow = tree.get("run"), tree.get("dataflow_config")
    if not isinstance(run, dict) or not isinstance(run.get("step"), int):
        return
    staleness = flow.get("max_staleness", 0) if isinstance(flow, dict) else 0
    if isinstance(staleness, int) and "rollout_policy" in run:
        run["rollout_policy"] = rollout_policy_step(run["step"], staleness)


def validated(tree: dict[str, Any], source: str) -> RLTrainerConfig:
    """The config tree checked, or a ConfigError naming ``source`` and one line per bad field."""
    try:
        return RLTrainerConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def to_yaml(config: RLTrainerConfig) -> str:
    """The resolved config as YAML that :func:`load` reads back to an equal tree."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def json_schema() -> dict[str, Any]:
    """JSON schema of params.yaml, for editors and for documentation."""
    return RLTrainerConfig.model_json_schema()


def round_trip_yaml():
    """A ruamel YAML that rewrites a file rlx edits (params.yaml, dvc.yaml) keeping its comments, quotes,
    indents and ``null`` as written (ruamel would leave the value empty: ``lora:``)."""
    from ruamel.yaml import YAML

    def write_null(representer, _):
        return representer.represent_scalar("tag:yaml.org,2002:null", "null")

    round_trip = YAML()
    round_trip.preserve_quotes = True
    round_trip.indent(mapping=2, sequence=4, offset=2)
    round_trip.representer.add_representer(type(None), write_null)
    return round_trip
