"""ConfluxServe Table 2: prefill throughput (req/s) under a decode TBT SLO with 96 ongoing
decodes, 4×H100, Qwen3-14B, prefill degree 4; ours beside the paper's.

    python benchmarks/conflux_table2.py [--window 15] [--policies loongserve,chunked,muxwise,conflux]

Setting (paper §3.3 with the decode load of §8.3): 96 background decodes with 8K-token contexts
(24 per GPU, as in Fig. 13/14b) run throughout; a backlog of Mooncake-Toolagent-shaped prompts
(synthetic lengths matched to Table 3; prefill only, one output token, so the decode count stays
96) is released once every background request is decoding. Every design is simulated on this
same workload with its own policy (at main 8821cc1 chunked prefill and MuxWise were priced in
steady state at the median prompt instead, `conflux_table2_baselines.py`).

Throughput: prompt tokens of the backlog prompts completed by the last completion inside the
`window` seconds after the release, over the time to that completion (no quantisation to whole
prompts in the window), reported in req/s at the workload's mean prompt so the designs compare.

The TBT SLO, one criterion for all four designs: the 99th percentile of the background decodes'
inter-token gaps inside the window is at most τ, and no background decode stalls (a gap over
10 τ: preempted when KV runs out). Each design meets it its own way:
- `conflux` (ConfluxServe-FCFS) dispatches against τ (minus its `tbt_margin`);
- `chunked` (vLLM chunked prefill, TP4): the paper sweeps the token budget and reports the best
  configuration; here budgets 256–8192 in steps of 128, the highest throughput whose p99 gap
  meets τ (the budget, and the best under a mean-gap criterion, are printed too);
- `muxwise` (TP4): its TBT-aware SM split (decode gets the fewest SMs meeting τ);
- `loongserve`: Fig. 6's configuration — prefill pinned at SP4 (`prefill_sp=4`), decode SP1 —
  alternating one prefill and one decode iteration (`max_wait_tokens=1`), each prefill
  iteration capped so that it plus one decode step fit τ (`tbt_ms`; LoongServe itself has no TBT
  control, so this cap is ours: without it a whole-prompt SP4 prefill of the median prompt alone
  outlasts 50 ms).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.sim.run import simulate_point
from simserve.workload.spec import Workload
from simserve.workload.synthetic import synthetic_workload

PAPER = {  # Table 2 (req/s); column order as in Fig. 6, policies.md §9
    "loongserve": (2.41, 5.17), "chunked": (4.17, 5.92), "muxwise": (4.38, 5.43),
    "conflux": (6.15, 8.27)}
NUM_DECODES, DECODE_CTX = 96, 8192
MODEL = "qwen3-14b"
PROBE_OUT = 4000  # background output while finding the start (longer than the warm-up)
CHUNKED_BUDGETS = range(256, 8193, 128)
# mean prompt of the (capped) Toolagent-shaped distribution, from a large sample: turns a token
# throughput into req/s without the noise of which prompts happen to land in the window
MEAN_PROMPT = float(np.minimum(synthetic_workload("synthetic-mooncake-toolagent", 200_000, 1)
                               .prompt_tokens, 32767).mean())


def workload(start_s: float, backlog: int, decode_out: int, seed: int = 0) -> Workload:
    p = synthetic_workload("synthetic-mooncake-toolagent", backlog, seed).prompt_tokens
    p = np.minimum(p, 32768 - 1)
    arrival = np.concatenate([np.zeros(NUM_DECODES), np.full(backlog, start_s)])
    prompt = np.concatenate([np.full(NUM_DECODES, DECODE_CTX), p])
    output = np.concatenate([np.full(NUM_DECODES, decode_out), np.ones(backlog, dtype=np.int64)])
    return Workload(arrival, prompt.astype(np.int64), output.astype(np.int64), name="table2")


def measure(policy: str, params: dict, tbt_ms: float, window: float, hw) -> dict:
    # phase 1: when is every background request decoding (prefilled)? Same background as
    # phase 2 up to that time (no background request finishes before it in either run).
    probe = simulate_point(workload(1e6, 1, PROBE_OUT), MODEL, hw, policy, **params)
    start = float(np.nanmax(probe.records.first_token_s[:NUM_DECODES])) + 0.5
    backlog = int(14 * window) + 50
    out = max(PROBE_OUT, int((start + window) / 0.015) + 200)
    w = workload(start, backlog, decode_out=out)
    t0 = time.perf_counter()
    res = simulate_point(w, MODEL, hw, policy, **params)
    wall = time.perf_counter() - t0
    rec = res.records
    ft = rec.first_token_s[NUM_DECODES:]
    inside = (ft > start) & (ft <= start + window)
    prompts = w.prompt_tokens[NUM_DECODES:]
    t_last = float(ft[inside].max()) if inside.any() else np.nan
    done = (ft <= t_last) if inside.any() else inside
    tok_s = float(prompts[done].sum()) / (t_last - start) if inside.any() else 0.0
    end = start + window
    gaps, stalled = [], 0  # background decode gaps inside the window
    for i in range(NUM_DECODES):
        tt = rec.token_times(i)
        after = tt[tt > end]
        # the gap that straddles the window's end counts too: a decode preempted (KV
        # exhausted) inside the window shows up as one long gap, not as no gaps
        tt = np.concatenate([tt[(tt >= start) & (tt <= end)], after[:1] if len(after) else [end]])
        g = np.diff(tt)
        gaps.append(g)
        stalled += int(len(g) > 0 and g.max() * 1e3 > 10 * tbt_ms)
    g = np.concatenate(gaps) * 1e3
    p99 = float(np.percentile(g, 99)) if len(g) else np.nan
    return {"rate": int(inside.sum()) / window, "tok_s": tok_s, "rate_at_mean": tok_s / MEAN_PROMPT,
            "p99_itl_ms": p99, "mean_itl_ms": float(g.mean()) if len(g) else np.nan,
            "max_itl_ms": float(g.max()) if len(g) else np.nan,
            "stalled": stalled,
            "meets_tbt": bool(p99 <= tbt_ms * (1 + 1e-9) and stalled == 0),
            "decoding": int((rec.finish_s[:NUM_DECODES] > start + window).sum()),
            "wall_s": wall, "requests": w.num_requests, "start_s": start,
            "backlog_left": int((ft > start + window).sum()),
            "preemptions": int(res.stats["num_preemptions"])}


def chunked_sweep(tbt_ms: float, window: float, hw, budgets=CHUNKED_BUDGETS) -> dict:
    """The paper's budget sweep: every budget until the p99 gap passes 1.5 τ; the best run whose
    p99 gap meets τ, with `budget`, and `best_mean` (the best whose *mean* gap meets τ)."""
    runs = []
    for b in budgets:
        m = measure("chunked", dict(max_num_batched_tokens=b), tbt_ms, window, hw)
        m["budget"] = b
        runs.append(m)
        if m["p99_itl_ms"] > 1.5 * tbt_ms:
            break
    ok = [m for m in runs if m["meets_tbt"]]
    best = max(ok, key=lambda m: m["tok_s"]) if ok else dict(runs[0], tok_s=0.0, rate_at_mean=0.0)
    ok_mean = [m for m in runs if m["mean_itl_ms"] <= tbt_ms]
    best["best_mean"] = max(ok_mean, key=lambda m: m["tok_s"]) if ok_mean else None
    best["sweep"] = [(m["budget"], m["rate_at_mean"], m["p99_itl_ms"], m["mean_itl_ms"])
                     for m in runs]
    return best


def variants(pol: str, tbt: float) -> dict:
    if pol == "conflux":
        return dict(scheduler="fcfs", tbt_ms=tbt)
    if pol == "loongserve":
        return dict(scheduler="fcfs", tbt_ms=tbt, max_wait_tokens=1, prefill_sp=4)
    if pol == "muxwise":
        return dict(tbt_ms=tbt)
    raise SystemExit(f"--policies: unknown {pol!r} (conflux, loongserve, chunked, muxwise)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=15.0,
                    help="measurement window (s); past ~20 s the background decodes' growing KV "
                         "starts to preempt some of them under LoongServe at 50 ms")
    ap.add_argument("--policies", default="loongserve,chunked,muxwise,conflux")
    a = ap.parse_args(argv)
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    rows = []
    for pol in a.policies.split(","):
        for k, tbt in enumerate((50.0, 100.0)):
            if pol == "chunked":
                m = chunked_sweep(tbt, a.window, hw)
                bm = m["best_mean"]
                extra = (f"best budget {m['budget']}; under a mean-gap criterion budget "
                         f"{bm['budget']}: {bm['rate_at_mean']:.2f} req/s" if bm else "")
            else:
                m = measure(pol, variants(pol, tbt), tbt, a.window, hw)
                extra = ""
            rows.append((pol, tbt, PAPER[pol][k], m))
            print(f"{pol:11s} TBT {tbt:5.0f} ms: {m['tok_s']:7.0f} prompt tok/s = "
                  f"{m['rate_at_mean']:5.2f} req/s at the mean prompt ({MEAN_PROMPT:.0f}) "
                  f"(paper {PAPER[pol][k]:.2f}); decode ITL p99/mean/max {m['p99_itl_ms']:.1f}/"
                  f"{m['mean_itl_ms']:.1f}/{m['max_itl_ms']:.1f} ms, "
                  f"{'meets' if m['meets_tbt'] else 'MISSES'} τ; {m['stalled']} decodes stalled, "
                  f"{m['preemptions']} preemptions in the run; {extra}", flush=True)
    print("\npolicy       TBT  req/s@mean  paper  ours/paper  p99 ITL (ms)")
    for label, tbt, paper, m in rows:
        print(f"{label:11s} {tbt:4.0f}  {m['rate_at_mean']:10.2f}  {paper:5.2f}"
              f"  {m['rate_at_mean'] / paper:10.2f}  {m['p99_itl_ms']:8.2f}"
              f"{'' if m['meets_tbt'] else '  (misses the TBT SLO)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
