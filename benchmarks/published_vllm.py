"""Reproduce published vLLM serving measurements with simserve and print the errors.

    python benchmarks/published_vllm.py                      # every row of the measurements file
    python benchmarks/published_vllm.py --ids fp8kv-c1-in1k --max-requests 50
    python benchmarks/published_vllm.py --cap-closed-loop 30   # the quick scoring CI runs

Reads `validation/published/measurements.yaml` (the cited numbers and each row's setup), builds
the row's workload, runs simserve's `vllm` policy through the public API (`simserve.simulate`
with a `Workload`) and prints: source, setup, metric, published, simserve, error % (simserve
minus published, in % of published), then the median and worst |error| per GPU (the GPU class
the row was measured on: H100 of any variant, H200). Nothing here holds a result; every
simserve number is computed on the run.

Workload kinds (the row's `simserve.workload.kind`):
  fixed            every prompt input_len tokens, every output output_len tokens
  uniform          vLLM's random dataset with a range ratio r: lengths uniform in
                   [floor(L(1-r)), ceil(L(1+r))], drawn with our seed
  sharegpt-approx  simserve has no ShareGPT: the Azure-conversation lognormal shape scaled to
                   the row's prompt/output means, clipped to vLLM's ShareGPT filter
                   (prompt <= max_prompt, prompt + output <= max_total)
Arrivals: request rate inf (all at t = 0), a Poisson rate, or a client concurrency limit
(`concurrency`: vllm bench's semaphore, built one request at a time from simulated finishes).
"""
from __future__ import annotations

import argparse
import heapq
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import simserve  # noqa: E402
from simserve.workload import SYNTHETIC, Workload, poisson_arrivals  # noqa: E402

DEFAULT_FILE = ROOT / "validation" / "published" / "measurements.yaml"
SHAREGPT_BASE = "synthetic-conversation"


def load(path: str | Path = DEFAULT_FILE) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


# ----------------------------------------------------------------------------- workloads


def lengths(row: dict, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of the row's simulated workload (n requests)."""
    pub, sim = row["workload"], row["simserve"]["workload"]
    kind, seed = sim["kind"], int(sim.get("seed", 0))
    if kind == "fixed":
        return (np.full(n, int(pub["input_len"]), dtype=np.int64),
                np.full(n, int(pub["output_len"]), dtype=np.int64))
    if kind == "uniform":
        rng = np.random.default_rng(seed)
        r = float(pub["range_ratio"])
        out = []
        for length in (int(pub["input_len"]), int(pub["output_len"])):
            lo, hi = max(1, math.floor(length * (1 - r))), math.ceil(length * (1 + r))
            out.append(rng.integers(lo, hi + 1, size=n).astype(np.int64))
        return out[0], out[1]
    if kind == "sharegpt-approx":
        spec = SYNTHETIC[SHAREGPT_BASE].scaled_to_means(
            f"sharegpt-approx-{row['id']}", float(sim["prompt_mean"]), float(sim["output_mean"]),
            f"{SHAREGPT_BASE} shape scaled to ShareGPT means ({row['source']})")
        w = spec.generate(n, seed)
        p = np.minimum(np.asarray(w.prompt_tokens, dtype=np.int64), int(sim["max_prompt"]))
        o = np.asarray(w.output_tokens, dtype=np.int64)
        o = np.maximum(1, np.minimum(o, int(sim["max_total"]) - p))
        return p, o
    raise ValueError(f"{row['id']}: unknown workload kind {kind!r}")


def num_requests(row: dict, cap: int | None) -> int:
    n = int(row["simserve"]["workload"]["num_requests"])
    return min(n, cap) if cap else n


def open_arrivals(row: dict, n: int) -> np.ndarray:
    sim = row["simserve"]["workload"]
    rate = float(sim.get("request_rate", math.inf))
    if math.isinf(rate):
        return np.zeros(n)
    return poisson_arrivals(n, rate, np.random.default_rng(int(sim.get("seed", 0)) + 1))


# ----------------------------------------------------------------------------- simulation


def _simulate(row: dict, prompts, outputs, arrivals):
    s = row["simserve"]
    w = Workload(np.asarray(arrivals, dtype=np.float64), prompts, outputs,
                 name=f"published-{row['id']}")
    return simserve.simulate("vllm", model=s["model"], gpu=s["gpu"],
                             num_gpus=int(s.get("num_gpus", 1)), workload=w,
                             num_requests=len(prompts), **dict(s.get("policy") or {}))


def run_row(row: dict, cap: int | None = None) -> dict:
    """Simulate one measurement; returns the summary and how it was obtained."""
    n = num_requests(row, cap)
    prompts, outputs = lengths(row, n)
    conc = row["simserve"]["workload"].get("concurrency")
    t0 = time.perf_counter()
    iters, residual = 1, 0.0
    if conc:
        # Exact closed loop, one request at a time: simulate the requests whose send times are
        # known; the earliest slot that frees after them is the next send time, and no request
        # sent later can change a finish before it (causality). One simulation per request.
        conc = min(int(conc), n)
        sent = np.zeros(n)
        known, iters = conc, 0
        while True:
            res = _simulate(row, prompts[:known], outputs[:known], sent[:known])
            iters += 1
            fr = res.requests
            if not np.array_equal(fr["prompt_tokens"].to_numpy(), prompts[:known]):
                raise RuntimeError("per-request frame is not in workload order")
            lat = (fr["finish_s"] - fr["arrival_s"]).to_numpy()
            free = [0.0] * conc
            for i in range(known):  # replay the semaphore over the known requests
                t = heapq.heappop(free)
                residual = max(residual, abs(t - sent[i]))
                heapq.heappush(free, t + float(lat[i]))
            if known == n:
                break
            sent[known] = heapq.heappop(free)
            known += 1
    else:
        res = _simulate(row, prompts, outputs, open_arrivals(row, n))
    return {"summary": res.summary, "requests": res.requests, "n": n, "prompt_mean": float(prompts.mean()),
            "output_mean": float(outputs.mean()), "iterations": iters, "residual_s": residual,
            "wall_s": time.perf_counter() - t0}


def gpu_class(row: dict) -> str:
    """The GPU class a row was measured on, read from its `gpu` field: "H200" or "H100" (SXM,
    PCIe, NVL or unstated variants alike)."""
    g = str(row["gpu"]).upper()
    for name in ("H200", "H100"):
        if name in g:
            return name
    raise ValueError(f"{row['id']}: gpu {row['gpu']!r} is neither an H100 nor an H200")


def cap_for(row: dict, max_requests: int | None, cap_closed_loop: int | None) -> int | None:
    """The request cap one row runs under: `max_requests` for every row, `cap_closed_loop` only
    for client-concurrency rows (their exact closed loop costs one simulation per request)."""
    caps = [c for c in (max_requests,
                        cap_closed_loop if row["simserve"]["workload"].get("concurrency") else None)
            if c]
    return min(caps) if caps else None


def per_gpu(table: list[dict]) -> dict[str, dict]:
    """Median and worst |error| (%) over the metrics of each GPU class, with row counts."""
    out: dict[str, dict] = {}
    for gpu in sorted({r["gpu_class"] for r in table}):
        rs = [r for r in table if r["gpu_class"] == gpu]
        errs = np.array([abs(r["error_pct"]) for r in rs])
        worst = rs[int(np.argmax(errs))]
        out[gpu] = {"measurements": len({r["id"] for r in rs}), "metrics": len(rs),
                    "sources": len({r["source"] for r in rs}),
                    "median_abs_error_pct": float(np.median(errs)),
                    "worst_abs_error_pct": float(errs.max()),
                    "worst": f"{worst['id']} {worst['metric']}"}
    return out


def score(rows: list[dict], max_requests: int | None = None,
          cap_closed_loop: int | None = None) -> tuple[list[dict], list[str]]:
    """Simulate every row; returns one dict per published metric and one run note per row."""
    table, notes = [], []
    for row in rows:
        out = run_row(row, cap_for(row, max_requests, cap_closed_loop))
        table += [dict(r, setup=setup_line(row), gpu_class=gpu_class(row))
                  for r in compare(row, out)]
        loop = (f", closed loop: {out['iterations']} simulations, send times re-derived "
                f"within {out['residual_s']:.1e} s"
                if row["simserve"]["workload"].get("concurrency") else "")
        notes.append(f"{row['id']}: simulated {out['n']} requests, mean prompt "
                     f"{out['prompt_mean']:.1f} / output {out['output_mean']:.1f} tokens, "
                     f"{out['summary'].get('num_unfinished', 0)} unfinished{loop}; "
                     f"{out['wall_s']:.1f} s wall")
    return table, notes


def compare(row: dict, out: dict) -> list[dict]:
    rows = []
    for metric, pub in row["published"].items():
        sim = float(out["summary"][metric])
        rows.append({"id": row["id"], "source": row["source"], "metric": metric,
                     "published": float(pub), "simserve": sim,
                     "error_pct": 100.0 * (sim - float(pub)) / float(pub)})
    return rows


def setup_line(row: dict) -> str:
    w = row["workload"]
    if w.get("concurrency"):
        arr = f"c={w['concurrency']}"
    else:
        rate = w["request_rate"]
        arr = "rate=inf" if str(rate) == "inf" else f"rate={rate}/s"
    lens = (f"{w['input_len']}/{w['output_len']}" if w["dataset"] == "random" else "ShareGPT")
    return (f"vLLM {row['vllm_version'].split()[0]}, {row['model'].split('/')[-1]}, "
            f"{row['gpu'].split(' (')[0]}, TP{row['tp']}, {w['dataset']} {lens}, {arr}, "
            f"n={w['num_prompts'] if isinstance(w['num_prompts'], int) else '?'}")


def _fmt(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 1e5 else f"{x:,.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(DEFAULT_FILE))
    ap.add_argument("--ids", nargs="*", help="only these measurement ids")
    ap.add_argument("--max-requests", type=int, default=None,
                    help="cap every row's request count (quick checks; changes the numbers)")
    ap.add_argument("--cap-closed-loop", type=int, default=None,
                    help="cap only client-concurrency rows (one simulation per request)")
    args = ap.parse_args(argv)
    data = load(args.file)
    rows = [m for m in data["measurements"] if not args.ids or m["id"] in args.ids]
    if args.ids and len(rows) != len(set(args.ids)):
        missing = set(args.ids) - {m["id"] for m in rows}
        ap.error(f"unknown ids: {', '.join(sorted(missing))}")
    print(f"simserve {simserve.__version__}: published vLLM measurements vs simserve's `vllm` "
          f"policy ({args.file})")
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load_avg:.1f} at start (wall times below "
          "scale with it; simulated numbers do not)")
    if args.max_requests:
        print(f"NOTE: request counts capped at {args.max_requests}; numbers are not comparable")
    if args.cap_closed_loop:
        print(f"NOTE: client-concurrency rows capped at {args.cap_closed_loop} requests")
    table, notes = score(rows, args.max_requests, args.cap_closed_loop)
    head = ("id", "setup", "metric", "published", "simserve", "error %")
    cells = [(r["id"], r["setup"], r["metric"], _fmt(r["published"]), _fmt(r["simserve"]),
              f"{r['error_pct']:+.1f}") for r in table]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda c: "  ".join(x.ljust(w) if i < 3 else x.rjust(w)
                               for i, (x, w) in enumerate(zip(c, widths)))
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print(line(c))
    errs = np.array([abs(r["error_pct"]) for r in table])
    print(f"\n{len(table)} metrics over {len(rows)} measurements from "
          f"{len({r['source'] for r in rows})} sources: median |error| {np.median(errs):.1f} %, "
          f"mean |error| {errs.mean():.1f} %, max {errs.max():.1f} %")
    print("\nper GPU (|error| over every metric of the rows measured on it):")
    for gpu, s in per_gpu(table).items():
        print(f"  {gpu}: {s['measurements']} measurements ({s['metrics']} metrics) from "
              f"{s['sources']} sources: median |error| {s['median_abs_error_pct']:.1f} %, "
              f"worst {s['worst_abs_error_pct']:.1f} % ({s['worst']})")
    print("\nsources:")
    for key in sorted({r["source"] for r in rows}):
        s = data["sources"][key]
        where = s.get("url") or f"{s['repository']}:{s['path']}"
        print(f"  {key}: {s['title']} ({s['date']}); {where}")
    print("\nruns:")
    for n in notes:
        print("  " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
