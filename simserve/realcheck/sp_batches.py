"""Heterogeneous Conflux Parallelism batches on R ranks (sequence-parallel prefill chunks
co-batched with rank-local decodes), and their predictions by simserve's SP cost model and by
ConfluxServe's latency estimator (torch-free).

Batches, in the proportions of a Conflux serving run:
  - mixed (3 in 5): 1–2 prefill chunks of 256–8K new tokens (log-uniform; Σ ≤ 12K), each after
    no context (40 %) or 1K–32K cached tokens, sharded over the ranks, plus on every rank 0–128
    decodes (a rank holds none with probability 1/5) with contexts log-uniform in 1K–16K;
  - prefill (1 in 5): the chunks alone;
  - decode (1 in 5): the decodes alone (1–128 per rank).
Shards are consecutive slices of the concatenated chunks: even (half the batches) or uneven,
with the first rank's share uniform in 20–80 % (waterfill gives a rank fewer prefill tokens
when it holds more decode work). Every rank holds at least one token.
"""
from __future__ import annotations

import json

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.policies.conflux.estimator import ConfluxEstimator


def _logu(rng, lo, hi):
    return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))


def _shards(rng, P: int, R: int) -> list[int]:
    if rng.random() < 0.5:
        w = np.ones(R)
    else:
        w = rng.uniform(0.2, 0.8, R)
    s = np.floor(P * w / w.sum()).astype(int)
    s[-1] = P - s[:-1].sum()
    return [int(x) for x in s]


def sp_batches(n: int, ranks: int = 2, seed: int = 3, max_prefill: int = 12288,
               max_kv_tokens_rank: int = 600_000) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = ("mixed", "prefill", "mixed", "decode", "mixed")[i % 5]
        b = {"i": i, "kind": kind, "chunks": [], "chunk_ctx": [], "chunk_sample": [],
             "shards": [0] * ranks, "decode_ctx": [[] for _ in range(ranks)]}
        if kind != "decode":
            for _ in range(int(rng.integers(1, 3))):
                ell = _logu(rng, 256, 8192)
                if b["chunks"] and sum(b["chunks"]) + ell > max_prefill:
                    break
                b["chunks"].append(min(ell, max_prefill))
                b["chunk_ctx"].append(0 if rng.random() < 0.4 else _logu(rng, 1024, 32768))
                b["chunk_sample"].append(bool(rng.random() < 0.5))
            b["shards"] = _shards(rng, sum(b["chunks"]), ranks)
        if kind != "prefill":
            for r in range(ranks):
                if kind == "mixed" and rng.random() < 0.2:
                    continue
                ctx = [_logu(rng, 1024, 16384) for _ in range(_logu(rng, 1, 128))]
                while sum(ctx) > max_kv_tokens_rank:
                    ctx.pop()
                b["decode_ctx"][r] = ctx
        for r in range(ranks):  # every rank holds at least one token
            if b["shards"][r] + len(b["decode_ctx"][r]) == 0:
                b["decode_ctx"][r] = [_logu(rng, 1024, 16384)]
        out.append(b)
    return out


def as_row(b: dict) -> dict:
    """The batch as CSV cells (lists as JSON)."""
    return {k: (json.dumps(v) if isinstance(v, list) else v) for k, v in b.items()}


def from_row(row) -> dict:
    get = (lambda k: json.loads(row[k]) if isinstance(row[k], str) else row[k])
    return {"i": int(row["i"]), "kind": row["kind"], "chunks": get("chunks"),
            "chunk_ctx": get("chunk_ctx"), "chunk_sample": get("chunk_sample"),
            "shards": get("shards"), "decode_ctx": get("decode_ctx")}


def sample_rows(b: dict, r: int) -> int:
    """LM-head rows on rank r: its decodes and the sampling chunk ends in its shard."""
    lo = sum(b["shards"][:r])
    hi = lo + b["shards"][r]
    ends = np.cumsum(b["chunks"]) if b["chunks"] else np.zeros(0)
    n = sum(1 for e, s in zip(ends, b["chunk_sample"]) if s and lo < e <= hi)
    return n + len(b["decode_ctx"][r])


def estimator_inputs(b: dict) -> dict:
    """Per-rank n_p, n_d, Σ decode context and longest context; the chunks."""
    dec = b["decode_ctx"]
    return {"n_p": list(b["shards"]), "n_d": [len(d) for d in dec],
            "dctx": [int(sum(d)) for d in dec], "dmax": [max(d) if d else 0 for d in dec],
            "prefills": list(zip(b["chunks"], b["chunk_ctx"]))}


def predict_sp(cost: SpCostModel, est: ConfluxEstimator, b: dict) -> dict:
    """µs: the cost model's forward pass (host scheduling left out, as the executor measures
    none) and the estimator's T_iter; per layer, the cost model's shared-linear time and the two
    split-region paths (0 where a path is empty)."""
    x = estimator_inputs(b)
    R = len(x["n_p"])
    rows = max(sample_rows(b, r) for r in range(R))
    chunks, ctxs = np.asarray(b["chunks"], dtype=np.int64), np.asarray(b["chunk_ctx"], dtype=np.int64)
    dmax = [m if n else None for m, n in zip(x["dmax"], x["n_d"])]
    it = cost.iteration_s(x["n_p"], x["n_d"], x["dctx"], chunks, ctxs, rows, dmax)
    fwd = it * 1e6 - cost.host_us(x["n_d"], len(chunks))
    lin = max(cost.base.dense_layer_us(p + d) for p, d in zip(x["n_p"], x["n_d"]))
    t_p = cost.prefill_path_us(max(x["n_p"]), chunks, ctxs) if len(chunks) else 0.0
    t_d = cost.decode_path_us(x["n_d"], x["dctx"], dmax) or 0.0
    e = est.iteration_time(x["n_p"], x["n_d"], x["dctx"], x["prefills"]) * 1e6
    return {"predicted_us": fwd, "estimator_us": e, "lin_layer_us": lin, "tp_layer_us": t_p,
            "td_layer_us": t_d}
