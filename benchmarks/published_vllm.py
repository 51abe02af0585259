"""Reproduce published vLLM serving measurements with simserve and print the errors.

    python benchmarks/published_vllm.py                      # every row of the measurements file
    python benchmarks/published_vllm.py --ids fp8kv-c1-in1k --max-requests 50

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
(`concurrency`: vllm bench's semaphore, simserve's closed-loop client `max_concurrency`).
Offline runs (`vllm bench throughput`, `vllm bench latency`: `LLM.generate` on a list) set the
policy's `offline: true`.

Rows that use a feature simserve does not model (FP8 weights or KV cache, MoE, sliding-window
attention, speculative decoding, ...) carry `not_comparable: <reason>`: they are listed with
their numbers and reason, never simulated or scored. Every scored row names a
`tolerance_class`; the file's `tolerance_classes` give each class its largest accepted
|error| (%) and why, and `check` lists the metrics past it (the CI test fails on any).
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


def _simulate(row: dict, prompts, outputs, arrivals, concurrency: int | None = None):
    s = row["simserve"]
    w = Workload(np.asarray(arrivals, dtype=np.float64), prompts, outputs,
                 name=f"published-{row['id']}")
    return simserve.simulate("vllm", model=s["model"], gpu=s["gpu"],
                             num_gpus=int(s.get("num_gpus", 1)), workload=w,
                             num_requests=len(prompts), max_concurrency=concurrency,
                             **dict(s.get("policy") or {}))


def comparable(row: dict) -> bool:
    """Whether simserve models everything the row's setup uses (else it is listed, not run)."""
    return not row.get("not_comparable")


def semaphore_residual(requests, concurrency: int) -> float:
    """Largest gap (s) between each request's send time in `requests` (workload order) and
    the one vllm bench's semaphore gives from the same latencies: a request goes out when
    one of the `concurrency` in flight finishes."""
    sent = requests["arrival_s"].to_numpy()
    lat = (requests["finish_s"] - requests["arrival_s"]).to_numpy()
    free, residual = [0.0] * concurrency, 0.0
    for i in range(len(sent)):
        t = heapq.heappop(free)
        residual = max(residual, abs(t - float(sent[i])))
        heapq.heappush(free, t + float(lat[i]))
    return residual


def run_row(row: dict, cap: int | None = None) -> dict:
    """Simulate one measurement; returns the summary and how it was obtained."""
    n = num_requests(row, cap)
    prompts, outputs = lengths(row, n)
    conc = row["simserve"]["workload"].get("concurrency")
    t0 = time.perf_counter()
    residual = 0.0
    if conc:
        # vllm bench's --max-concurrency: simserve's closed-loop client sends a request when
        # one in flight finishes; the semaphore is replayed over the result as a check
        conc = min(int(conc), n)
        res = _simulate(row, prompts, outputs, np.zeros(n), conc)
        if not np.array_equal(res.requests["prompt_tokens"].to_numpy(), prompts):
            raise RuntimeError("per-request frame is not in workload order")
        residual = semaphore_residual(res.requests, conc)
    else:
        res = _simulate(row, prompts, outputs, open_arrivals(row, n))
    return {"summary": res.summary, "requests": res.requests, "n": n,
            "prompt_mean": float(prompts.mean()), "output_mean": float(outputs.mean()),
            "residual_s": residual, "wall_s": time.perf_counter() - t0}


def gpu_class(row: dict) -> str:
    """The GPU class a row was measured on, read from its `gpu` field: "H200" or "H100" (SXM,
    PCIe, NVL or unstated variants alike)."""
    g = str(row["gpu"]).upper()
    for name in ("H200", "H100"):
        if name in g:
            return name
    raise ValueError(f"{row['id']}: gpu {row['gpu']!r} is neither an H100 nor an H200")


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


# metric families the per-GPU summary is split by (simserve summary key -> family)
FAMILIES = {"ttft": "TTFT", "tpot": "TPOT/ITL", "itl": "TPOT/ITL", "e2el": "E2E latency",
            "throughput": "throughput/duration", "duration": "throughput/duration"}


def family(metric: str) -> str:
    """The family of a published metric: TTFT, TPOT/ITL, E2E latency, throughput/duration."""
    for key, name in FAMILIES.items():
        if key in metric:
            return name
    raise ValueError(f"metric {metric!r} belongs to no family")


def per_gpu_metric(table: list[dict]) -> dict[tuple[str, str], dict]:
    """Median and worst |error| (%) per (GPU class, metric family), with the worst metric."""
    out: dict[tuple[str, str], dict] = {}
    for key in sorted({(r["gpu_class"], family(r["metric"])) for r in table}):
        rs = [r for r in table if (r["gpu_class"], family(r["metric"])) == key]
        errs = np.array([abs(r["error_pct"]) for r in rs])
        worst = rs[int(np.argmax(errs))]
        out[key] = {"metrics": len(rs), "median_abs_error_pct": float(np.median(errs)),
                    "worst_abs_error_pct": float(errs.max()),
                    "worst": f"{worst['id']} {worst['metric']}"}
    return out


def check(table: list[dict], classes: dict) -> list[str]:
    """The scored metrics whose |error| is past their row class's tolerance, one line each."""
    bad = []
    for r in table:
        cls = classes.get(r["tolerance_class"])
        if cls is None:
            bad.append(f"{r['id']}: unknown tolerance_class {r['tolerance_class']!r}")
        elif abs(r["error_pct"]) > float(cls["max_abs_error_pct"]):
            bad.append(f"{r['id']} {r['metric']}: |error| {abs(r['error_pct']):.1f} % > "
                       f"{cls['max_abs_error_pct']} % ({r['tolerance_class']})")
    return bad


def score(rows: list[dict], max_requests: int | None = None) -> tuple[list[dict], list[str]]:
    """Simulate every row; returns one dict per published metric and one run note per row."""
    table, notes = [], []
    for row in filter(comparable, rows):
        out = run_row(row, max_requests)
        table += [dict(r, setup=setup_line(row), gpu_class=gpu_class(row))
                  for r in compare(row, out)]
        loop = (f", closed loop: vllm bench's semaphore replayed over the result agrees "
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
                     "tolerance_class": row["tolerance_class"],
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
    if ((row.get("simserve") or {}).get("policy") or {}).get("offline"):
        arr = "offline"
    lens = (f"{w['input_len']}/{w['output_len']}" if w["dataset"] == "random" else "ShareGPT")
    ver = str(row["vllm_version"]).split()[0]
    ver = ver if ver[:1].isdigit() else "?"
    return (f"vLLM {ver}, {row['model'].split(' (')[0].split('/')[-1]}, "
            f"{row['gpu'].split(' (')[0]}, TP{row['tp']}, {w['dataset']} {lens}, {arr}, "
            f"n={w['num_prompts'] if isinstance(w['num_prompts'], int) else '?'}")


def _fmt(x: float) -> str:
    if abs(x) < 10:
        return f"{x:.3f}"
    return f"{x:,.2f}" if abs(x) < 1e5 else f"{x:,.0f}"


def _print_table(head: tuple, cells: list[tuple]) -> None:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]

    def line(c):
        return "  ".join(x.ljust(w) if i < 3 or i == 6 else x.rjust(w)
                         for i, (x, w) in enumerate(zip(c, widths)))
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print(line(c))


def _print_summaries(table: list[dict], classes: dict) -> None:
    print("\nper GPU (|error| over every metric of the rows measured on it):")
    for gpu, s in per_gpu(table).items():
        print(f"  {gpu}: {s['measurements']} measurements ({s['metrics']} metrics) from "
              f"{s['sources']} sources: median |error| {s['median_abs_error_pct']:.1f} %, "
              f"worst {s['worst_abs_error_pct']:.1f} % ({s['worst']})")
    print("\nper GPU and metric:")
    for (gpu, fam), s in per_gpu_metric(table).items():
        print(f"  {gpu} {fam}: {s['metrics']} metrics, median |error| "
              f"{s['median_abs_error_pct']:.1f} %, worst {s['worst_abs_error_pct']:.1f} % "
              f"({s['worst']})")
    print("\nworst metrics and their class's reason:")
    for r in sorted(table, key=lambda r: -abs(r["error_pct"]))[:6]:
        why = " ".join(str(classes[r["tolerance_class"]]["why"]).split())
        print(f"  {r['id']} {r['metric']} {r['error_pct']:+.1f} % [{r['tolerance_class']}]: {why}")
    bad = check(table, classes)
    print("\ntolerance classes (largest accepted |error|): "
          + "; ".join(f"{k} {v['max_abs_error_pct']} %" for k, v in classes.items()))
    print("past their class's tolerance: " + ("; ".join(bad) if bad else "none"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(DEFAULT_FILE))
    ap.add_argument("--ids", nargs="*", help="only these measurement ids")
    ap.add_argument("--max-requests", type=int, default=None,
                    help="cap every row's request count (quick checks; changes the numbers)")
    args = ap.parse_args(argv)
    data = load(args.file)
    rows = [m for m in data["measurements"] if not args.ids or m["id"] in args.ids]
    if args.ids and len(rows) != len(set(args.ids)):
        missing = set(args.ids) - {m["id"] for m in rows}
        ap.error(f"unknown ids: {', '.join(sorted(missing))}")
    shown = Path(args.file).resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    print(f"simserve {simserve.__version__}: published vLLM measurements vs simserve's `vllm` "
          f"policy ({shown})")
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} cores, load average {load_avg:.1f} at start (wall times below "
          "scale with it; simulated numbers do not)")
    if args.max_requests:
        print(f"NOTE: request counts capped at {args.max_requests}; numbers are not comparable")
    table, notes = score(rows, args.max_requests)
    classes = data["tolerance_classes"]
    head = ("id", "setup", "metric", "published", "simserve", "error %", "class")
    cells = [(r["id"], r["setup"], r["metric"], _fmt(r["published"]), _fmt(r["simserve"]),
              f"{r['error_pct']:+.1f}", r["tolerance_class"]) for r in table]
    _print_table(head, cells)
    errs = np.array([abs(r["error_pct"]) for r in table])
    scored = [r for r in rows if comparable(r)]
    print(f"\n{len(table)} metrics over {len(scored)} scored measurements from "
          f"{len({r['source'] for r in scored})} sources: median |error| {np.median(errs):.1f} %, "
          f"mean |error| {errs.mean():.1f} %, max {errs.max():.1f} %")
    _print_summaries(table, classes)
    nc = [r for r in rows if not comparable(r)]
    if nc:
        print(f"\nnot comparable ({len(nc)} measurements, listed, not simulated):")
        for r in nc:
            nums = ", ".join(f"{k} {_fmt(float(v))}" for k, v in r["published"].items())
            print(f"  {r['id']} ({setup_line(r)}): {nums}; {r['not_comparable']}")
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
