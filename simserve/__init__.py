"""simserve: a discrete-event simulator of LLM serving systems.

    import simserve
    r = simserve.simulate("vllm", model="llama-3.1-8b", gpu="h100-sxm", rate=4.0)
    r.summary["p99_ttft_ms"], r.requests.head()
    df = simserve.run_experiment("experiments/quickstart.yaml")
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["simulate", "run_experiment", "load_experiment"]


def __getattr__(name):  # keep `import simserve` cheap; load the API on first use
    if name in ("simulate", "run_experiment"):
        from simserve import api
        return getattr(api, name)
    if name == "load_experiment":
        from simserve.runner.config import load_experiment
        return load_experiment
    raise AttributeError(name)
