"""Step-by-step comparison of simserve's vLLM engine with the real engine's own step log.

    python -m simserve.realcheck.step_diff RUN [RUN ...] [--arrivals engine|client]
        [--out-dir DIR] [--summary FILE]

RUN is a measured run folder (`validation/vllm-h200/<server>/<plan>`) or `<server>/<plan>`;
`all` means every run under `validation/vllm-h200`.

The probe inside the real engine core logged every step it scheduled: which requests, how
many tokens each, how many each had computed, the GPU time between CUDA events around the
forward and sampling, and when `schedule()` was called (`<server>/probe/batches-*`). vLLM's
own per-request timestamps (`requests-*`) name each request (`cmpl-<plan>-<i>-0`) and say
when it reached the engine core's queue (`queued`) and when it was first scheduled; the
probe's request numbers are the order of first scheduling, so the two join exactly (checked
by prompt length).

simserve's `vllm` engine replays the run with the real per-request lengths and either
- `--arrivals engine` (default): locked to the real steps, with no front end: each request
  joins the engine's waiting queue just before the step the real engine could first have
  run it (the first `schedule()` after vLLM queued it), in vLLM's queue order; the
  scheduler's own decisions (budget, chunking, KV, FCFS) against the real scheduler's; or
- `--arrivals client`: the client's send times through simserve's API-server front end
  (what `serve_score` replays).
It steps one by one (`leap: false`, byte-identical to leaping) and every scheduled batch is
recorded. Reported:
- the first step whose scheduled set differs: requests only one side ran, and requests both
  ran with different token counts (P = prefill chunk, D = decode);
- how late each request joined: steps past the first it could join (`engine`), or ms from
  the client's send to its first step (`client`: the front end and async scheduling's
  one-step admission lag); and how many steps it took to its first token;
- each real step priced by simserve's cost model on its real composition: GPU time against
  the CUDA-event interval, and the step period (host and GPU combined) against the interval
  between `schedule()` calls where the engine ran back to back; mixed (prefill chunks and
  decodes), decode-only and prefill-only steps apart: mean and P99 |error| and the bias
  (mean signed error), in %. These do not depend on the two schedules staying aligned.
"""
from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from simserve.realcheck.serve_data import load_run, run_dirs
from simserve.realcheck.serve_score import ROOT, engine_meta, engine_params, run_workload

KINDS = ("mixed", "decode", "prefill")


@dataclass
class Step:
    """One scheduled engine step: {plan request index: (tokens, computed before)}."""
    t0: float                     # when it started to run (s after the run's origin)
    reqs: dict
    prompt: dict                  # plan index -> prompt tokens
    gpu_ms: float | None = None
    period_ms: float | None = None
    update_t0: float | None = None   # when the engine core got its output back
    sched_t0: float | None = None    # when schedule() was called for it
    sched_ms: float | None = None    # host time of schedule(), execute_model (prepare and
    launch_ms: float | None = None   # launch) and update_from_output, where logged
    update_ms: float | None = None
    shape: object = field(default=None, repr=False)

    def kind_of(self, i: int) -> str:
        n, c = self.reqs[i]
        return "D" if n == 1 and c >= self.prompt[i] else "P"

    @property
    def kind(self) -> str:
        ks = {self.kind_of(i) for i in self.reqs}
        return "mixed" if len(ks) == 2 else ("decode" if ks == {"D"} else "prefill")


# -- the real engine's log ------------------------------------------------------------------
_PROBE: dict = {}


def _probe(server_dir: str):
    """(batches by number, {vLLM request id: (probe number, its vLLM stats)}) of one server."""
    if server_dir in _PROBE:
        return _PROBE[server_dir]
    rows = lambda kind: [json.loads(x) for f in sorted(glob.glob(
        os.path.join(server_dir, "probe", f"{kind}-*.jsonl.xz"))) for x in lzma.open(f, "rt")]
    batches = sorted(rows("batches"), key=lambda r: r["batch"])
    for c in rows("calls"):        # the host calls of each step (async-on servers)
        if 0 <= c["batch"] < len(batches):
            if c["call"] == "update_from_output":
                batches[c["batch"]]["update_t0"] = c["t0"]
                batches[c["batch"]]["update_ms"] = (c["t1"] - c["t0"]) * 1e3
            elif c["call"] == "execute_model":
                batches[c["batch"]]["launch_ms"] = (c["t1"] - c["t0"]) * 1e3
    if not batches or [r["batch"] for r in batches] != list(range(len(batches))):
        raise ValueError(f"{server_dir}/probe: batches missing or not numbered 0..n-1")
    first: list[tuple[int, int]] = []           # probe number -> (batch, prompt length)
    for r in batches:
        for i, pl in zip(r["ids"], r["prompt_len"]):
            if i == len(first):
                first.append((r["batch"], pl))
    reqs = sorted(rows("requests"), key=lambda q: (q["scheduled"], q["queued"]))
    if len(reqs) != len(first):
        raise ValueError(f"{server_dir}/probe: {len(reqs)} finished requests, "
                         f"{len(first)} scheduled")
    by_id = {}
    for k, q in enumerate(reqs):   # probe numbers are the order of first scheduling
        if first[k][1] != q["prompt"]:
            raise ValueError(f"{server_dir}/probe: request {q['id']} does not join the step "
                             f"log (prompt {q['prompt']} against {first[k][1]})")
        by_id[q["id"]] = (k, q)
    _PROBE[server_dir] = (batches, by_id)
    return _PROBE[server_dir]


def vllm_id(plan: str, i: int) -> str:
    return f"cmpl-{plan.replace('.', '_')}-{i}-0"


def real_steps(run, server_dir: str, async_scheduling: bool):
    """The run's real steps and each request's engine arrival (s after the run's origin)."""
    batches, by_id = _probe(server_dir)
    sid, queued = {}, np.zeros(len(run.send))
    for i in range(len(run.send)):
        k, q = by_id[vllm_id(run.name, i)]
        sid[k] = i
        queued[i] = q["queued"] - run.origin
    mine = [b for b in batches if any(k in sid for k in b["ids"])]
    lo, hi = mine[0]["batch"], mine[-1]["batch"]
    steps = []
    for b in batches[lo:hi + 1]:
        if b["tokens"] == 0:
            continue
        comp = {k: c for k, _, c in b["new"]}
        comp.update(zip(b["cached_ids"], b["cached_computed"]))
        reqs = {sid[k]: (n, comp.get(k, 0)) for k, n in zip(b["ids"], b["n"])}
        prompt = {sid[k]: pl for k, pl in zip(b["ids"], b["prompt_len"])}
        steps.append(Step(b["t0"] - run.origin, reqs, prompt, b.get("gpu_ms")))
        u = b.get("update_t0")
        steps[-1].update_t0 = None if u is None else u - run.origin
        steps[-1].launch_ms, steps[-1].update_ms = b.get("launch_ms"), b.get("update_ms")
        steps[-1].sched_ms = (b["t1"] - b["t0"]) * 1e3
    # the step period: without async scheduling, schedule() to the next schedule(); with it,
    # the engine core launches step m and then waits for m-1, so m ran from when m-1's
    # output came back (or m was scheduled, if later) to when its own came back
    for m in range(len(steps) - 1):
        g = steps[m].gpu_ms
        if async_scheduling:
            end, prev = steps[m].update_t0, steps[m - 1].update_t0 if m else None
            if end is not None and prev is not None:
                steps[m].period_ms = (end - max(prev, steps[m].t0)) * 1e3
            elif m and m + 2 < len(steps) and g is not None and steps[m - 1].gpu_ms:
                # no host-call log: m+1 is scheduled when m-1's output is back and m+2 when
                # m's is, where m+1 had to wait for m-1 (the engine ran back to back)
                if steps[m + 1].t0 - steps[m].t0 >= 0.5 * steps[m - 1].gpu_ms * 1e-3:
                    p = (steps[m + 2].t0 - steps[m + 1].t0) * 1e3
                    if p <= 3 * g + 20:
                        steps[m].period_ms = p
        else:
            p = (steps[m + 1].t0 - steps[m].t0) * 1e3
            if g is not None and p <= 3 * g + 20:   # else the engine idled in between
                steps[m].period_ms = p
    # when each step started to run: with async scheduling, step m is scheduled while m-1
    # runs, so it starts when m-1's output is back (if it was scheduled before that)
    for m, st in enumerate(steps):
        st.sched_t0 = st.t0
        if async_scheduling and m and steps[m - 1].update_t0 is not None:
            st.t0 = max(st.t0, steps[m - 1].update_t0)
    return steps, queued


# -- simserve's engine --------------------------------------------------------------------
@contextmanager
def _recording(out: list, reached: dict, eligible: dict | None):
    """Record every batch the vLLM scheduler schedules, and when each request reaches its
    engine's waiting queue, for the `with` block (class attributes restored after). It hooks
    the scheduler's `schedule` and `on_step_done`, and the runtime's intake (`reach`, and
    `enqueue` when locked).

    With `eligible` ({simulated request: step index}) the replay is locked to the real
    steps: there is no front end, and a request joins the waiting queue just before the
    engine schedules step `eligible[r]` (the first real step scheduled after vLLM queued it),
    or at once when the engine would otherwise idle; its time of arrival plays no part."""
    from simserve.cost.host import EngineHost
    from simserve.policies.vllm import VllmScheduler
    from simserve.policies.vllm_intake import Intake
    sched, done = VllmScheduler.schedule, VllmScheduler.on_step_done
    enqueue, reach = Intake.enqueue, Intake.reach
    make_fe = EngineHost.make_frontend
    held: list = []

    def release(s, upto: float) -> None:
        while held and eligible[held[0]] <= upto:
            r = held.pop(0)
            s.arrive(r)
            s.intake.reached[r] = -1.0    # seen by the step about to be scheduled
            reached[r] = s.clock

    def schedule(self, s):
        if eligible is not None:
            release(s, len(out))
        ids, n = sched(self, s)
        if len(ids):
            il = [int(x) for x in ids]
            t = s.table
            out.append((s.clock, il, [int(x) for x in n], [int(t.computed[r]) for r in il]))
        return ids, n

    def on_step_done(self, s, batch):
        done(self, s, batch)
        if eligible is not None and held and not s.running and not s.waiting:
            release(s, eligible[held[0]])   # the real engine had steps the replay lacks

    def reach_(self, rid):
        reached[int(rid)] = self.ctx.env.now
        return reach(self, rid)

    def enqueue_(self, rid):
        held.append(int(rid))
        s = self.engine
        if not s.running and not s.waiting:
            release(s, float("inf") if eligible[held[0]] > len(out) else len(out))

    VllmScheduler.schedule, VllmScheduler.on_step_done = schedule, on_step_done
    if eligible is None:
        Intake.reach = reach_
    else:
        Intake.enqueue = enqueue_
        EngineHost.make_frontend = lambda self: None
    try:
        yield
    finally:
        VllmScheduler.schedule, VllmScheduler.on_step_done = sched, done
        Intake.enqueue, Intake.reach = enqueue, reach
        EngineHost.make_frontend = make_fe


def sim_steps(run, meta: dict, eligible: np.ndarray | None, queued: np.ndarray | None = None):
    """simserve's steps for `run` (request indices as in the plan), each request's arrival
    at the engine's queue, and the engine's cost model. `eligible` (per plan request, the
    real step it could first join) locks the replay to the real steps; None replays the
    client's sends through simserve's front end, as `serve_score` does."""
    from simserve.hardware.setup import HardwareConfig
    from simserve.run import simulate_point
    closed = eligible is None and run.max_concurrency
    if eligible is not None:   # FCFS in vLLM's queue order; times play no part
        t = np.zeros(len(queued))
        order = np.argsort(queued, kind="stable")
    elif closed:
        t = np.array([r["t"] for r in run.plan["requests"]], dtype=np.float64)
    else:
        t = run.send
    if eligible is None:
        order = np.argsort(t, kind="stable")
    w = run_workload(run, t, order, run.max_concurrency if closed else None)
    params = dict(engine_params(meta), async_scheduling=meta["async_scheduling"],
                  engine="vllm", leap=False)
    costs: list = []

    def hook(c):
        costs.append(c)
        return c
    raw: list = []
    reached: dict = {}
    el = None if eligible is None else {r: int(eligible[order[r]]) for r in range(len(order))}
    with _recording(raw, reached, el):
        simulate_point(w, run.plan["model"], HardwareConfig(gpu="h200-sxm"), "vllm",
                       gpu_cost_hook=hook, **params)
    prompt = {int(order[r]): int(run.prompt[order[r]]) for r in range(len(order))}
    steps = [Step(clock, {int(order[r]): (k, c) for r, k, c in zip(ids, n, comp)}, prompt)
             for clock, ids, n, comp in raw]
    arr = np.zeros(len(order))
    for r, t_r in reached.items():
        arr[order[r]] = t_r
    return steps, arr, costs[0]


# -- comparing ------------------------------------------------------------------------------
def first_divergence(real: list[Step], sim: list[Step]) -> dict | None:
    """The first step index whose scheduled sets differ, and how."""
    for m, (a, b) in enumerate(zip(real, sim)):
        if a.reqs == b.reqs:
            continue
        fmt = lambda s, i: f"{i}:{s.reqs[i][0]}{s.kind_of(i)}"
        return {"step": m, "real_t_ms": a.t0 * 1e3, "sim_t_ms": b.t0 * 1e3,
                "real_only": [fmt(a, i) for i in sorted(a.reqs.keys() - b.reqs.keys())],
                "sim_only": [fmt(b, i) for i in sorted(b.reqs.keys() - a.reqs.keys())],
                "tokens_differ": [f"{i}:{a.reqs[i][0]}{a.kind_of(i)}->{b.reqs[i][0]}{b.kind_of(i)}"
                                  for i in sorted(a.reqs.keys() & b.reqs.keys())
                                  if a.reqs[i] != b.reqs[i]],
                "real_kind": a.kind, "sim_kind": b.kind}
    if len(real) != len(sim):
        return {"step": min(len(real), len(sim)), "real_only": [], "sim_only": [],
                "tokens_differ": [], "note": "one side ran more steps"}
    return None


def first_steps(steps: list[Step], n: int):
    """Per request: the index and time of its first step, and the index of the step that
    completed its prompt (its first token)."""
    first, t0, last = np.full(n, -1), np.full(n, np.nan), np.full(n, -1)
    for m, s in enumerate(steps):
        for i, (k, c) in s.reqs.items():
            if first[i] < 0:
                first[i], t0[i] = m, s.t0
            if last[i] < 0 and c < s.prompt[i] <= c + k:
                last[i] = m
    return first, t0, last


def _errs(pred: np.ndarray, real: np.ndarray) -> dict:
    e = (pred - real) / real * 100
    if len(e) == 0:
        return {"n": 0}
    return {"n": len(e), "mean_abs_pct": float(np.mean(np.abs(e))),
            "p99_abs_pct": float(np.percentile(np.abs(e), 99)), "bias_pct": float(np.mean(e)),
            "real_mean_ms": float(np.mean(real)), "pred_mean_ms": float(np.mean(pred))}


def step_time_errors(steps: list[Step], cost) -> dict:
    """Each real step priced by `cost` on its real composition, per kind."""
    from simserve.realcheck.host_fit import batch_shape
    out = {}
    rows = {k: ([], [], [], []) for k in KINDS}
    for s in steps:
        if s.gpu_ms is None:
            continue
        r = _probe_row(s)
        b = batch_shape(r)
        g, p, pr, pp = rows[s.kind]
        g.append(s.gpu_ms)
        p.append(cost.forward_s(b) * 1e3)
        if s.period_ms is not None:
            pr.append(s.period_ms)
            pp.append(cost.step_s(b) * 1e3)
    for k, (g, p, pr, pp) in rows.items():
        out[k] = {"gpu": _errs(np.asarray(p), np.asarray(g)),
                  "period": _errs(np.asarray(pp), np.asarray(pr))}
    return out


def _probe_row(s: Step) -> dict:
    """A step as the probe's row (what `host_fit.batch_shape` reads)."""
    ids = list(s.reqs)
    return {"tokens": sum(n for n, _ in s.reqs.values()), "new": [], "ids": ids,
            "cached_ids": ids, "cached_computed": [s.reqs[i][1] for i in ids],
            "n": [s.reqs[i][0] for i in ids], "prompt_len": [s.prompt[i] for i in ids]}


def diff_run(run_dir: str, arrivals: str = "engine") -> dict:
    run = load_run(run_dir, os.path.join(os.path.dirname(os.path.dirname(run_dir)), "plans"))
    server_dir = os.path.dirname(run_dir.rstrip("/"))
    meta = engine_meta(server_dir)
    real, queued = real_steps(run, server_dir, meta["async_scheduling"])
    # the first real step each request could join: vLLM queues a request just before the
    # engine core's next schedule() (its input queue is drained between steps)
    n = len(run.send)
    fr, tr, lr = first_steps(real, n)
    eligible = np.minimum(np.searchsorted(np.array([s.sched_t0 for s in real]), queued), fr)
    sim, _, cost = sim_steps(run, meta, eligible if arrivals == "engine" else None, queued)
    fs, ts, ls = first_steps(sim, n)
    kinds = lambda ss: {k: sum(s.kind == k for s in ss) for k in KINDS}
    d = {"server": run.server, "plan": run.name, "arrivals": arrivals, "requests": n,
         "steps": {"real": len(real), "sim": len(sim)},
         "kinds": {"real": kinds(real), "sim": kinds(sim)},
         "first_divergence": first_divergence(real, sim),
         "steps_to_first_token": {"real": float(np.mean(lr - fr)), "sim": float(np.mean(ls - fs))},
         "step_time": step_time_errors(real, cost)}
    if arrivals == "engine":   # steps a request waited in the queue past the first it could join
        d["join"] = {"unit": "steps", "real": float(np.mean(fr - eligible)),
                     "sim": float(np.mean(fs - eligible))}
    else:                      # client send to the first step that ran it
        d["join"] = {"unit": "ms", "real": float(np.mean(tr - run.send) * 1e3),
                     "sim": float(np.mean(ts - run.send) * 1e3)}
    return d


def format_report(d: dict) -> str:
    out = [f"{d['server']}/{d['plan']}: {d['requests']} requests, arrivals = {d['arrivals']}",
           f"  steps real {d['steps']['real']}, sim {d['steps']['sim']}; by kind real "
           f"{d['kinds']['real']}, sim {d['kinds']['sim']}"]
    fd = d["first_divergence"]
    if fd is None:
        out.append("  scheduled sets identical at every step")
    else:
        out.append(f"  first divergent step {fd['step']}"
                   + (f" (real t={fd['real_t_ms']:.1f} ms {fd['real_kind']}, sim t="
                      f"{fd['sim_t_ms']:.1f} ms {fd['sim_kind']})" if "real_t_ms" in fd else ""))
        for k in ("real_only", "sim_only", "tokens_differ"):
            if fd[k]:
                v = fd[k]
                out.append(f"    {k}: {' '.join(v[:12])}" + (f" (+{len(v) - 12})" if len(v) > 12 else ""))
    j, f = d["join"], d["steps_to_first_token"]
    what = ("queued -> first step (steps past the first it could join)" if j["unit"] == "steps"
            else "client send -> first step (ms)")
    out.append(f"  {what}: real {j['real']:.2f}, sim {j['sim']:.2f}; first step -> first "
               f"token: real {f['real']:.2f} steps, sim {f['sim']:.2f}")
    out.append("  step time, each real step priced on its real batch (error %: mean |e|, P99 |e|, bias)")
    for k in KINDS:
        for what in ("gpu", "period"):
            e = d["step_time"][k][what]
            if e["n"]:
                out.append(f"    {k:8s} {what:6s} n={e['n']:5d}  real {e['real_mean_ms']:7.2f} ms "
                           f"pred {e['pred_mean_ms']:7.2f} ms  |e| {e['mean_abs_pct']:5.1f} "
                           f"P99 {e['p99_abs_pct']:6.1f} bias {e['bias_pct']:+6.1f}")
    return "\n".join(out)


def summary_table(rows: list[dict]) -> str:
    """One line per run: first divergence, admission wait and the step-time errors."""
    head = (f"{'server/plan':46s} {'steps r/s':>11s} {'1st div':>7s} {'join r/s':>13s} "
            f"{'mixed gpu |e| P99 bias':>23s} {'decode gpu |e| P99 bias':>24s} "
            f"{'mixed per |e| bias':>19s} {'dec per |e| bias':>17s}")
    out = [head]
    for d in rows:
        fd = d["first_divergence"]
        st = d["step_time"]
        cell = lambda e, p99=True: (f"{e['mean_abs_pct']:5.1f} " + (f"{e['p99_abs_pct']:5.1f} " if p99 else "")
                                    + f"{e['bias_pct']:+6.1f}") if e["n"] else "-"
        out.append(f"{d['server'] + '/' + d['plan']:46s} {d['steps']['real']:5d}/{d['steps']['sim']:<5d} "
                   f"{'-' if fd is None else fd['step']:>7} "
                   f"{d['join']['real']:6.1f}/{d['join']['sim']:<6.1f} "
                   f"{cell(st['mixed']['gpu']):>23s} {cell(st['decode']['gpu']):>24s} "
                   f"{cell(st['mixed']['period'], False):>19s} {cell(st['decode']['period'], False):>17s}")
    return "\n".join(out)


def _resolve(arg: str, root: str) -> list[str]:
    if arg == "all":
        return run_dirs(root)
    for d in (arg, os.path.join(root, arg)):
        if os.path.exists(os.path.join(d, "run.json")):
            return [os.path.normpath(d)]
    raise SystemExit(f"step_diff: {arg}: not a run folder (expected <server>/<plan> under {root})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run folders, <server>/<plan>, or 'all'")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--arrivals", choices=("engine", "client"), default="engine")
    ap.add_argument("--out-dir", default=None, help="write <server>--<plan>.txt/.json here")
    ap.add_argument("--summary", default=None, help="write the summary table here")
    a = ap.parse_args(argv)
    try:
        dirs = [d for r in a.runs for d in _resolve(r, a.root)]
    except SystemExit as exc:
        print(exc)
        return 2
    rows = []
    for d in dirs:
        rep = diff_run(d, a.arrivals)
        rows.append(rep)
        text = format_report(rep)
        print(text, flush=True)
        if a.out_dir:
            os.makedirs(a.out_dir, exist_ok=True)
            base = os.path.join(a.out_dir, f"{rep['server']}--{rep['plan']}")
            with open(base + ".txt", "w") as f:
                f.write(text + "\n")
            with open(base + ".json", "w") as f:
                json.dump(rep, f, indent=1)
    if len(rows) > 1 or a.summary:
        table = summary_table(rows)
        print(table)
        if a.summary:
            with open(a.summary, "w") as f:
                f.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
