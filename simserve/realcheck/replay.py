"""End-to-end validation: one trace, one scheduler, two sources of iteration time.

`ExecutorCost` stands in for an engine's GpuCostModel: each iteration's forward pass is timed
on the GPU by a real executor (`measure(batch) -> µs`) and the cost model's scheduler overhead
(`scheduler_s`, the profile's assumed host cost) is added, so both runs differ only in where
the forward time comes from. The real run steps every iteration (no event leaping); the
simulated run leaps, which tests prove identical to stepping.
"""
from __future__ import annotations

import math
import time

import numpy as np

from simserve.metrics import summarize

COMPARED = ["mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
            "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "output_throughput",
            "request_throughput"]


def shape_to_batch(shape) -> dict:
    """The executor's batch for a scheduler's BatchShape (the first chunks sample)."""
    n_chunks = len(shape.prefill_chunks)
    k = shape.num_sample_rows - shape.num_decodes
    dec = shape.decode_ctx if shape.decode_ctx is not None else (
        np.full(shape.num_decodes, shape.decode_ctx_sum // max(1, shape.num_decodes)))
    return {"kind": "replay", "chunks": [int(x) for x in shape.prefill_chunks],
            "chunk_ctx": [int(x) for x in shape.prefill_ctx],
            "chunk_sample": [i < k for i in range(n_chunks)],
            "decode_ctx": [int(x) for x in dec]}


class ExecutorCost:
    def __init__(self, cost, measure, log: list | None = None):
        self.cost, self.measure = cost, measure
        self.log = log if log is not None else []

    def step_s(self, shape) -> float:
        b = shape_to_batch(shape)
        us = float(self.measure(b))
        self.log.append((shape.num_tokens, shape.num_prefills, shape.num_decodes,
                         shape.decode_ctx_sum, us, self.cost.forward_s(shape) * 1e6))
        return us * 1e-6 + self.cost.scheduler_s(shape.num_prefills + shape.num_decodes)

    def decode_only_s(self, num_decodes, ctx_sum):
        raise RuntimeError("the real-executor replay steps every iteration (leap: false)")

    def __getattr__(self, name):
        return getattr(self.cost, name)


def replay_params(graph_max_tokens: int = 1 << 20) -> dict:
    """Policy parameters both runs share: every iteration under a CUDA graph, as the executor
    runs them; the generic host overhead (the executor has no serving engine around it); no
    prefix caching (the executor computes every scheduled token, and the stored replays
    predate the cache)."""
    return {"graph_max_tokens": graph_max_tokens, "engine": "generic",
            "enable_prefix_caching": False}


def run_pair(workload, model: str, hardware, measure=None, policy: str = "vllm",
             params: dict | None = None) -> dict:
    """The simulated run, and (with `measure`) the real-executor run, of the same arrivals."""
    from simserve.run import simulate_point
    params = dict(replay_params(), **(params or {}))
    out = {}
    t = time.perf_counter()
    sim = simulate_point(workload, model, hardware, policy, **params)
    out["sim"] = {"records": sim.records, "summary": summarize(sim.records),
                  "wall_s": time.perf_counter() - t, "iterations": sim.stats["num_iterations"]}
    if measure is not None:
        log: list = []
        t = time.perf_counter()
        real = simulate_point(workload, model, hardware, policy, leap=False,
                              gpu_cost_hook=lambda c: ExecutorCost(c, measure, log), **params)
        out["real"] = {"records": real.records, "summary": summarize(real.records),
                       "wall_s": time.perf_counter() - t,
                       "iterations": real.stats["num_iterations"], "log": log}
    return out


def compare(sim_summary: dict, real_summary: dict) -> list[dict]:
    rows = []
    for k in COMPARED:
        s, r = sim_summary.get(k, math.nan), real_summary.get(k, math.nan)
        err = (s - r) / r * 100 if r and math.isfinite(r) else math.nan
        rows.append({"metric": k, "simulated": s, "real_executor": r, "error_pct": err})
    return rows
