"""simserve: a discrete-event simulator of LLM serving systems.

    import simserve
    r = simserve.simulate("vllm", model="llama-3.1-8b", gpu="h100-sxm", rate=4.0)
    r.summary["p99_ttft_ms"], r.requests.head()
    df = simserve.run_experiment("quickstart")

`import simserve` imports nothing else: every public name below is loaded on first use
(module `__getattr__`), so the command line and `import simserve` start in milliseconds.
"""
from __future__ import annotations

from simserve.compiled import install as _install_compiled

# before any other simserve module is imported: SIMSERVE_PURE_PYTHON, and compiled modules
# older than their source (simserve/compiled.py)
_install_compiled()

# public name -> "module:attribute", imported on first access
_LAZY = {
    "simulate": "simserve.api:simulate",
    "run_experiment": "simserve.api:run_experiment",
    "load_results": "simserve.api:load_results",
    "load_experiment": "simserve.runner.config:load_experiment",
    "parse_experiment": "simserve.runner.config:parse_experiment",
    "simulate_point": "simserve.run:simulate_point",
    "explain": "simserve.explain:",   # the package, callable: simserve.explain(FILE, ...)
    "build_workload": "simserve.workload.build:build_workload",
    "Workload": "simserve.workload.spec:Workload",
    "SimserveError": "simserve.errors:SimserveError",
    "ConfigError": "simserve.errors:ConfigError",
    "plan": "simserve.plan:callable_module",   # simserve.plan(...) runs a plan
}

__all__ = ["__version__", *_LAZY]


def _read_version() -> str:
    """The installed distribution's version; from a source checkout that is not installed,
    the `version` in the pyproject.toml beside the package."""
    from importlib import metadata
    try:
        return metadata.version("simserve")
    except metadata.PackageNotFoundError:
        pass
    import re
    from pathlib import Path
    try:
        text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    except OSError:
        return "0+unknown"
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    m = re.search(r'^version\s*=\s*["\']([^"\']+)["\']', project.group(1) if project else "",
                  re.M)
    return m.group(1) if m else "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        value = _read_version()
    elif name in _LAZY:
        import importlib
        mod, attr = _LAZY[name].split(":")
        value = importlib.import_module(mod)
        value = getattr(value, attr) if attr else value
    else:
        raise AttributeError(f"module 'simserve' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
