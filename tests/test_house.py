"""The rules that keep the package readable: each folder one concern, the rooms in a declared order
(nothing imports a room above its own), no import cycle, no module over 400 lines, no function over 60,
and README's layout map naming every module."""

from __future__ import annotations

import ast
import re

from conftest import ROOT
from rlx.lineage import dvcdeps

PACKAGE = ROOT / "src" / "rlx"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60

# The library's rooms from the bottom up; a room imports only from its own and those below it. The
# modules on one line share a level (their own imports are only kept free of cycles).
ORDER = [
    "errors seeds clock phases debugging helper_processes tokens plugins",  # what every room uses
    "store",  # a run's files
    "algo",  # pure tensor functions
    "config",  # the typed config tree: names the algorithms, imports the user's plugins to check them
    "lineage",  # fingerprints and DVC's record
    "training",  # the policy update
    "samplers",  # generation
    "agents",  # multi-turn rollouts over a sampler
    "judgers",  # rewards (an agent environment's among them)
    "tasks",  # prompt datasets and the demo's model
    "engines",  # what every process keeps warm
    "stages",  # one module per dvc.yaml stage
    "run workers cli __main__ api explore",  # the run, where its policy lives, and the faces
]
LEVEL = {f"rlx.{room}": level for level, rooms in enumerate(ORDER) for room in rooms.split()}


def all_modules() -> set[str]:
    names = set()
    for file in PACKAGE.rglob("*.py"):
        parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def level(name: str) -> int:
    """The level of the room ``name`` is in (a module's room: its top folder below rlx, or itself)."""
    return LEVEL[".".join(name.split(".")[:2])]


def import_graph() -> dict[str, set[str]]:
    # an import of a.b.c imports a and a.b first; a module's own packages are no edge (they load before it)
    return {
        name: {p for m in dvcdeps.imports(name) for p in dvcdeps.packages(m)} - set(dvcdeps.packages(name))
        for name in all_modules()
    }


def test_every_room_is_in_the_declared_order():
    rooms = {".".join(name.split(".")[:2]) for name in all_modules()} - {"rlx"}
    assert sorted(rooms - set(LEVEL)) == [], "rooms missing from ORDER"
    assert sorted(set(LEVEL) - rooms) == [], "ORDER names rooms that are gone"


def test_nothing_is_imported_from_a_room_above():
    upward = {
        name: sorted(m for m in imported if m != "rlx" and level(m) > level(name))
        for name, imported in import_graph().items()
        if name != "rlx" and any(m != "rlx" and level(m) > level(name) for m in imported)
    }
    assert upward == {}, f"imports from a room above its own (tests/test_house.py ORDER): {upward}"


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
