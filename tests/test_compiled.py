"""The compiled hot modules (simserve/compiled.py, setup.py): SIMSERVE_PURE_PYTHON runs the
source where compiled modules are installed, a compiled module older than its source is not
run silently, and a built wheel gives the same results, bit for bit, as the source."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES, PathFinder
from pathlib import Path

import pytest

from simserve import compiled
from tests.traces import find_trace, needs_trace

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = EXTENSION_SUFFIXES[0]


def _package(tmp_path: Path, name: str = "hotpkg") -> Path:
    """A checkout-like folder: setup.py beside a package whose module `hot` has a source and
    an 'extension module' beside it (not a real one: loading it fails)."""
    (tmp_path / "setup.py").write_text("")
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hot.py").write_text("WHERE = 'source'\n")
    (pkg / f"hot{SUFFIX}").write_bytes(b"not an ELF file")
    return pkg


def _age(path: Path, seconds: float) -> None:
    st = path.stat()
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def test_listed_modules_exist_and_keep_to_64_bits():
    for m in compiled.MODULES:
        assert compiled.source_path(m).is_file(), m
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)
    # its block hashes are mixed as unsigned 64-bit Python ints, which inferred C integers
    # would overflow (docs/architecture.md, "Compiled hot modules")
    assert "simserve.sim.prefix_cache" not in compiled.MODULES


def test_source_only_hook_skips_extension_modules_in_its_folders_only(tmp_path):
    pkg = _package(tmp_path)
    # the import system's own choice: the extension module beside the .py
    assert PathFinder.find_spec("hot", [str(pkg)]).origin.endswith(SUFFIX)
    hook = compiled.source_only_hook((str(pkg.resolve()),))
    assert hook(str(pkg)).find_spec("hot").origin == str(pkg / "hot.py")
    with pytest.raises(ImportError):
        hook(str(tmp_path))  # above the package: left to the next hook


_IMPORT_HOT = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from simserve import compiled
if sys.argv[2] == "pure":
    compiled.run_from_source(Path(sys.argv[1]) / "hotpkg")
elif sys.argv[2] == "install":
    compiled.install(Path(sys.argv[1]) / "hotpkg", ["hotpkg.hot"])
import hotpkg.hot
print(hotpkg.hot.WHERE)
"""


def _import_hot(tmp_path: Path, how: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SIMSERVE_PURE_PYTHON"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", _IMPORT_HOT, str(tmp_path), how], env=env,
                          capture_output=True, text=True, cwd=tmp_path)


def test_run_from_source_imports_the_py_where_an_extension_module_is_installed(tmp_path):
    _package(tmp_path)
    plain = _import_hot(tmp_path, "plain")  # the broken 'extension module' is what loads
    assert plain.returncode != 0 and "ImportError" in plain.stderr
    pure = _import_hot(tmp_path, "pure")
    assert pure.returncode == 0 and pure.stdout.strip() == "source", pure.stderr


def test_a_compiled_module_older_than_its_source_warns_and_runs_from_source(tmp_path):
    pkg = _package(tmp_path)
    so = pkg / f"hot{SUFFIX}"
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == []  # compiled after its source
    _age(so, 60)
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == ["hotpkg.hot"]
    out = _import_hot(tmp_path, "install")
    assert out.returncode == 0 and out.stdout.strip() == "source", out.stderr
    assert out.stderr.count("hotpkg.hot changed since it was compiled") == 1
    # a .pxd edited after the compile makes it stale too
    _age(so, -120)
    (pkg / "hot.pxd").write_text("cdef long X\n")
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == []
    _age(so, 60)
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == ["hotpkg.hot"]
    # outside a checkout (an installed wheel: no setup.py beside the package) no check
    (tmp_path / "setup.py").unlink()
    assert _import_hot(tmp_path, "install").returncode != 0


def test_a_stale_compiled_module_no_longer_listed_is_found_too(tmp_path):
    """An extension module left from a build when its module was listed (a module taken out
    of MODULES since) is still what Python imports: older than its source, it is stale."""
    pkg = _package(tmp_path)
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "old.py").write_text("X = 1\n")
    (pkg / "sub" / f"old{SUFFIX}").write_bytes(b"not an ELF file")
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == []
    _age(pkg / "sub" / f"old{SUFFIX}", 60)
    _age(pkg / f"hot{SUFFIX}", 60)
    assert compiled.stale_modules(pkg, ["hotpkg.hot"]) == ["hotpkg.hot", "hotpkg.sub.old"]


def test_version_says_pure_python_when_nothing_is_compiled():
    env = {**os.environ, "SIMSERVE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-m", "simserve", "--version"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0
    assert out.stdout.strip().endswith(f"(pure Python; compiled modules: 0/"
                                       f"{len(compiled.MODULES)})")


# every policy family's compiled engine, a few hundred requests each (benchmarks/bench_loop.py)
_DIGEST = r"""
import hashlib, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import bench_loop as B
if sys.argv[2] == "installed":  # the installed simserve, not the checkout bench_loop adds
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != B.ROOT]
import simserve
from simserve import compiled
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.run import simulate_point
from simserve.runner.config import parse_experiment
from simserve.runner.point import make_workload
for label in sys.argv[3:]:
    policy, s, params = B.CASES[label]
    cfg = parse_experiment({"model": s["model"], "hardware": s["hardware"],
        "workload": {"trace": s["trace"], "num_requests": 300, "arrival": "poisson",
                     "rates": [s["rate"]], "seed": 0}, "policies": [{"name": policy, **params}]})
    r = simulate_point(make_workload(cfg, s["rate"], 0), s["model"],
                       resolve_hardware(HardwareConfig(**s["hardware"])), policy,
                       cfg.policies[0].config)
    h = hashlib.sha256()
    for a in (r.records.token_times_s, r.records.num_preemptions, r.records.first_token_s,
              r.records.finish_s):
        h.update(a.tobytes())
    print(label, h.hexdigest(), r.stats["num_iterations"])
print(Path(simserve.__file__).resolve().parent)
print(compiled.summary())
"""
_CASES = ["vllm-h100", "sarathi-h100", "neo-fig9a", "dualpace-fig9a", "chunked-fig12",
          "muxwise-fig12", "distserve-fig12", "loongserve-fig12", "conflux-fig12"]
WHEEL_PYTHON = os.environ.get("SIMSERVE_WHEEL_PYTHON")


def _env(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SIMSERVE_PURE_PYTHON",
                                                             "PYTHONPATH")}
    trace = find_trace("azure-conv")  # the installed package looks only where it is told
    env.setdefault("SIMSERVE_TRACE_DIR", str(trace.parent) if trace else "")
    if pure:
        env.update(SIMSERVE_PURE_PYTHON="1", PYTHONPATH=str(ROOT))
    return env


@pytest.mark.skipif(not WHEEL_PYTHON, reason="no built wheel to compare: SIMSERVE_WHEEL_PYTHON "
                    "names the python of a venv where the wheel is installed (.ci/run sets it)")
@needs_trace("azure-conv")  # bench_loop's vLLM and DualPace cases replay it
def test_the_built_wheel_gives_the_sources_results(tmp_path):
    def run(python: str, pure: bool, mode: str) -> list[str]:
        out = subprocess.run([python, "-c", _DIGEST, str(ROOT / "benchmarks"), mode, *_CASES],
                             env=_env(pure), cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, f"digest run ({python}) failed:\n{out.stderr[-3000:]}"
        return out.stdout.splitlines()
    wheel, source = run(WHEEL_PYTHON, False, "installed"), run(sys.executable, True, "checkout")
    n = len(compiled.MODULES)
    assert wheel[-1] == f"compiled modules: {n}/{n}" and ROOT not in Path(wheel[-2]).parents
    assert source[-1] == f"pure Python; compiled modules: 0/{n}"
    assert Path(source[-2]) == ROOT / "simserve"
    assert wheel[:-2] == source[:-2] and len(wheel) == len(_CASES) + 2


@pytest.mark.skipif(not WHEEL_PYTHON, reason="no built wheel: SIMSERVE_WHEEL_PYTHON is not set")
def test_the_built_wheel_runs_from_source_when_asked_and_checks_a_policy(tmp_path):
    code = ("import simserve.sim.leap as m; from simserve import compiled; "
            "print(m.__file__); print(compiled.summary())")
    out = subprocess.run([WHEEL_PYTHON, "-c", code], env=_env(False) | {
        "SIMSERVE_PURE_PYTHON": "1"}, cwd=tmp_path, capture_output=True, text=True, check=True)
    file, summary = out.stdout.splitlines()
    assert file.endswith("leap.py") and summary.startswith("pure Python; compiled modules: 0/")
    # check-policy's compiled-vs-source arm, on the installed compiled modules
    out = subprocess.run([WHEEL_PYTHON, "-m", "simserve", "check-policy", "vllm", "-n", "100"],
                         env=_env(False), cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and "compiled = source" in out.stdout, out.stdout + out.stderr
