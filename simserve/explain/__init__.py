"""Mechanism attribution: a design's goodput lead over a baseline, decomposed by switching the
design's documented mechanism options off one at a time and cumulatively
(`decompose`), with the mechanisms per policy in `mechanisms` and the output in `report`.

    from simserve.explain import explain
    ex = explain("experiments/dualpace/fig09a-10a-14a-conv-llama8b-rtx4090.yaml",
                 design="dualpace", baseline="neo", num_requests=500)
    print(ex.text())        # also: simserve.explain(...), `simserve explain FILE ...`
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

from simserve.explain.decompose import Explanation, Goodput, Row, explain_config
from simserve.explain.mechanisms import MECHANISMS, Mechanism, mechanisms_of

__all__ = [
    "MECHANISMS",
    "Explanation",
    "Goodput",
    "Mechanism",
    "Row",
    "explain",
    "explain_config",
    "mechanisms_of",
]


def explain(config, design: str, baseline: str, *, mechanisms=None, target=None,
            num_requests: int | None = None, rates=None, rtol: float = 0.05,
            sensitivity: bool = False, overrides=(), log=None) -> Explanation:
    """Decompose `design`'s goodput lead over `baseline` (policy labels of the experiment
    `config`: a YAML path, a mapping or a parsed config) into its mechanisms. `num_requests`
    replaces the experiment's request count; `rates` (lowest, highest) where the first
    bisection starts; `rtol` the bisection's relative tolerance; `sensitivity` also prints
    the lead under the contention range (`mechanisms.SENSITIVITY`)."""
    from simserve.runner.config import (
        ExperimentConfig,
        load_experiment,
        parse_experiment,
    )
    ov = list(overrides)
    if num_requests is not None:
        ov.append(f"workload.num_requests={int(num_requests)}")
    if rates is not None:
        ov.append(f"workload.rates=[{float(rates[0])}, {float(rates[1])}]")
    if isinstance(config, ExperimentConfig):
        if ov:
            raise ValueError("explain: num_requests / rates / overrides need a YAML path or "
                             "a mapping, not a parsed config")
        cfg = config
    elif isinstance(config, dict):
        cfg = parse_experiment(config)
        if ov:
            raise ValueError("explain: pass num_requests / rates inside the mapping")
    else:
        cfg = load_experiment(Path(config), ov)
    ex = explain_config(cfg, design, baseline, mechanisms=mechanisms, target=target, rtol=rtol,
                        sensitivity=sensitivity, log=log)
    return ex


class _CallableModule(types.ModuleType):
    """`simserve.explain(...)` calls `explain` (the package stays importable as a package)."""

    def __call__(self, *args, **kwargs) -> Explanation:
        return explain(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
