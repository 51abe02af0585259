"""Cython-compiled copies of simserve's hot modules, and the rule for when they are used.

The simulator's inner loops (engines, leaping, pricing, the request table, the KV pool) are
plain Python. Installing the package (`pip install .` or `pip install -e .`) also compiles the
modules in `MODULES` with Cython (`setup.py`) into `simserve/_compiled/`: unchanged, except
that a module's `.pxd`, where it has one, gives a few of its loops C types (docs/
architecture.md, "Compiled hot modules"). Their results are the same floats, bit for bit
(`tests/test_compiled.py` runs policies both ways): the same operations in the same order, no
fused multiply-add (`-ffp-contract=off`), numpy still does the array work. A compiled module
only runs the loop faster (the README's Speed section compares the two).

The `.py` file stays the source of truth. `install_finder` (called by `import simserve`) puts
a finder first on `sys.meta_path` that loads a module's compiled copy only while the
source's sha256 (its .py and .pxd) equals the one recorded when it was built
(`_compiled/manifest.json`); an edited module runs from its source, with one warning per
process naming the first such module (rebuild: `pip install -e .`). Nothing compiled (no compiler, `SIMSERVE_NO_COMPILE=1` at
install) means pure Python everywhere; `SIMSERVE_PURE_PYTHON=1` makes a process ignore
the compiled copies. `simserve --version` says how many modules run compiled; `status`
lists each.

A module joins `MODULES` when a profile shows its own time in a loop; it must not depend on
Python integers wider than 64 bits (Cython's inferred C integers raise OverflowError past
that, `DIRECTIVES`), nor on its functions being Python function objects (compiled, they
have no `__code__` and no `inspect.signature`).
This module imports only the standard library: `setup.py` reads it before simserve's
dependencies are installed.
"""
from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
from pathlib import Path

MODULES = (
    # the event core's shared pieces
    "simserve.sim.clock", "simserve.sim.context", "simserve.sim.cluster",
    "simserve.sim.frontend", "simserve.sim.kv", "simserve.sim.leap", "simserve.sim.requests",
    # pricing
    "simserve.cost.gpu", "simserve.cost.host", "simserve.cost.smshare", "simserve.cost.sp",
    "simserve.hardware.attention", "simserve.hardware.functions",
    # the engines that run faster compiled: vLLM's family (vllm, sarathi, chunked),
    # ConfluxServe, MuxWise and DualPace (1.08x since its pricing and request-table loops
    # are typed; it ran 5-10 % slower in the first build). NEO, LoongServe and DistServe ran
    # 5-10 % faster (benchmarks/results/loop-compiled-20261202.txt): left out, for build time.
    "simserve.policies.queues", "simserve.policies.sarathi", "simserve.policies.sp_leap",
    "simserve.policies.sp_ranks", "simserve.policies.vllm", "simserve.policies.vllm_engine",
    "simserve.policies.vllm_intake", "simserve.policies.vllm_kv", "simserve.policies.vllm_leap",
    "simserve.policies.vllm_leaper", "simserve.policies.vllm_scheduler",
    "simserve.policies.conflux.dispatch", "simserve.policies.conflux.engine",
    "simserve.policies.conflux.leap", "simserve.policies.conflux.plan",
    "simserve.policies.muxwise.engine", "simserve.cost.mux_share",
    "simserve.policies.dualpace.assist", "simserve.policies.dualpace.copies",
    "simserve.policies.dualpace.cpu_engine", "simserve.policies.dualpace.gpu_engine",
    "simserve.policies.dualpace.gpu_leap", "simserve.policies.dualpace.gpu_schedule",
    "simserve.policies.dualpace.gpu_worker", "simserve.policies.dualpace.state",
)

# Cython's compiler directives. Type annotations are documentation here, not C types
# (annotation_typing off: a numpy integer or None may go where `int` is written). Locals are
# typed where Cython can infer it (infer_types), and inferred C integers are checked for
# overflow, so a value past 64 bits raises instead of wrapping. No bound methods of Python
# function type (binding off): calls are cheaper.
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "infer_types": True,
              "overflowcheck": True, "binding": False}

PACKAGE = Path(__file__).resolve().parent
OUT_DIR = "_compiled"              # beside the package's modules: simserve/_compiled/...
MANIFEST = "manifest.json"         # module -> source sha256 and compiled file, at build time


def source_path(module: str, package: Path = PACKAGE) -> Path:
    """The .py file of `module` ("simserve.sim.leap" -> <package>/sim/leap.py)."""
    return package.joinpath(*module.split(".")[1:]).with_suffix(".py")


def compiled_relpath(module: str, suffix: str) -> str:
    """Where the compiled copy lies under `<package>/_compiled/` (posix path)."""
    parts = module.split(".")[1:]
    return "/".join([*parts[:-1], parts[-1] + suffix])


def source_sha256(path: Path) -> str:
    """The sha256 of a module's source: its .py, and its .pxd when it has one (the C types
    its compiled copy declares; the wheel ships it, so an installed module hashes the same)."""
    import hashlib  # (imported on first use: `import simserve` stays fast)
    h = hashlib.sha256(path.read_bytes())
    pxd = path.with_suffix(".pxd")
    if pxd.is_file():
        h.update(pxd.read_bytes())
    return h.hexdigest()


class CompiledFinder:
    """Finds the compiled copy of a module in `modules` when it is fresh (see the module's
    docstring); otherwise defers to the normal import of the source."""

    def __init__(self, package: Path = PACKAGE, modules=MODULES):
        self.package = package
        self.modules = frozenset(modules)
        self._manifest: dict | None = None
        self._warned = False

    def manifest(self) -> dict:
        if self._manifest is None:
            import json
            try:
                m = json.loads((self.package / OUT_DIR / MANIFEST).read_text())
                self._manifest = m.get("modules", {}) if isinstance(m, dict) else {}
            except (OSError, ValueError):
                self._manifest = {}
        return self._manifest

    def state(self, module: str) -> str:
        """'compiled', 'stale' (the source changed since the build), 'absent' (not built,
        or built for another Python) or 'disabled' (SIMSERVE_PURE_PYTHON)."""
        if os.environ.get("SIMSERVE_PURE_PYTHON"):
            return "disabled"
        entry = self.manifest().get(module)
        if entry is None or not any(entry["file"].endswith(s) for s in EXTENSION_SUFFIXES) \
                or not (self.package / OUT_DIR / entry["file"]).is_file():
            return "absent"
        try:
            fresh = source_sha256(source_path(module, self.package)) == entry["sha256"]
        except OSError:
            return "absent"
        return "compiled" if fresh else "stale"

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules:
            return None
        state = self.state(fullname)
        if state == "stale" and not self._warned:
            self._warned = True
            print(f"simserve: {fullname} changed since it was compiled; running it (and "
                      "any other changed module) from source; rebuild with `pip install -e .`",
                      file=sys.stderr)
        if state != "compiled":
            return None
        origin = str(self.package / OUT_DIR / self.manifest()[fullname]["file"])
        return ModuleSpec(fullname, ExtensionFileLoader(fullname, origin), origin=origin)


_FINDER: CompiledFinder | None = None


def install_finder() -> None:
    """Put the finder first on sys.meta_path (once per process)."""
    global _FINDER
    if _FINDER is None:
        _FINDER = CompiledFinder()
        sys.meta_path.insert(0, _FINDER)


def status() -> dict[str, str]:
    """Each module of `MODULES` and how it runs in this process: 'compiled', 'stale',
    'absent', 'disabled' (see `CompiledFinder.state`) or 'source' (imported from source
    before the finder was installed)."""
    finder = _FINDER or CompiledFinder()
    out = {}
    for m in MODULES:
        mod = sys.modules.get(m)
        if mod is not None and not str(getattr(mod, "__file__", "")).endswith(".py"):
            out[m] = "compiled"
        else:
            st = finder.state(m)
            out[m] = "source" if mod is not None and st == "compiled" else st
    return out


def summary() -> str:
    """One line: how many of the hot modules run compiled."""
    s = status()
    n = sum(v == "compiled" for v in s.values())
    other = sorted({v for v in s.values() if v != "compiled"})
    line = f"compiled modules: {n}/{len(s)}" + (f" (others {', '.join(other)})" if other else "")
    if n == 0:
        failed = build_failure()
        line = "pure Python; " + line + (f"; not compiled at install: {failed}" if failed
                                         else "")
    return line


BUILD_FAILED = "BUILD_FAILED"  # written into OUT_DIR by setup.py when compiling fails


def build_failure(package_dir: Path | None = None) -> str | None:
    """Why the install's compile failed, as setup.py recorded it, or None."""
    path = (package_dir or Path(__file__).resolve().parent) / OUT_DIR / BUILD_FAILED
    try:
        return path.read_text().strip() or "no reason recorded"
    except OSError:
        return None
