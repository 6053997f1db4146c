"""The rules that keep the package readable: each folder one concern, nothing imported upward (the run
and the faces above the stages, the stages above the library), no import cycle, no module over 400
lines, no function over 60, and README's layout map naming every module."""

from __future__ import annotations

import ast
import re

from conftest import ROOT
from rlx.lineage import dvcdeps

PACKAGE = ROOT / "src" / "rlx"
FACES = {"rlx.cli", "rlx.__main__", "rlx.api", "rlx.explore"}  # with rlx.run: above the stages
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def all_modules() -> set[str]:
    names = set()
    for file in PACKAGE.rglob("*.py"):
        parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def floor(name: str) -> int:
    """2: the run, its workers and the faces; 1: the stages; 0: the library they share."""
    if name in FACES or any(name == room or name.startswith(f"{room}.") for room in ("rlx.run", "rlx.workers")):
        return 2
    return 1 if name == "rlx.stages" or name.startswith("rlx.stages.") else 0


def import_graph() -> dict[str, set[str]]:
    # an import of a.b.c imports a and a.b first; a module's own packages are no edge (they load before it)
    return {
        name: {p for m in dvcdeps.imports(name) for p in dvcdeps.packages(m)} - set(dvcdeps.packages(name))
        for name in all_modules()
    }


def test_nothing_is_imported_from_a_floor_above():
    upward = {
        name: sorted(m for m in imported if floor(m) > floor(name))
        for name, imported in import_graph().items()
        if name != "rlx" and any(floor(m) > floor(name) for m in imported)
    }
    assert upward == {}, f"imports from a floor above (the run > the stages > the library): {upward}"


def test_the_import_graph_has_no_cycle():
    graph, state = import_graph(), {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for other in sorted(graph[name]):
            assert state.get(other) != "open", f"import cycle: {' -> '.join([*path, name, other])}"
            if other not in state:
                visit(other, [*path, name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_no_module_or_function_is_too_long():
    too_long = []
    for file in sorted(PACKAGE.rglob("*.py")):
        text = file.read_text()
        where = file.relative_to(PACKAGE.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    assert too_long == [], f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function"


def layout_entries() -> dict[str, str]:
    """README's layout map under ``src/rlx/``: each entry (a folder ``name/`` or the top-level files)
    with the words describing it, continuation lines included."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout") :].split("```")[1]
    package = block[block.index("src/rlx/\n") :].splitlines()[1:]
    entries: dict[str, str] = {}
    current = ""
    for line in package:
        if not line.startswith("  "):
            break
        if not line.startswith("   "):  # a new entry at two spaces; deeper lines go on with the last one
            current = line.split()[0] if line.split()[0].endswith("/") else ""
        entries[current] = entries.get(current, "") + " " + line
    return entries


def test_readme_layout_names_every_module_and_folder():
    entries, missing = layout_entries(), []
    for file in sorted(PACKAGE.rglob("*.py")):
        folder = file.parent.relative_to(PACKAGE).as_posix()
        if folder == ".":
            if file.name not in entries[""].split():
                missing.append(file.name)
        elif f"{folder}/" not in entries:
            missing.append(f"{folder}/")
        elif file.name != "__init__.py" and not re.search(rf"\b{file.stem}\b", entries[f"{folder}/"]):
            missing.append(f"{folder}/{file.name}")
    assert missing == [], "missing from README's Layout map"
