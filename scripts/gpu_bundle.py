"""The device bundle (`make gpu-bundle`): cp312 manylinux x86_64 wheels of what a GPU run needs and
the lent GPU machine lacks, for `pip install --no-index --no-deps --target DIR` there (it has no network).

The machine has torch 2.11 (CUDA 13), transformers 5.17, triton 3.6, safetensors, accelerate,
pyarrow, pandas, typer, rich, pytest and pytest-benchmark, with their own dependencies (``DEVICE_HAS``).
LMDeploy travels without its TurboMind library (363 MB; the PyTorch engine does not load it) and with
only the dependencies its PyTorch-engine modules import (``LMDEPLOY_NEEDS``; its full list also names
ray, rdkit, torchvision, tilelang, opencv and more, which that path never imports). W&B stays behind:
the GPU check runs with ``wandb.mode: disabled``, which never imports it. peft travels although the
machine has one: rlx pins 0.14.0 (LMDeploy's ceiling), and the check runs what the CPU tests ran.

    python scripts/gpu_bundle.py build .gpu-bundle           # the wheels, then the size check
    python scripts/gpu_bundle.py size .gpu-bundle            # missing or over 60 MiB: one line, exit 2
    python3.12 scripts/gpu_bundle.py check .gpu-bundle DIR   # the install test (see ``check``)

Ray (several workers) does not fit beside them: its wheel is 75 MiB. It travels in a device call of its
own, after the first one installed the bundle (`make gpu-bundle-ray`; scripts/gpu_check.sh): a Ray
without what a local instance never runs (``RAY_LEFT_OUT``: the Java workers' 31 MiB jar, the
dashboard's web pages, its libraries rllib, serve, tune, train, data and llm): 38 MiB with the
requirements the device lacks.

    python scripts/gpu_bundle.py build-ray .gpu-bundle-ray
    python3.12 scripts/gpu_bundle.py check-ray .gpu-bundle-ray DIR   # starts a Ray instance from DIR
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

LIMIT_MIB = 60
ROOT = Path(__file__).resolve().parents[1]
LMDEPLOY = re.search(r'"(lmdeploy==[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
LMDEPLOY_NEEDS = [
    "mmengine-lite",
    "pillow",
    "pybase64",
    "shortuuid",
    "xgrammar",
    "pyzmq",
    "requests",
    "prometheus-client",
]
RLX_NEEDS = [
    *("peft", "dvc", "math-verify", "pydantic", "ruamel.yaml", "ruamel.yaml.clib", "pyyaml", "xxhash"),
    "pygit2",  # a DVC dependency too (through scmrepo); rlx.lineage.experiment uses it itself
    "openai",  # the client agent programs are given (rlx.agents.programs); with jiter and distro, its own needs
]
DEEPSPEED_NEEDS = ["hjson", "msgpack", "ninja", "nvidia-ml-py", "einops"]
RAY = re.search(r'"(ray==[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
RAY_NEEDS = ["jsonschema", "protobuf"]  # Ray's requirements the device lacks (jsonschema's own follow)
RAY_LEFT_OUT = re.compile(r"ray/(jars|dashboard/client|rllib|serve|tune|train|data|llm)/.*")
TURBOMIND = re.compile(r"lmdeploy/turbomind/_turbomind[^/]*\.so")
LEFT_BEHIND = ["wandb"]  # the GPU check runs with wandb.mode: disabled, which never imports it
BUILT_HERE = ["deepspeed", "antlr4-python3-runtime"]  # published as source only: built into pure-Python wheels
DEVICE_HAS = {
    *"torch transformers triton safetensors accelerate pyarrow pandas typer rich pytest pytest-benchmark".split(),
    *"numpy packaging pyyaml regex tokenizers huggingface-hub hf-xet tqdm filelock fsspec typing-extensions".split(),
    *"jinja2 markupsafe networkx sympy mpmath setuptools psutil python-dateutil pytz tzdata six click".split(),
    *"shellingham markdown-it-py mdurl pygments iniconfig pluggy py-cpuinfo".split(),
    # in the device image too (KINDS.md's package list), so left behind: 12 MiB of headroom
    *"pillow requests urllib3 certifi idna charset-normalizer attrs aiohttp multidict yarl frozenlist".split(),
    *"aiosignal propcache aiohappyeyeballs anyio h11 httpcore pyparsing prometheus-client msgpack ninja".split(),
    *"einops nvidia-ml-py tabulate colorama httpx".split(),
}
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--only-binary=:all:"]
PLATFORM += [f"--platform={tag}" for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return normalized(path.name.split("-")[0])


def versions_here() -> Path:
    """This environment's versions as constraints, so the bundle runs what the CPU tests ran."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True)
    keep = [line for line in frozen.stdout.splitlines() if "==" in line and not line.startswith(("torch==", "rlx"))]
    path = Path(tempfile.mkstemp(suffix=".txt")[1])
    path.write_text("\n".join(keep) + "\n")
    return path


def slimmed(wheel: Path, left_out: re.Pattern) -> None:
    """Rewrite ``wheel`` without the files whose path ``left_out`` matches (and their RECORD lines)."""
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if left_out.fullmatch(item.filename):
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(True)
                data = "".join(line for line in lines if not left_out.fullmatch(line.split(",")[0])).encode()
            target.writestr(item, data)
    slim.replace(wheel)


def emptied(bundle: Path) -> Path:
    bundle.mkdir(parents=True, exist_ok=True)
    for old in bundle.glob("*.whl"):
        old.unlink()
    return bundle


def without_device_packages(bundle: Path) -> None:
    for wheel in bundle.glob("*.whl"):
        if wheel_name(wheel) in DEVICE_HAS or wheel_name(wheel).startswith(("nvidia-", "cuda-")):
            wheel.unlink()


def build(bundle: Path) -> None:
    """Download or build every wheel, drop what the device has, slim LMDeploy, check the size."""
    emptied(bundle)
    constraints = versions_here()
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(bundle), "-c", str(constraints), *BUILT_HERE)
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(bundle), str(ROOT))
    pip("download", "--quiet", "--no-deps", "-d", str(bundle), *PLATFORM, LMDEPLOY)
    needs = [*LMDEPLOY_NEEDS, *RLX_NEEDS, *DEEPSPEED_NEEDS]
    pip(
        "download", "--quiet", "-d", str(bundle), "--find-links", str(bundle), "-c", str(constraints), *PLATFORM, *needs
    )
    without_device_packages(bundle)
    slimmed(next(bundle.glob("lmdeploy-*.whl")), TURBOMIND)


def build_ray(bundle: Path) -> None:
    """Ray without ``RAY_LEFT_OUT``, and the requirements of it the device lacks."""
    emptied(bundle)
    pip("download", "--quiet", "--no-deps", "-d", str(bundle), *PLATFORM, RAY)
    pip("download", "--quiet", "-d", str(bundle), "-c", str(versions_here()), *PLATFORM, *RAY_NEEDS)
    without_device_packages(bundle)
    slimmed(next(bundle.glob("ray-*.whl")), RAY_LEFT_OUT)


def size_problem(bundle: Path) -> str | None:
    """One line when the bundle is missing or over the limit, else None."""
    wheels = sorted(bundle.glob("*.whl"))
    if not wheels:
        return f"{bundle}: no device bundle here; run `make gpu-bundle` first"
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    if mib > LIMIT_MIB:
        return f"{bundle}: {mib:.1f} MiB of wheels, over the {LIMIT_MIB} MiB a device call carries; rebuild it"
    print(f"{bundle}: {len(wheels)} wheels, {mib:.1f} MiB")
    return None


def report(problem: str) -> int:
    print(f"error: {problem}", file=sys.stderr)
    return 2


# What the install test imports from the target folder, in a Python 3.12 that also has the device's
# pure-Python and small packages (``DEVICE_LIKE``, at the device's transformers version). The heavy
# ones (torch, triton, and what imports them at once) cannot run here: a module that stops at one of
# them (``STOPS_AT_DEVICE``) has imported everything before it.
IMPORTS = ["rlx", "rlx.config", "rlx.judgers", "rlx.stages.prepare", "dvc", "dvc.repo", "dvc.api", "math_verify",
           "pydantic", "lmdeploy", "lmdeploy.serve.openai.protocol", "deepspeed"]  # fmt: skip
DEVICE_LIKE = ["transformers==5.17.0", "typer", "rich", "sympy", "jinja2", "networkx", "fsspec", "filelock",
               "psutil", "typing-extensions", "packaging", "pyyaml", "tqdm", "numpy", "python-dateutil",
               "safetensors", "pillow", "requests", "urllib3", "certifi", "idna", "charset-normalizer", "attrs",
               "aiohttp", "multidict", "yarl", "frozenlist", "aiosignal", "propcache", "aiohappyeyeballs", "anyio",
               "h11", "httpcore", "pyparsing", "prometheus-client", "msgpack", "einops", "nvidia-ml-py", "tabulate",
               "colorama", "sniffio"]  # fmt: skip
STOPS_AT_DEVICE = re.compile(r"No module named '(torch|triton|accelerate|peft|pyarrow|pandas)'")


# Beyond torch, the modules a GPU run loads are checked by reading them: every module they import at
# load time (not inside a function, nor guarded by ``except ImportError``), followed through the package,
# must be installed or the device's. Import names of ``DEVICE_HAS``, where they differ from its names:
DEVICE_MODULES = {
    *(normalized(n).replace("-", "_") for n in DEVICE_HAS),
    "yaml",
    "dateutil",
    "pkg_resources",
    "cpuinfo",
    "PIL",
    "pynvml",
}
LOADED = {
    "lmdeploy": ["lmdeploy", "lmdeploy.serve.openai.protocol", "lmdeploy.pytorch.engine.engine",
                 "lmdeploy.pytorch.engine.executor.uni_executor", "lmdeploy.pytorch.engine.model_agent.agent",
                 "lmdeploy.pytorch.models.qwen2", "lmdeploy.pytorch.models.qwen3", "lmdeploy.pytorch.backends.cuda"],
    "deepspeed": ["deepspeed", "deepspeed.runtime.checkpoint_engine", "deepspeed.runtime.fp16.loss_scaler",
                  "deepspeed.runtime.zero.config", "deepspeed.utils.tensor_fragment",
                  "deepspeed.runtime.zero.stage_1_and_2"],
}  # fmt: skip


def source_of(folders: list[Path], dotted: str) -> Path | None:
    for folder in folders:
        base = folder.joinpath(*dotted.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    return None


def load_time_imports(path: Path, dotted: str) -> list[str]:
    """Modules ``path`` imports when it loads (``TYPE_CHECKING`` blocks and ``try`` blocks that catch the
    import's failure left out: those imports are optional)."""
    package = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
    found: list[str] = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                if not any(h.type is None or re.search(r"Error|Exception", ast.unparse(h.type)) for h in node.handlers):
                    visit(node.body)
            elif isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package if node.level else ""
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                module = ".".join(filter(None, [base, node.module]))
                found.extend([module, *(f"{module}.{alias.name}" for alias in node.names)])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def unmet_imports(folders: list[Path], package: str, entries: list[str]) -> dict[str, str]:
    """Top-level modules reached from ``entries`` that neither ``folders`` nor the device provide,
    each with the module that imports it."""
    seen, unmet, todo = set(), {}, [(entry, entry) for entry in entries]
    while todo:
        dotted, importer = todo.pop()
        top = dotted.split(".")[0]
        if dotted in seen or top in sys.stdlib_module_names or top in DEVICE_MODULES:
            continue
        seen.add(dotted)
        if top != package:
            if not any((f / top).exists() or any(f.glob(f"{top}.*")) for f in folders):
                unmet.setdefault(top, importer)
            continue
        parents = [(".".join(dotted.split(".")[:i]), dotted) for i in range(1, dotted.count(".") + 1)]
        path = source_of(folders, dotted)
        todo += parents + ([(name, dotted) for name in load_time_imports(path, dotted)] if path else [])
    return unmet


def device_like(folder: Path) -> Path:
    """The device's packages that can be installed here, in their own folder (downloaded afresh: a kept
    folder gathers each package's versions as the index moves, and pip refuses two of one package)."""
    wheels = folder.with_name(folder.name + "-wheels")
    shutil.rmtree(wheels, ignore_errors=True)
    pip("download", "--quiet", "-d", str(wheels), *PLATFORM, *DEVICE_LIKE)
    pip("install", "--quiet", "--no-index", "--no-deps", "--target", str(folder), *map(str, wheels.glob("*.whl")))
    return folder


def check(bundle: Path, target: Path) -> int:
    """Install every wheel with --no-index --no-deps into ``target``, then import each of ``IMPORTS``
    from it in a fresh interpreter; print one line per module: imported, or where it stopped."""
    problem = size_problem(bundle)
    if problem:
        return report(problem)
    path = installed(bundle, target)
    failures = 0
    for package, entries in LOADED.items():
        unmet = unmet_imports([target, Path(path.split(os.pathsep)[1])], package, entries)
        failures += len(unmet)
        for name, importer in sorted(unmet.items()):
            print(f"FAILED       {package}: {importer} imports {name}, which neither the bundle nor the device has")
        if not unmet:
            print(f"read         {package}: every module its loaded modules import is in the bundle or the device's")
    for module in IMPORTS:
        env = {**os.environ, "PYTHONPATH": path, "PYTHONNOUSERSITE": "1"}
        run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env)
        last = (run.stderr.strip().splitlines() or [""])[-1]
        if run.returncode == 0:
            print(f"imported     {module}")
        elif STOPS_AT_DEVICE.search(last):
            print(f"device's     {module}: stops at {STOPS_AT_DEVICE.search(last).group(1)}, which the device has")
        else:
            failures += 1
            print(f"FAILED       {module}: {last}")
    return 1 if failures else 0


def installed(bundle: Path, target: Path) -> str:
    """Every wheel of ``bundle`` installed into ``target`` with --no-index --no-deps; the PYTHONPATH of it
    and of the device's packages that can be installed here."""
    pip("install", "--quiet", "--no-index", "--no-deps", "--target", str(target), *map(str, bundle.glob("*.whl")))
    return os.pathsep.join([str(target), str(device_like(target.with_name(target.name + "-device")))])


# What the workers ask of Ray: a local instance, an actor, a call in its background concurrency group.
RAY_STARTS = """
import ray
ray.init(num_cpus=1, include_dashboard=False)
actor = ray.remote(concurrency_groups={"background": 1})(type("Echo", (), {"echo": lambda self, x: x})).remote()
assert ray.get(actor.echo.options(concurrency_group="background").remote(7)) == 7
ray.shutdown()
"""


def check_ray(bundle: Path, target: Path) -> int:
    """Install the Ray bundle into ``target``, then start a Ray instance from it as rlx's workers use one."""
    problem = size_problem(bundle)
    if problem:
        return report(problem)
    env = {**os.environ, "PYTHONPATH": installed(bundle, target), "PYTHONNOUSERSITE": "1"}
    run = subprocess.run([sys.executable, "-c", RAY_STARTS], capture_output=True, text=True, env=env, timeout=300)
    if run.returncode:
        print(f"FAILED       ray: {(run.stderr.strip().splitlines() or [''])[-1]}")
        return 1
    print("started      ray: a local instance, an actor, a call in its background concurrency group")
    return 0


def sized(bundle: Path) -> int:
    problem = size_problem(bundle)
    return report(problem) if problem else 0


if __name__ == "__main__":
    command, bundle, *rest = sys.argv[1:]
    if command in ("build", "build-ray"):
        (build if command == "build" else build_ray)(Path(bundle))
    checks = {"check": check, "check-ray": check_ray}
    sys.exit(checks[command](Path(bundle), Path(rest[0])) if command in checks else sized(Path(bundle)))
