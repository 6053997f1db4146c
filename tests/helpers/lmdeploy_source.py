"""What Python source declares, read with ``ast`` and nothing imported: the LMDeploy contract check.

LMDeploy cannot be imported on a CPU machine without its CUDA-era dependencies (its engine modules
pull in torch <= 2.12.1, triton, xgrammar and more, while rlx's CPU environment has torch 2.13), so
the check reads the release's source as shipped in the wheel. For each name the stand-in copies it
compares what a caller can rely on: a function's parameters (name, kind, default) and whether it is
``async``; a class's public methods, the instance attributes its methods assign, and its annotated
fields (type and default). Re-exports (``from .messages import GenerationConfig``) are followed.
"""

from __future__ import annotations

import ast
from pathlib import Path

Function = ast.FunctionDef | ast.AsyncFunctionDef


def module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def definition(root: Path, dotted: str, name: str, hops: int = 5) -> ast.AST | None:
    """The class or function ``name`` as module ``dotted`` binds it, following ``from . import``."""
    path = module_file(root, dotted)
    if path is None or hops == 0:
        return None
    tree = parse(path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef | Function) and node.name == name:
            return node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            source = ".".join(filter(None, [package if node.level else "", node.module or ""]))
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            return definition(root, source, original, hops - 1)
    return None


def signature(node: Function) -> tuple:
    """Parameters as ``(name, kind, default source)``, and whether the function is async."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [(a.arg, "positional", _text(d)) for a, d in zip(positional, defaults, strict=True)]
    if args.vararg:
        params.append((args.vararg.arg, "*args", None))
    params += [(a.arg, "keyword", _text(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        params.append((args.kwarg.arg, "**kwargs", None))
    return tuple(params), isinstance(node, ast.AsyncFunctionDef)


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def methods(node: ast.ClassDef) -> dict[str, Function]:
    return {item.name: item for item in node.body if isinstance(item, Function)}


def fields(node: ast.ClassDef) -> dict[str, tuple[str, str | None]]:
    """Annotated class-level fields (dataclass or pydantic): ``name -> (type, default)``."""
    return {
        item.target.id: (ast.unparse(item.annotation), _text(item.value))
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def instance_attributes(node: ast.ClassDef) -> set[str]:
    """Names any method assigns as ``self.NAME = ...`` (or ``self.NAME: T = ...``)."""
    found = set()
    for method in methods(node).values():
        for item in ast.walk(method):
            targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            found.update(t.attr for t in targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self")
    return found


def public(name: str) -> bool:
    return not name.startswith("_")


def class_differences(label: str, copy: ast.ClassDef, real: ast.ClassDef) -> list[str]:
    problems = []
    real_methods = methods(real)
    for name, method in methods(copy).items():
        if not public(name):
            continue
        if name not in real_methods:
            problems.append(f"{label}.{name}: no such method in the release")
        elif signature(method) != signature(real_methods[name]):
            problems.append(
                f"{label}.{name}: the release has {_shown(real_methods[name])}, the stand-in {_shown(method)}"
            )
    real_fields = fields(real)
    for name, spec in fields(copy).items():
        if name not in real_fields:
            problems.append(f"{label}.{name}: no such field in the release")
        elif spec != real_fields[name]:
            problems.append(f"{label}.{name}: the release has {real_fields[name]}, the stand-in {spec}")
    missing = {a for a in instance_attributes(copy) if public(a)} - instance_attributes(real)
    problems += [f"{label}.{name}: the release's instances have no such attribute" for name in sorted(missing)]
    return problems


def _shown(node: Function) -> str:
    params, is_async = signature(node)
    text = ", ".join(n if d is None else f"{n}={d}" for n, _, d in params)
    return f"{'async ' if is_async else ''}def {node.name}({text})"


def differences(stand_in: Path, real: dict[str, str], root: Path) -> list[str]:
    """Every way the stand-in (a source file) differs from the release unpacked at ``root``."""
    copies = {node.name: node for node in parse(stand_in).body if isinstance(node, ast.ClassDef | Function)}
    problems = []
    for name, dotted in real.items():
        label, found = f"{dotted}.{name}", definition(root, dotted, name)
        if found is None:
            problems.append(f"{label}: not in the release")
        elif type(found) is not type(copies[name]):
            problems.append(f"{label}: a {type(found).__name__} in the release")
        elif isinstance(found, ast.ClassDef):
            problems += class_differences(label, copies[name], found)
        elif signature(found) != signature(copies[name]):
            problems.append(f"{label}: the release has {_shown(found)}, the stand-in {_shown(copies[name])}")
    return problems


def function_source(root: Path, dotted: str, qualname: str) -> str | None:
    """The source of ``Class.method`` or ``function`` in module ``dotted`` (None when absent)."""
    path = module_file(root, dotted)
    if path is None:
        return None
    node: ast.AST | None = parse(path)
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", []) if getattr(n, "name", None) == part), None)
    return None if node is None else ast.get_source_segment(path.read_text(encoding="utf-8"), node)
