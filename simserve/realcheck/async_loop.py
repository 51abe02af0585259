"""vLLM's asynchronous engine-core loop, replayed on a real run's own steps, to see what its
host calls do to the token times (and so to ITL) that simserve's step-by-step model misses.

    python -m simserve.realcheck.async_loop [RUN ...] [--fit llama-default]

With async scheduling (vLLM 0.22 `EngineCore.step_with_batch_queue`) one loop iteration
schedules step m (S), prepares and launches it (`execute_model`, host time L), then blocks
until step m-1's output is back and processes it (`update_from_output`, U); only then are
m-1's tokens sent. So

    out(m-1) = max(G(m-1), H(m) + S(m) + L(m)) + U,   H(m+1) = out(m-1),
    G(m) = max(G(m-1), H(m) + S(m)) + gpu(m)

where G is when the GPU finished a step. The launch L depends on how the step runs: a
decode-only batch replays one full CUDA graph (~1.2-1.6 ms), a mixed batch of <= 512 tokens
replays piecewise graphs with eager attention between them (~7-8 ms), a larger one runs eager
(~20-40 ms): measured per layer on the probe's `execute_model` calls. A long launch delays
the previous step's tokens, and a host-bound loop (many small admissions) sets the step
period; simserve today delivers each step's tokens when its forward ends.

For each run: engine-side P99 and mean ITL (gaps between a request's consecutive outputs
leaving the engine core), real (the probe's `update_from_output` times) against (a) back to
back steps priced by simserve (its model today) and (b) this loop with the fitted S, L, U,
both on the run's real step compositions. Fitted on `--fit` servers; the rest held out.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from simserve.realcheck.serve_data import load_run, run_dirs
from simserve.realcheck.serve_score import ROOT, engine_meta

GRAPH_MAX = 512      # vLLM 0.22's largest capture size on the H200 (probe meta-engine)
MODES = ("full", "piecewise", "eager")


def graph_mode(step) -> str:
    tok = sum(n for n, _ in step.reqs.values())
    if tok > GRAPH_MAX:
        return "eager"
    return "full" if step.kind == "decode" else "piecewise"


def _layers(model: str) -> int:
    from simserve.models import get_model
    return int(get_model(model).num_layers)


def fit_host_calls(server_dirs: list[str]) -> dict:
    """Median S, U (ms) and L per layer (ms) by graph mode over the servers' real steps."""
    from simserve.realcheck.step_diff import real_steps
    acc: dict = {m: {"L": [], "S": [], "U": []} for m in MODES}
    for sd in server_dirs:
        for d in run_dirs(os.path.dirname(sd)):
            if os.path.dirname(d) != sd or "mooncake" in d:
                continue
            run = load_run(d, os.path.join(os.path.dirname(sd), "plans"))
            steps, _ = real_steps(run, sd, True)
            nl = _layers(run.plan["model"])
            for s in steps:
                if s.launch_ms is None:
                    continue
                a = acc[graph_mode(s)]
                a["L"].append(s.launch_ms / nl)
                a["S"].append(s.sched_ms)
                a["U"].append(s.update_ms)
    return {m: {k: float(np.median(v)) for k, v in a.items() if v} for m, a in acc.items()}


def loop_outputs(steps, gpu_ms: np.ndarray, calls: dict, layers: int) -> np.ndarray:
    """When each step's tokens leave the engine core (ms after the first step's schedule),
    by the async loop above, from each step's GPU time and the fitted host calls. A step
    scheduled after the previous output was back (the engine idled) starts the recurrence
    again at its real schedule time."""
    n = len(steps)
    out = np.zeros(n)
    t0 = np.array([s.sched_t0 for s in steps]) * 1e3
    c = [calls[graph_mode(s)] for s in steps]
    G, H, prev = -np.inf, t0[0], False   # prev: a step is in flight, its output not yet sent
    for m in range(n):
        S, L, U = c[m]["S"], c[m]["L"] * layers, c[m]["U"]
        if prev and t0[m] > out[m - 1] + 5.0:   # the engine idled: m-1's output went at once
            out[m - 1] += c[m - 1]["U"]
            prev = False
        if not prev:
            H = max(H, t0[m])
        start = max(G, H + S)
        G = start + gpu_ms[m]
        if prev:   # launch m, then wait for m-1 and send its output
            out[m - 1] = max(out[m - 1], H + S + L) + U
            H = out[m - 1]
        else:      # nothing in flight: the next iteration starts right after the launch
            H = H + S + L
        out[m] = G
        prev = True
    out[-1] += c[-1]["U"]
    return out


def itl_ms(steps, out: np.ndarray) -> np.ndarray:
    """Every gap between consecutive sampled tokens of one request, pooled."""
    last: dict = {}
    gaps = []
    for m, s in enumerate(steps):
        for i, (k, c) in s.reqs.items():
            if c + k >= s.prompt[i]:            # this step sampled a token for i
                if i in last:
                    gaps.append(out[m] - last[i])
                last[i] = out[m]
    return np.asarray(gaps)


def compare_run(run_dir: str, calls: dict) -> dict | None:
    from simserve.realcheck.host_fit import batch_shape
    from simserve.realcheck.step_diff import _probe_row, real_steps, sim_steps
    run = load_run(run_dir, os.path.join(os.path.dirname(os.path.dirname(run_dir)), "plans"))
    sd = os.path.dirname(run_dir.rstrip("/"))
    meta = engine_meta(sd)
    if not meta["async_scheduling"]:
        return None
    steps, queued = real_steps(run, sd, True)
    if any(s.update_t0 is None for s in steps):
        return None                              # no host-call log for this server
    first = {}
    for m, s in enumerate(steps):
        for i in s.reqs:
            first.setdefault(i, m)
    eligible = np.array([first[i] for i in range(len(run.send))])
    _, _, cost = sim_steps(run, meta, eligible, queued)   # the engine's own cost model
    shapes = [batch_shape(_probe_row(s)) for s in steps]
    gpu = np.array([cost.forward_s(b) * 1e3 for b in shapes])
    step = np.array([cost.step_s(b) * 1e3 for b in shapes])
    real_out = np.array([s.update_t0 for s in steps]) * 1e3
    t0 = np.array([s.sched_t0 for s in steps]) * 1e3
    # (a) simserve today: back to back, each step's tokens out when it ends
    today = np.zeros(len(steps))
    t = t0[0]
    for m in range(len(steps)):
        t = max(t, t0[m] if m == 0 or t0[m] > today[m - 1] + 5.0 else t) + step[m]
        today[m] = t
    loop = loop_outputs(steps, gpu, calls, _layers(run.plan["model"]))
    r = {"server": run.server, "plan": run.name}
    for name, out in (("real", real_out), ("today", today), ("loop", loop)):
        g = itl_ms(steps, out)
        r[name] = {"p99_itl_ms": float(np.percentile(g, 99)), "mean_itl_ms": float(g.mean())}
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--fit", nargs="+", default=["llama-default"])
    a = ap.parse_args(argv)
    calls = fit_host_calls([os.path.join(a.root, s) for s in a.fit])
    for m, c in calls.items():
        print(f"fitted on {', '.join(a.fit)}: {m:9s} S {c['S']:.2f} ms, L {c['L']:.3f} ms/layer, "
              f"U {c['U']:.2f} ms")
    dirs = [os.path.join(a.root, r) for r in a.runs] if a.runs else run_dirs(a.root)
    print(f"{'server/plan':46s} {'P99 ITL real':>12s} {'today':>13s} {'loop':>13s}   "
          f"{'mean ITL real':>13s} {'today':>13s} {'loop':>13s}")
    errs = {"today": [], "loop": []}
    for d in dirs:
        if "mooncake" in d:
            continue
        r = compare_run(d, calls)
        if r is None:
            continue
        cells = []
        for k in ("p99_itl_ms", "mean_itl_ms"):
            x = r["real"][k]
            cells.append(f"{x:12.1f} " + " ".join(
                f"{r[w][k]:6.1f} {(r[w][k] - x) / x * 100:+5.0f}%" for w in ("today", "loop")))
        for w in errs:
            errs[w].append(abs(r[w]["p99_itl_ms"] - r["real"]["p99_itl_ms"]) / r["real"]["p99_itl_ms"])
        held = "" if r["server"] in a.fit else "  (held out)"
        print(f"{r['server'] + '/' + r['plan']:46s} {cells[0]}   {cells[1]}{held}", flush=True)
    for w, e in errs.items():
        e = np.asarray(e) * 100
        print(f"engine-side P99 ITL, {w}: mean |error| {e.mean():.1f} %, within 10 %: "
              f"{int((e <= 10).sum())} of {len(e)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
