"""The compiled copies of the hot modules (simserve/compiled.py, setup.py): loaded only while
their source is unchanged, and giving the same results, bit for bit, as the source."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from pathlib import Path

import pytest

from simserve import compiled
from simserve.compiled import CompiledFinder
from tests.traces import needs_trace

ROOT = Path(__file__).resolve().parent.parent
MOD = "simserve.pkg.hot"


def _package(tmp_path: Path, built: bool = True, pxd: str | None = None) -> Path:
    """A package folder with one module (and its .pxd, if given) and, if `built`, its
    'compiled copy' (a placeholder file: the finder only locates it) in the manifest as
    setup.py writes it."""
    pkg = tmp_path / "simserve"
    (pkg / "pkg").mkdir(parents=True)
    src = pkg / "pkg" / "hot.py"
    src.write_text("X = 1\n")
    if pxd is not None:
        src.with_suffix(".pxd").write_text(pxd)
    if built:
        rel = compiled.compiled_relpath(MOD, EXTENSION_SUFFIXES[0])
        out = pkg / compiled.OUT_DIR / rel
        out.parent.mkdir(parents=True)
        out.write_bytes(b"")
        (pkg / compiled.OUT_DIR / compiled.MANIFEST).write_text(json.dumps(
            {"modules": {MOD: {"sha256": compiled.source_sha256(src), "file": rel}}}))
    return pkg


def test_finder_takes_a_fresh_copy_and_leaves_a_stale_one(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SIMSERVE_PURE_PYTHON", raising=False)
    pkg = _package(tmp_path)
    f = CompiledFinder(pkg, [MOD])
    spec = f.find_spec(MOD)
    assert f.state(MOD) == "compiled"
    assert isinstance(spec.loader, ExtensionFileLoader) and spec.name == MOD
    assert Path(spec.origin).parent == pkg / compiled.OUT_DIR / "pkg"
    assert f.find_spec("simserve.pkg.other") is None  # not a listed module
    monkeypatch.setenv("SIMSERVE_PURE_PYTHON", "1")
    assert f.state(MOD) == "disabled" and f.find_spec(MOD) is None
    monkeypatch.delenv("SIMSERVE_PURE_PYTHON")
    (pkg / "pkg" / "hot.py").write_text("X = 2\n")  # edited since the build
    assert f.state(MOD) == "stale" and f.find_spec(MOD) is None and f.find_spec(MOD) is None
    err = capsys.readouterr().err
    assert err.count("changed since it was compiled") == 1 and MOD in err


def test_a_changed_pxd_makes_the_copy_stale(tmp_path, monkeypatch):
    """The C types a module's .pxd declares are part of its compiled copy's source."""
    monkeypatch.delenv("SIMSERVE_PURE_PYTHON", raising=False)
    pkg = _package(tmp_path)
    (pkg / "pkg" / "hot.pxd").write_text("cdef long X\n")  # added after the build
    assert CompiledFinder(pkg, [MOD]).state(MOD) == "stale"
    pkg = _package(tmp_path / "b", pxd="cdef long X\n")
    assert CompiledFinder(pkg, [MOD]).state(MOD) == "compiled"
    (pkg / "pkg" / "hot.pxd").write_text("cdef double X\n")
    assert CompiledFinder(pkg, [MOD]).state(MOD) == "stale"


def test_finder_without_a_build(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMSERVE_PURE_PYTHON", raising=False)
    pkg = _package(tmp_path, built=False)
    f = CompiledFinder(pkg, [MOD])
    assert f.state(MOD) == "absent" and f.find_spec(MOD) is None
    pkg = _package(tmp_path / "b")
    next((pkg / compiled.OUT_DIR).rglob("hot*")).unlink()  # listed, file gone
    assert CompiledFinder(pkg, [MOD]).state(MOD) == "absent"


def test_listed_modules_exist_and_keep_to_64_bits():
    for m in compiled.MODULES:
        assert compiled.source_path(m).is_file(), m
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)
    # its block hashes are mixed as unsigned 64-bit Python ints, which inferred C integers
    # would overflow (docs/architecture.md, "Compiled hot modules")
    assert "simserve.sim.prefix_cache" not in compiled.MODULES


# every policy family's compiled engine, a few hundred requests each (benchmarks/bench_loop.py)
_DIGEST = r"""
import hashlib, sys
sys.path.insert(0, sys.argv[1])
import bench_loop as B
from simserve import compiled
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.run import simulate_point
from simserve.runner.config import parse_experiment
from simserve.runner.point import make_workload
for label in sys.argv[2:]:
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
print(compiled.summary())
"""
_CASES = ["vllm-h100", "sarathi-h100", "neo-fig9a", "dualpace-fig9a", "chunked-fig12",
          "muxwise-fig12", "distserve-fig12", "loongserve-fig12", "conflux-fig12"]


@pytest.mark.skipif(not any(v == "compiled" for v in compiled.status().values()),
                    reason="the hot modules are not compiled in this install")
@needs_trace("azure-conv")  # bench_loop's vLLM and DualPace cases replay it
def test_compiled_results_equal_the_source():
    def run(pure: bool) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "SIMSERVE_PURE_PYTHON"}
        if pure:
            env["SIMSERVE_PURE_PYTHON"] = "1"
        out = subprocess.run([sys.executable, "-c", _DIGEST, str(ROOT / "benchmarks"), *_CASES],
                             env=env, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, f"digest run (pure={pure}) failed:\n{out.stderr[-3000:]}"
        return out.stdout.splitlines()
    fast, pure = run(False), run(True)
    assert fast[-1].startswith("compiled modules: ") and not fast[-1].startswith(
        "compiled modules: 0/")
    assert pure[-1].startswith("pure Python; compiled modules: 0/")
    assert fast[:-1] == pure[:-1] and len(fast) == len(_CASES) + 1


def test_version_says_pure_python_and_why_when_nothing_is_compiled(tmp_path):
    """A failed compile at install is recorded by setup.py (simserve/_compiled/BUILD_FAILED);
    with no module compiled the one-line summary says "pure Python" and why. (A fresh
    process: this one may have imported compiled modules already.)"""
    env = {**os.environ, "SIMSERVE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-m", "simserve", "--version"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "(pure Python; compiled modules: 0/" in out.stdout
    (tmp_path / compiled.OUT_DIR).mkdir()
    assert compiled.build_failure(tmp_path) is None
    (tmp_path / compiled.OUT_DIR / compiled.BUILD_FAILED).write_text("no C compiler\n")
    assert compiled.build_failure(tmp_path) == "no C compiler"
