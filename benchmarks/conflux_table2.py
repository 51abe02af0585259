"""ConfluxServe Table 2: prefill throughput (req/s) under a decode TBT SLO with 96 ongoing
decodes, 4×H100, Qwen3-14B, prefill degree 4; ours beside the paper's.

    python benchmarks/conflux_table2.py [--window 15] [--criterion deadline|p99]
        [--policies loongserve,loongserve-capped,chunked,muxwise,conflux]

Setting (paper §3.3 with the decode load of §8.3): 96 background decodes with 8K-token contexts
(24 per GPU, as in Fig. 13/14b) run throughout; a backlog of Mooncake-Toolagent-shaped prompts
(synthetic lengths matched to Table 3; prefill only, one output token, so the decode count stays
96) is released once every background request is decoding. Every design is simulated on this
same workload with its own policy (at main 8821cc1 chunked prefill and MuxWise were priced in
steady state at the median prompt instead, `conflux_table2_baselines.py`).

Throughput: prompt tokens of the backlog prompts completed by the last completion inside the
`window` seconds after the release, over the time to that completion (no quantisation to whole
prompts in the window), reported in req/s at the workload's mean prompt so the designs compare.

The TBT SLO, one criterion for all designs (`--criterion`):
- `deadline` (default): the paper's SLO metric (§8.1, the i-th token due at a fixed pace of one
  TBT per token) applied to the running decodes from the window start: the k-th token of a
  decode in the window is due at start + k·τ; the SLO holds if >= 95 % of the decodes keep that
  pace (slack banked by fast iterations pays for slow ones);
- `p99`: the 99th percentile of the decodes' inter-token gaps in the window is at most τ and no
  decode stalls (a gap over 10 τ: preempted when KV runs out). Stricter for a fixed chunk
  budget, whose long-context chunks set the tail.
Each design meets it its own way:
- `conflux` (ConfluxServe-FCFS) dispatches against τ with the paper's estimator;
  `conflux-oracle` with the estimator that reads the cost model, minus its calibrated margin;
- `chunked` (vLLM chunked prefill, TP4): the paper sweeps the token budget and reports the best
  configuration; here budgets 256–8192 in steps of 128, the highest throughput meeting the
  criterion (the best by the other criterion is printed too);
- `muxwise` (TP4): its TBT-aware SM split (decode gets the fewest SMs meeting τ);
- `loongserve`: LoongServe as released (whole prompts, 10 decode iterations between prefill
  batches, no TBT control) with Fig. 6's configuration (prefill pinned at SP4, decode SP1). It
  cannot keep a TBT by itself, so, as the paper did ("progressively increasing the offered
  prefill load"), prompts arrive as a Poisson stream and the highest rate meeting the
  criterion is found by bisection;
- `loongserve-capped` (ours, not LoongServe): one prefill iteration per decode iteration, each
  capped so that it plus one decode step fit τ; the most favourable TBT-aware reading, and the
  one that reproduces the paper's LoongServe numbers.
Both LoongServe rows are marked "simplified": simserve's LoongServe runs one SP group per
iteration, with no elastic scale-up during decode, no multi-master decode and no KV spread over
instances (what its paper describes).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.run import simulate_point
from simserve.workload.spec import Workload
from simserve.workload.synthetic import synthetic_workload

PAPER = {  # Table 2 (req/s); column order as in Fig. 6, policies.md §9
    "loongserve": (2.41, 5.17), "chunked": (4.17, 5.92), "muxwise": (4.38, 5.43),
    "conflux": (6.15, 8.27)}
NUM_DECODES, DECODE_CTX = 96, 8192
MODEL = "qwen3-14b"
CRITERIA = ("deadline", "p99")
PROBE_OUT = 4000  # background output while finding the start (longer than the warm-up)
CHUNKED_BUDGETS = range(256, 8193, 128)
# mean prompt of the (capped) Toolagent-shaped distribution, from a large sample: turns a token
# throughput into req/s without the noise of which prompts happen to land in the window
MEAN_PROMPT = float(np.minimum(synthetic_workload("synthetic-mooncake-toolagent", 200_000, 1)
                               .prompt_tokens, 32767).mean())


def workload(start_s: float, backlog: int, decode_out: int, seed: int = 0,
             rate: float | None = None) -> Workload:
    """96 background decodes from t = 0, then `backlog` Toolagent-shaped prompts (one output
    token each): all at `start_s`, or Poisson from `start_s` at `rate` per second."""
    p = synthetic_workload("synthetic-mooncake-toolagent", backlog, seed).prompt_tokens
    p = np.minimum(p, 32768 - 1)
    if rate is None:
        at = np.full(backlog, start_s)
    else:
        gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, backlog)
        at = start_s + np.cumsum(gaps) - gaps[0]
    arrival = np.concatenate([np.zeros(NUM_DECODES), at])
    prompt = np.concatenate([np.full(NUM_DECODES, DECODE_CTX), p])
    output = np.concatenate([np.full(NUM_DECODES, decode_out), np.ones(backlog, dtype=np.int64)])
    return Workload(arrival, prompt.astype(np.int64), output.astype(np.int64), name="table2")


def deadline_attainment(token_times: list[np.ndarray], start: float, end: float,
                        tau: float) -> float:
    """The paper's SLO metric (§8.1: the i-th token is due at a fixed pace of one TBT per token)
    applied to decodes already running: from the window start, a decode's k-th token is due at
    start + k·τ. A decode complies if every token in the window is on time and it is not behind
    that pace at the window's end. The fraction of decodes that comply."""
    ok = 0
    for tt in token_times:
        tt = tt[(tt > start) & (tt <= end)]
        due = start + tau * np.arange(1, len(tt) + 1) * (1 + 1e-12)
        ok += bool(np.all(tt <= due) and end - start <= tau * (len(tt) + 1) * (1 + 1e-12))
    return ok / len(token_times)


def measure(policy: str, params: dict, tbt_ms: float, window: float, hw,
            rate: float | None = None, criterion: str = "deadline") -> dict:
    """One run: the background decodes, then prompts (a backlog, or Poisson at `rate`) from
    the start of a `window`-second measurement. `meets_tbt` by `criterion`: "deadline" (the
    paper's per-token deadlines, >= 95 % of the decodes comply) or "p99" (the p99 gap <= τ)."""
    if criterion not in CRITERIA:
        raise SystemExit(f"--criterion: expected one of {', '.join(CRITERIA)}, got {criterion!r}")
    # phase 1: when is every background request decoding (prefilled)? Same background as
    # phase 2 up to that time (no background request finishes before it in either run).
    probe = simulate_point(workload(1e6, 1, PROBE_OUT), MODEL, hw, policy, **params)
    start = float(np.nanmax(probe.records.first_token_s[:NUM_DECODES])) + 0.5
    backlog = int(14 * window) + 50 if rate is None else int(rate * (window + 5)) + 20
    out = max(PROBE_OUT, int((start + window) / 0.015) + 200)
    w = workload(start, backlog, decode_out=out, rate=rate)
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
    att = deadline_attainment([rec.token_times(i) for i in range(NUM_DECODES)], start, end,
                              tbt_ms * 1e-3)
    meets = {"p99": bool(p99 <= tbt_ms * (1 + 1e-9) and stalled == 0),
             "deadline": att >= 0.95}
    return {"rate": int(inside.sum()) / window, "tok_s": tok_s, "rate_at_mean": tok_s / MEAN_PROMPT,
            "p99_itl_ms": p99, "mean_itl_ms": float(g.mean()) if len(g) else np.nan,
            "max_itl_ms": float(g.max()) if len(g) else np.nan,
            "stalled": stalled, "deadline_attainment": att, "meets": meets,
            "meets_tbt": meets[criterion], "offered_rate": rate,
            "decoding": int((rec.finish_s[:NUM_DECODES] > start + window).sum()),
            "wall_s": wall, "requests": w.num_requests, "start_s": start,
            "backlog_left": int((ft > start + window).sum()),
            "preemptions": int(res.stats["num_preemptions"])}


def chunked_sweep(tbt_ms: float, window: float, hw, budgets=CHUNKED_BUDGETS,
                  criterion: str = "deadline") -> dict:
    """The paper's budget sweep: every budget until the runs are clearly over τ (mean gap over
    1.2 τ and p99 gap over 1.5 τ); the best run meeting `criterion`, with `budget`, and
    `best_other` (the best under the other criterion)."""
    runs = []
    for b in budgets:
        m = measure("chunked", dict(max_num_batched_tokens=b), tbt_ms, window, hw,
                    criterion=criterion)
        m["budget"] = b
        runs.append(m)
        if m["p99_itl_ms"] > 1.5 * tbt_ms and m["mean_itl_ms"] > 1.2 * tbt_ms:
            break
    ok = [m for m in runs if m["meets_tbt"]]
    best = max(ok, key=lambda m: m["tok_s"]) if ok else dict(runs[0], tok_s=0.0, rate_at_mean=0.0)
    other = next(c for c in CRITERIA if c != criterion)
    ok_other = [m for m in runs if m["meets"][other]]
    best["best_other"] = max(ok_other, key=lambda m: m["tok_s"]) if ok_other else None
    best["sweep"] = [(m["budget"], m["rate_at_mean"], m["p99_itl_ms"], m["mean_itl_ms"])
                     for m in runs]
    return best


def load_search(policy: str, params: dict, tbt_ms: float, window: float, hw,
                criterion: str = "deadline", steps: int = 7) -> dict:
    """For a design without TBT control of its own (LoongServe as released): the paper's
    procedure, "progressively increasing the offered prefill load": a backlog if it already
    meets the criterion, else the highest Poisson prompt rate meeting it (bisection between
    0 and the backlog's completion rate)."""
    top = measure(policy, params, tbt_ms, window, hw, criterion=criterion)
    if top["meets_tbt"]:
        return top
    lo, hi, best = 0.0, max(top["rate"], 0.5), None
    for _ in range(steps):
        mid = (lo + hi) / 2
        m = measure(policy, params, tbt_ms, window, hw, rate=mid, criterion=criterion)
        if m["meets_tbt"]:
            lo = mid
            if best is None or m["tok_s"] > best["tok_s"]:
                best = m
        else:
            hi = mid
    return best or dict(top, tok_s=0.0, rate_at_mean=0.0)


def variants(pol: str, tbt: float) -> dict:
    if pol == "conflux":    # the paper's estimator (the default since 2026-12-01)
        return dict(scheduler="fcfs", tbt_ms=tbt)
    if pol == "conflux-oracle":  # the estimator reading the cost model, with its margin
        return dict(scheduler="fcfs", tbt_ms=tbt, estimator="oracle")
    if pol == "loongserve":  # as released (whole prompts, no TBT control), Fig. 6's SP4 prefill
        return dict(scheduler="fcfs", prefill_sp=4)
    if pol == "loongserve-capped":  # ours: each prefill iteration + one decode step fit τ
        return dict(scheduler="fcfs", tbt_ms=tbt, max_wait_tokens=1, prefill_sp=4)
    if pol == "muxwise":
        return dict(tbt_ms=tbt)
    raise SystemExit(f"--policies: unknown {pol!r} "
                     f"(conflux, conflux-oracle, loongserve, loongserve-capped, chunked, "
                     "muxwise)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=15.0,
                    help="measurement window (s); past ~20 s the background decodes' growing KV "
                         "starts to preempt some of them under LoongServe at 50 ms")
    ap.add_argument("--policies", default="loongserve,loongserve-capped,chunked,muxwise,conflux")
    ap.add_argument("--criterion", default="deadline", choices=CRITERIA,
                    help="deadline: the paper's per-token deadlines (>= 95 %% of the decodes on "
                         "pace); p99: the p99 decode gap within τ")
    a = ap.parse_args(argv)
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    rows = []
    for pol in a.policies.split(","):
        base = pol.split("-")[0]
        for k, tbt in enumerate((50.0, 100.0)):
            if pol == "chunked":
                m = chunked_sweep(tbt, a.window, hw, criterion=a.criterion)
                bo = m["best_other"]
                extra = (f"best budget {m['budget']}; by the other criterion budget "
                         f"{bo['budget']}: {bo['rate_at_mean']:.2f} req/s" if bo else "")
            elif pol == "loongserve":
                m = load_search(pol, variants(pol, tbt), tbt, a.window, hw, a.criterion)
                extra = f"offered {m['offered_rate'] or 'backlog'} req/s"
            else:
                m = measure(base, variants(pol, tbt), tbt, a.window, hw, criterion=a.criterion)
                extra = ""
            extra += f"; deadline attainment {m['deadline_attainment']:.3f}"
            rows.append((pol, tbt, PAPER[base][k], m))
            print(f"{pol:18s} TBT {tbt:5.0f} ms: {m['tok_s']:7.0f} prompt tok/s = "
                  f"{m['rate_at_mean']:5.2f} req/s at the mean prompt ({MEAN_PROMPT:.0f}) "
                  f"(paper {PAPER[base][k]:.2f}); decode ITL p99/mean/max {m['p99_itl_ms']:.1f}/"
                  f"{m['mean_itl_ms']:.1f}/{m['max_itl_ms']:.1f} ms, "
                  f"{'meets' if m['meets_tbt'] else 'MISSES'} τ; {m['stalled']} decodes stalled, "
                  f"{m['preemptions']} preemptions in the run; {extra}", flush=True)
    print(f"\ncriterion: {a.criterion}")
    print("policy             TBT  req/s@mean  paper  ours/paper  p99 ITL (ms)")
    # (LoongServe "simplified": one SP group per iteration, no elastic scale-up, no
    # multi-master decode; see the module docstring)
    for label, tbt, paper, m in rows:
        label = f"{label} (simplified)" if label.startswith("loongserve") else label
        print(f"{label:18s} {tbt:4.0f}  {m['rate_at_mean']:10.2f}  {paper:5.2f}"
              f"  {m['rate_at_mean'] / paper:10.2f}  {m['p99_itl_ms']:8.2f}"
              f"{'' if m['meets_tbt'] else '  (misses the TBT SLO)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
