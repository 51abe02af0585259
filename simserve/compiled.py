"""simserve's hot modules, compiled with Cython where the install compiled them.

The simulator's inner loops (engines, leaping, pricing, the request table, the KV pool) are
plain Python. A wheel, and `pip install .`, also compile the modules in `MODULES` with Cython
(`setup.py`): each `.py` as it is, with the C types of the `.pxd` beside it where it has one
(docs/architecture.md, "Compiled hot modules"), into an extension module beside the `.py`,
which Python's import system then prefers. The results are the same floats, bit for bit: the
same operations in the same order, no fused multiply-add (`-ffp-contract=off`), numpy still
does the array work (`tests/test_compiled.py` compares a built wheel with the source). An
editable install (`pip install -e .`) runs pure Python unless compiled on request
(`SIMSERVE_COMPILE=1 pip install -e .`).

`install` (called by `import simserve`, before any other simserve module is imported):
- `SIMSERVE_PURE_PYTHON=1` runs the process from the `.py` files even where compiled modules
  are installed: a path hook gives simserve's own package folders a standard `FileFinder`
  that knows source and bytecode but no extension modules;
- in a checkout (a `setup.py` beside the package), a compiled module older than its `.py` or
  `.pxd` (edited since it was compiled) would silently run the old code: the process then
  runs from source, with one warning naming the module.
`simserve --version` says how many hot modules run compiled (`summary`).

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
from importlib.machinery import (BYTECODE_SUFFIXES, EXTENSION_SUFFIXES, SOURCE_SUFFIXES,
                                 FileFinder, SourceFileLoader, SourcelessFileLoader)
from pathlib import Path

MODULES = (
    # the event core's shared pieces
    "simserve.sim.clock", "simserve.sim.context", "simserve.sim.cluster",
    "simserve.sim.frontend", "simserve.sim.kv", "simserve.sim.leap", "simserve.sim.requests",
    # pricing
    "simserve.cost.gpu", "simserve.cost.host", "simserve.cost.smshare", "simserve.cost.sp",
    "simserve.hardware.attention", "simserve.hardware.functions",
    # the engines that run faster compiled: vLLM's family (vllm, sarathi, chunked),
    # ConfluxServe, MuxWise and DualPace (benchmarks/results/loop-compiled-20261202.txt:
    # NEO, LoongServe and DistServe ran 5-10 % faster compiled, left out for build time;
    # vllm_loop, vLLM's async engine-core loop, ran slower compiled:
    # benchmarks/results/vllm-loop-compiled-20261205.txt)
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
_from_source: set[str] = set()  # the package folders run_from_source was called for


def source_path(module: str, package: Path = PACKAGE) -> Path:
    """The .py file of `module` ("simserve.sim.leap" -> <package>/sim/leap.py)."""
    return package.joinpath(*module.split(".")[1:]).with_suffix(".py")


def compiled_path(module: str, package: Path = PACKAGE) -> Path | None:
    """The extension module that the import system would load for `module` instead of its
    .py (the first of this Python's extension suffixes found beside it), or None."""
    src = source_path(module, package)
    stem = src.with_suffix("")
    for suffix in EXTENSION_SUFFIXES:
        path = stem.parent / (stem.name + suffix)
        if path.is_file():
            return path
    return None


def stale_modules(package: Path = PACKAGE, modules=MODULES) -> list[str]:
    """The modules whose compiled file is older than their .py or .pxd: every extension module
    beside a .py in the package's folders, listed in `modules` or not (one left from a build
    when it was listed would still be imported). `modules` first, in their order; one
    directory listing per folder (`import simserve` runs it in a checkout)."""
    out = []
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        rel = os.path.relpath(folder, package)
        prefix = ".".join([package.name] + ([] if rel == "." else rel.split(os.sep)))
        for name in names:
            suffix = next((s for s in EXTENSION_SUFFIXES if name.endswith(s)), None)
            if suffix is None:
                continue
            src = os.path.join(folder, name[:-len(suffix)])
            newest = max((os.stat(p).st_mtime for p in (src + ".py", src + ".pxd")
                          if os.path.isfile(p)), default=0.0)
            if os.stat(os.path.join(folder, name)).st_mtime < newest:
                out.append(f"{prefix}.{name[:-len(suffix)]}")
    order = {m: i for i, m in enumerate(modules)}
    return sorted(out, key=lambda m: (order.get(m, len(order)), m))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def source_only_hook(roots: tuple[str, ...]):
    """A `sys.path_hooks` entry: for a folder under one of `roots`, a FileFinder that loads
    .py and .pyc files but no extension modules; any other folder is left to the next hook."""
    def hook(path: str):
        if not any(_under(os.path.realpath(path or "."), r) for r in roots):
            raise ImportError("not a simserve package folder")
        return FileFinder(path, (SourceFileLoader, SOURCE_SUFFIXES),
                          (SourcelessFileLoader, BYTECODE_SUFFIXES))
    return hook


def run_from_source(package: Path = PACKAGE) -> None:
    """From now on, this process imports the modules under `package` from their .py files."""
    root = os.path.realpath(package)
    if root in _from_source:
        return
    sys.path_hooks.insert(0, source_only_hook((root,)))
    for key in [k for k in sys.path_importer_cache if _under(os.path.realpath(k or "."), root)]:
        del sys.path_importer_cache[key]  # finders made before the hook (this module's own)
    _from_source.add(root)


def install(package: Path = PACKAGE, modules=MODULES) -> None:
    """Called by `import simserve` (see the module's docstring)."""
    if os.environ.get("SIMSERVE_PURE_PYTHON"):
        run_from_source(package)
    elif (package.parent / "setup.py").is_file():  # a checkout, maybe compiled in place
        stale = stale_modules(package, modules)
        if stale:
            more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
            print(f"simserve: {stale[0]}{more} changed since it was compiled; running from "
                  "source (recompile: SIMSERVE_COMPILE=1 pip install -e .)", file=sys.stderr)
            run_from_source(package)


def status() -> dict[str, str]:
    """Each module of `MODULES` and how it runs in this process: 'compiled' or 'source' (an
    imported module by its file's suffix; one not imported yet by what the import would
    find)."""
    out = {}
    for m in MODULES:
        mod = sys.modules.get(m)
        if mod is not None:
            compiled = str(getattr(mod, "__file__", "")).endswith(tuple(EXTENSION_SUFFIXES))
        else:
            compiled = os.path.realpath(PACKAGE) not in _from_source and \
                compiled_path(m) is not None
        out[m] = "compiled" if compiled else "source"
    return out


def summary() -> str:
    """One line: how many of the hot modules run compiled."""
    n = sum(v == "compiled" for v in status().values())
    line = f"compiled modules: {n}/{len(MODULES)}"
    return line if n else "pure Python; " + line
