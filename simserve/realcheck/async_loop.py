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

The runtime models this loop in `simserve.policies.vllm_loop.EngineLoop`; this replay drives
that very class on the real steps (their compositions, each priced by simserve's cost model,
and the real `schedule()` time of a step the engine ran from idle), so what it checks is the
code that runs. The fit files each real step under the same `launch_mode` the runtime uses,
with the server's own largest capture size (`probe/meta-engine-*`).

For each run: engine-side P99 and mean ITL (gaps between a request's consecutive outputs
leaving the engine core), real (the probe's `update_from_output` times) against (a) back to
back steps priced by simserve's cost model alone (no loop) and (b) `EngineLoop` with the
fitted host calls, both on the run's real step compositions. Fitted on `--fit` servers; the
rest held out.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from simserve.policies.vllm_loop import MODES, EngineLoop, calls_s, launch_mode
from simserve.realcheck.serve_data import load_run, run_dirs
from simserve.realcheck.serve_score import ROOT, engine_meta


def graph_max(meta: dict) -> int:
    """The server's largest CUDA-graph capture size (0 when it ran without graphs)."""
    if meta.get("cudagraph_mode", "FULL_AND_PIECEWISE") == "NONE":
        return 0
    return max(meta.get("cudagraph_capture_sizes") or [0])


def graph_mode(step, gmax: int) -> str:
    return launch_mode(sum(n for n, _ in step.reqs.values()), step.kind == "decode", gmax)


def _layers(model: str) -> int:
    from simserve.models import get_model
    return int(get_model(model).num_layers)


def fit_host_calls(server_dirs: list[str]) -> dict:
    """Median schedule, update (µs) and launch per layer (µs) by launch mode over the
    servers' real steps, as a profile's `host_calls`."""
    from simserve.realcheck.step_diff import real_steps
    acc: dict = {m: {"launch_us_per_layer": [], "schedule_us": [], "update_us": []}
                 for m in MODES}
    for sd in server_dirs:
        gmax = graph_max(engine_meta(sd))
        for d in run_dirs(os.path.dirname(sd)):
            if os.path.dirname(d) != sd or "mooncake" in d:
                continue
            run = load_run(d, os.path.join(os.path.dirname(sd), "plans"))
            steps, _ = real_steps(run, sd, True)
            nl = _layers(run.plan["model"])
            for s in steps:
                if s.launch_ms is None:
                    continue
                a = acc[graph_mode(s, gmax)]
                a["launch_us_per_layer"].append(s.launch_ms * 1e3 / nl)
                a["schedule_us"].append(s.sched_ms * 1e3)
                a["update_us"].append(s.update_ms * 1e3)
    return {m: {k: float(np.median(v)) for k, v in a.items() if v} for m, a in acc.items()}


class _StepOutputs:
    """Stands in for the request table in the replay: one entry per step, when its tokens
    leave the engine core (s)."""

    def __init__(self, n: int):
        self.out = np.zeros(n)
        self.retire_hold = None


class _Replay(EngineLoop):
    """`EngineLoop` whose delayed tokens are whole steps (ids are step indices)."""

    def shift(self, ids, to: float) -> None:
        out = self.table.out
        for m in ids:
            if out[m] < to:
                out[m] = to


def idle_before(steps) -> np.ndarray:
    """Did the engine have nothing to run before step m? No request of an earlier step was
    still unfinished, and m was scheduled after m-1's output came back."""
    n = len(steps)
    last: dict = {}
    for m, s in enumerate(steps):
        for i in s.reqs:
            last[i] = m
    idle = np.zeros(n, dtype=bool)
    seen_last = -1   # the last step of any request seen so far
    for m, s in enumerate(steps):
        prev = steps[m - 1].update_t0 if m else None
        idle[m] = m == 0 or (seen_last < m and (prev is None or s.sched_t0 >= prev))
        for i in s.reqs:
            seen_last = max(seen_last, last[i])
    return idle


def loop_outputs(steps, shapes, gpu_s: np.ndarray, calls: dict, layers: int,
                 gmax: int) -> np.ndarray:
    """When each step's tokens leave the engine core (s), by `EngineLoop` with the host
    calls `calls` (a profile's `host_calls`), from each step's GPU time; a step the engine
    ran from idle starts at its real `schedule()` time."""
    n = len(steps)
    table = _StepOutputs(n)
    loop = _Replay(table, calls_s(calls), gmax, layers)
    idle = idle_before(steps)
    clock = -np.inf     # when the GPU is free
    for m in range(n):
        if idle[m]:
            loop.idle(steps[m].sched_t0)
            clock = max(clock, steps[m].sched_t0)
        start = loop.decode_start(clock)
        if loop.mode(shapes[m]) == "full":
            loop.decoded(start)
        else:
            start = loop.host_step(shapes[m], start)
        clock = table.out[m] = start + gpu_s[m]
        loop.applied([m], clock)
    return table.out


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
    first: dict = {}
    for m, s in enumerate(steps):
        for i in s.reqs:
            first.setdefault(i, m)
    eligible = np.array([first[i] for i in range(len(run.send))])
    _, _, cost = sim_steps(run, meta, eligible, queued)   # the engine's own cost model
    shapes = [batch_shape(_probe_row(s)) for s in steps]
    gpu = np.array([cost.forward_s(b) for b in shapes])
    step = np.array([cost.step_s(b) for b in shapes])
    real_out = np.array([s.update_t0 for s in steps])
    # (a) the cost model alone: back to back, each step's tokens out when it ends
    idle = idle_before(steps)
    today = np.zeros(len(steps))
    t = -np.inf
    for m in range(len(steps)):
        t = (max(t, steps[m].sched_t0) if idle[m] else t) + step[m]
        today[m] = t
    loop = loop_outputs(steps, shapes, gpu, calls, _layers(run.plan["model"]), graph_max(meta))
    r: dict = {"server": run.server, "plan": run.name}
    for name, out in (("real", real_out), ("today", today), ("loop", loop)):
        g = itl_ms(steps, out * 1e3)
        r[name] = {"p99_itl_ms": float(np.percentile(g, 99)), "mean_itl_ms": float(g.mean())}
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--fit", nargs="+", default=["llama-default"],
                    help="servers to fit the host calls on (the rest are held out)")
    ap.add_argument("--refit", action="store_true",
                    help="replay with this fit instead of the h200-sxm profile's host calls "
                         "(what the runtime uses)")
    a = ap.parse_args(argv)
    from simserve.cost.host import engine_host
    from simserve.hardware.profile import load_profile
    fit = fit_host_calls([os.path.join(a.root, s) for s in a.fit])
    host = engine_host(load_profile("h200-sxm"), "vllm")
    prof: dict = (host.host_calls if host is not None else None) or fit
    for m in MODES:
        f, p = fit[m], prof[m]
        print(f"{m:9s} fitted on {', '.join(a.fit)}: S {f['schedule_us']:4.0f} µs, "
              f"L {f['launch_us_per_layer']:4.0f} µs/layer, U {f['update_us']:4.0f} µs; "
              f"profile: S {p['schedule_us']:4.0f}, L {p['launch_us_per_layer']:4.0f}, "
              f"U {p['update_us']:4.0f}")
    calls = fit if a.refit else prof
    print(f"replayed with the {'fitted' if a.refit else 'profile'}'s host calls")
    dirs = [os.path.join(a.root, r) for r in a.runs] if a.runs else run_dirs(a.root)
    print(f"{'server/plan':46s} {'P99 ITL real':>12s} {'today':>13s} {'loop':>13s}   "
          f"{'mean ITL real':>13s} {'today':>13s} {'loop':>13s}")
    errs: dict = {"today": [], "loop": []}
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
    for w, el in errs.items():
        e = np.asarray(el) * 100
        print(f"engine-side P99 ITL, {w}: mean |error| {e.mean():.1f} %, within 10 %: "
              f"{int((e <= 10).sum())} of {len(e)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
