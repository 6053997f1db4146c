"""Every fenced block of the README and of the reference pages in docs/ runs as a user would run it, in
order, in one copy of the project (the demo shortened by conftest.SHORT_RUN), or says
visibly why it is not run here: a paragraph ``*Not run by the tests: REASON.*`` right above it. Sybil finds
the blocks (fences in lists included).

- ``bash``: the block, as pasted, in bash (``set -euo pipefail``) in the project's folder;
- ``python``: a block starting ``# NAME.py`` is that file of the project; any other is saved to a file
  and run with ``python FILE`` (no ``__main__`` guard: the user's program must run once);
- ``yaml``: a block starting ``# NAME.yaml`` is that preset of the project; any other must load as one;
- ``console``: each ``$ COMMAND`` runs and prints the lines shown under it (``...``: more follows;
  ``/path/to/rlx``: the project's folder);
- ``text``: figures (a diagram, the layout map), nothing to run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser

from conftest import ROOT, child_env, make_project

pytestmark = pytest.mark.slow

LANGUAGES = ("bash", "python", "yaml", "console", "text")
MARK = re.compile(r"\*Not run by the tests: (?P<reason>[^*]+)\*$")
MARKED = 7  # blocks that say why they are not run: make fit/test, XTuner's and its 8-GPU twin, two figures' runs,
# the agent demo's half hour, the distillation demo's four runs, jupyter lab
NAMED_FILE = re.compile(r"^# (?P<name>[\w.-]+\.(py|yaml))\n")


class Block(CodeBlockParser):
    def evaluate(self, example):  # the test runs the blocks itself, in the project
        raise NotImplementedError


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(page: Path) -> list:
    return list(Sybil([Block(language) for language in LANGUAGES]).parse(page).examples())


def mark_of(example) -> str | None:
    """The reason in the lines right above the block (no blank line between), if they say it is not run."""
    paragraph = example.document.text[: example.start].rstrip().rsplit("\n\n", 1)[-1]
    found = MARK.search(" ".join(paragraph.split()))
    return found["reason"] if found else None


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


@pytest.fixture(scope="module")
def project(tiny_model, tmp_path_factory) -> Path:
    """The project as a clone would have it, in a folder named as the repository (a block names ../rlx),
    committed, so `rlx reset` and `git worktree` find a commit. The pages' blocks run in it one after the
    other, as a reader of the README and then of docs/ would run them."""
    base = tmp_path_factory.mktemp("readme")
    folder = make_project(base, tiny_model).rename(base / "rlx")
    git = ["git", "-c", "user.name=rlx", "-c", "user.email=rlx@localhost"]
    subprocess.run([*git, "add", "-A"], cwd=folder, check=True)
    subprocess.run([*git, "commit", "-qm", "the demo"], cwd=folder, check=True)
    return folder


def shell(command: str, folder: Path) -> subprocess.CompletedProcess:
    env = child_env() | {"COLUMNS": "200", "WANDB_MODE": "disabled"}
    script = f"set -euo pipefail\n{command}"
    return subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=900)


def run_python(source: str, folder: Path, line: int) -> subprocess.CompletedProcess:
    named = NAMED_FILE.match(source)
    if named:
        (folder / named["name"]).write_text(source)
        return shell(f"{sys.executable} -c 'import {Path(named['name']).stem}'", folder)
    program = folder / f"readme_line_{line}.py"
    program.write_text(source)
    return shell(f"{sys.executable} {program.name}", folder)


def run_yaml(source: str, folder: Path, line: int) -> subprocess.CompletedProcess:
    named = NAMED_FILE.match(source)
    preset = folder / (named["name"] if named else f"readme_line_{line}.yaml")
    preset.write_text(source)
    return shell(f"rlx config show params.yaml --preset {preset.name} > /dev/null", folder)


def transcript_problems(source: str, folder: Path) -> list[str]:
    """Each ``$ COMMAND`` run, its output compared with the lines shown under it."""
    problems = []
    for part in source.split("$ ")[1:]:
        command, *shown = part.rstrip("\n").split("\n")
        done = shell(command, folder)
        printed = " ".join((done.stdout + done.stderr).split())
        for line in shown:
            expected = " ".join(line.replace("/path/to/rlx", str(folder)).split())
            if expected != "..." and expected not in printed:
                problems.append(f"$ {command}\n  expected: {expected}\n  printed: {printed[:2000]}")
    return problems


def block_id(block) -> str:
    return f"{Path(block.path).name}-line-{block.line}-{block.region.lexemes['arguments']}"


@pytest.mark.parametrize("example", BLOCKS, ids=[block_id(b) for b in BLOCKS])
def test_readme_block_runs_as_pasted(example, project):
    language, source = example.region.lexemes["arguments"], str(example.parsed)
    if reason := mark_of(example):
        pytest.skip(f"README says: not run by the tests: {reason}")
    if language == "text":
        pytest.skip("a figure: nothing to run")
    if language == "console":
        assert not (problems := transcript_problems(source, project)), "\n".join(problems)
        return
    runner = {"bash": lambda *a: shell(a[0], a[1]), "python": run_python, "yaml": run_yaml}[language]
    done = runner(source, project, example.line)
    assert done.returncode == 0, f"{block_id(example)}:\n{source}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_every_fence_has_a_language_and_every_block_not_run_says_why():
    for page in PAGES:
        opening = re.findall(r"^ *```(\S*)", page.read_text(), flags=re.MULTILINE)[::2]
        assert all(language in LANGUAGES for language in opening), (page.name, opening)
        assert len(blocks_of(page)) == len(opening), f"{page.name}: Sybil found another number of blocks than fences"
    marked = [block_id(b) for b in BLOCKS if mark_of(b)]
    run = [block_id(b) for b in BLOCKS if not mark_of(b) and b.region.lexemes["arguments"] != "text"]
    assert len(marked) == MARKED and len(run) >= 15, (marked, run)
