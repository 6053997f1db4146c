"""The parts of the device bundle and the GPU check a CPU can run: the size check, the slimmed
LMDeploy wheel, the read-through import check, and the GPU script's refusals (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_bundle  # noqa: E402


def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})


@pytest.mark.parametrize("wheel_mib", [None, 61])
def test_a_missing_or_oversized_bundle_is_one_line_and_exit_2(tmp_path, wheel_mib):
    if wheel_mib:
        with open(tmp_path / "big-1.0-py3-none-any.whl", "wb") as wheel:
            wheel.truncate(wheel_mib * 2**20)
    done = run(sys.executable, "scripts/gpu_bundle.py", "size", str(tmp_path))
    expected = "over the 60 MiB a device call carries" if wheel_mib else "no device bundle here; run `make gpu-bundle`"
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: {tmp_path}: ") and expected in done.stderr


def test_the_gpu_check_without_lmdeploy_or_its_bundle_is_one_line_and_exit_2(tmp_path):
    bundle, target = str(tmp_path / "none"), str(tmp_path / "target")  # no earlier call installed one there
    done = run("scripts/gpu_check.sh", PYTHON=sys.executable, RLX_GPU_BUNDLE=bundle, RLX_BUNDLE_TARGET=target)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"error: {tmp_path / 'none'}: no device bundle here; run `make gpu-bundle` first\n"


SLIMMED = {
    "lmdeploy": (gpu_bundle.TURBOMIND, ["lmdeploy/turbomind/_turbomind.cpython-312-x86_64-linux-gnu.so"]),
    "ray": (
        gpu_bundle.RAY_LEFT_OUT,
        ["ray/jars/ray_dist.jar", "ray/dashboard/client/build/index.html", "ray/rllib/__init__.py"],
    ),
}
KEPT = {
    "lmdeploy": ["lmdeploy/__init__.py", "lmdeploy/turbomind/__init__.py"],
    "ray": ["ray/__init__.py", "ray/_raylet.so", "ray/core/src/ray/raylet/raylet", "ray/dashboard/agent.py"],
}


@pytest.mark.parametrize("package", SLIMMED)
def test_lmdeploy_and_ray_travel_without_what_the_device_never_runs(tmp_path, package):
    left_out, dropped = SLIMMED[package]
    wheel = tmp_path / f"{package}-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    record = f"{package}-1.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in [*KEPT[package], *dropped]:
            archive.writestr(name, b"\0" * 64)
        archive.writestr(record, "".join(f"{name},sha256=x,64\n" for name in [*KEPT[package], *dropped]))
    gpu_bundle.slimmed(wheel, left_out)
    with zipfile.ZipFile(wheel) as archive:
        assert archive.namelist() == [*KEPT[package], record]
        assert [line.split(",")[0] for line in archive.read(record).decode().splitlines()] == KEPT[package]


def test_the_read_through_finds_what_loaded_modules_import_and_nothing_provides(tmp_path):
    package = tmp_path / "site" / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("import os\nimport yaml\nfrom .sub import thing\n")
    (package / "sub" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nimport present\n"
        "try:\n    import optional\nexcept ImportError:\n    optional = None\n"
        "if TYPE_CHECKING:\n    import typing_only\n"
        "def later():\n    import lazy\n"
        "import absent.deep\n"
    )
    (tmp_path / "site" / "present.py").write_text("")
    assert gpu_bundle.unmet_imports([tmp_path / "site"], "pkg", ["pkg"]) == {"absent": "pkg.sub"}


def test_every_runtime_dependency_travels_or_is_on_the_device():
    """A dependency added to pyproject.toml but not to the bundle would fail on the GPU machine only."""
    import re
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {gpu_bundle.normalized(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)) for spec in declared}
    known = {*gpu_bundle.DEVICE_HAS, *gpu_bundle.RLX_NEEDS, *gpu_bundle.BUILT_HERE, *gpu_bundle.LEFT_BEHIND}
    assert names - {gpu_bundle.normalized(name) for name in known} == set()
