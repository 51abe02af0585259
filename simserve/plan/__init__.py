"""The deployment planner: the cheapest deployment (GPU kind and count, host CPU, serving
design and knobs, router) that serves a rate at an SLO, or the most SLO goodput per dollar.

    import simserve
    result = simserve.plan("my-plan.yaml", out="plan-out")   # or simserve.plan.plan(...)
    print(result.table())

Stages: expand the plan's candidates (`space`), prune what cannot run, rank the rest with the
analytical screen (`estimate`), simulate the frontier with capacity bisection and successive
halving (`search`, on the sweep executors; `state` makes it resumable) and report (`report`)."""
from __future__ import annotations

import json
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from simserve.plan.prices import PriceTable
from simserve.plan.space import Candidate
from simserve.plan.spec import PlanSpec, load_plan, parse_plan

__all__ = ["PlanResult", "PlanSpec", "load_plan", "parse_plan", "plan"]


@dataclass
class PlanResult:
    spec: PlanSpec
    rows: list[dict]               # simulated rows ranked by the objective, then screened ones
    winner: dict | None
    winner_candidate: Candidate | None = None
    meta: dict = field(default_factory=dict)
    prices: PriceTable | None = None

    def table(self, limit: int | None = 20) -> str:
        from simserve.plan.report import format_table
        return format_table(self.rows, limit)

    def winner_yaml(self) -> str | None:
        from simserve.plan.report import winner_yaml
        if self.winner is None or self.winner_candidate is None:
            return None
        rate = self.spec.rate if self.spec.rate is not None else self.winner["rate"]
        return winner_yaml(self.spec, self.winner_candidate, rate)

    def vllm_flags(self) -> str | None:
        from simserve.plan.report import vllm_flags
        c = self.winner_candidate
        return None if c is None else vllm_flags(self.spec, c)

    def plot(self, path=None):
        from simserve.plan.report import plot
        return plot(self.rows, path, f"plan {self.spec.name}: {self.spec.model}")

    def frame(self):
        import pandas as pd
        return pd.DataFrame(self.rows)

    def summary(self) -> str:
        m, lines = self.meta, []
        lines.append(f"plan {self.spec.name}: {m['num_candidates']} candidates, "
                     f"{m['num_pruned']} pruned, {m['num_screened']} screened in "
                     f"{m['screen_s']:.1f} s, {m['num_simulated']} simulated "
                     f"({m['num_simulations']} simulations, {m['num_reused']} bisections "
                     f"reused from the state file) in {m['total_s']:.0f} s")
        if not m.get("simulate", True):
            best = self.rows[0] if self.rows else None
            lines.append("screen only, nothing simulated" + (
                f"; best estimate: {best['config']} (${best['usd_per_hour']:.2f}/h, "
                f"{best['estimate']:.3g} req/s)" if best else ""))
        elif self.winner is None:
            lines.append("no candidate sustains the SLO" + (
                f" at {self.spec.rate:g} req/s" if self.spec.rate else ""))
        else:
            w = self.winner
            lines.append(f"winner: {w['config']}: ${w['usd_per_hour']:.2f}/h, sustains "
                         f"{w['rate']:.3g} req/s at {self.spec.attainment:.0%} SLO attainment")
            lines.append(w.get("accuracy", ""))
        return "\n".join(x for x in lines if x)


def plan(config, *, out: str | Path | None = None, executor: str = "local",
         workers: int | None = None, progress: bool = False, log=None,
         simulate: bool = True) -> PlanResult:
    """Run a plan (a YAML path, a mapping, or a `PlanSpec`); with `out`, write plan.csv,
    plan.json, winner.yaml, pareto.png and the state file that makes a rerun resume.
    `simulate=False` stops after the analytical screen (every row `screened`, no winner)."""
    from simserve.plan.estimate import Estimator, workload_stats
    from simserve.plan.prices import load_prices
    from simserve.plan.space import expand, infeasible
    from simserve.plan.state import PlanState
    from simserve.runner.executors import available_cores, make_executor
    t0 = time.perf_counter()
    spec = config if isinstance(config, PlanSpec) else (
        parse_plan(config) if isinstance(config, dict) else load_plan(config))
    base = Path(spec.source).parent if spec.source != "<dict>" else None
    prices = load_prices(spec.prices, base=base)
    for h in spec.hardware:
        prices.gpu(h.gpu, f"{spec.source}: prices")
    cands = expand(spec)
    stats = workload_stats(spec)
    host_mem = {(h.gpu, h.cpu): h.host_memory_gib for h in spec.hardware}
    ok, pruned = [], {}
    for c in cands:
        why = infeasible(c, stats.max_tokens, host_mem.get((c.gpu, c.cpu)))
        if why:
            pruned[c] = why
        else:
            ok.append(c)
    t1 = time.perf_counter()
    estimator = Estimator(spec, stats)
    est = {c: estimator.capacity(c) for c in ok}
    cost = {c: c.hourly(prices) for c in ok}
    screen_s = time.perf_counter() - t1
    if log:
        log(f"{len(cands)} candidates, {len(pruned)} pruned, screen {screen_s:.1f} s")
    from simserve.plan import search
    front = search.frontier(spec, ok, est, cost, spec.search.frontier)
    state = PlanState(None if out is None else Path(out) / "plan-state.jsonl", spec.key())
    workers = workers or available_cores()
    res: dict = {}
    winner = None
    horizon = (float(spec.slo["ttft_ms"]) + stats.mean_output * estimator.itl_s * 1e3) / 1e3
    with make_executor(executor, workers) as ex:
        sim = search.Simulator(spec, state, ex, progress, len(front) if simulate else 0,
                               horizon)
        try:
            if not simulate:
                front = []
            res = search.run_rungs(spec, front, est, cost, sim, workers)
            winner = _pick(spec, res, cost)
            if winner is not None and spec.search.routers_for_winner and winner.replicas > 1:
                search.refine_routers(spec, winner, ok, est, res, sim)
                winner = _pick(spec, res, cost)
        finally:
            sim.close()
    rows = _rows(spec, res, ok, est, cost)
    wrow = None
    if winner is not None:
        wrow = next(r for r in rows if r["config"] == winner.label)
    meta = {"num_candidates": len(cands), "num_pruned": len(pruned), "num_screened": len(ok),
            "screen_s": screen_s, "num_simulated": len(res),
            "num_simulations": sim.num_simulations, "num_reused": state.num_reused,
            "total_s": time.perf_counter() - t0, "workers": workers, "executor": executor,
            "simulate": simulate,
            "pruned": {c.label: why for c, why in pruned.items()}, "prices": prices.sources()}
    result = PlanResult(spec, rows, wrow, winner, meta, prices)
    if out is not None:
        _write(result, Path(out))
    return result


def _rows(spec, res: dict, ok: list, est: dict, cost: dict) -> list[dict]:
    """Simulated rows ranked by the objective, each with its engine x GPU's accuracy line,
    then the screened-only rows, best estimate first."""
    from simserve.plan.report import accuracy, row
    from simserve.plan.search import score
    rows = sorted((row(c, cost[c], est[c], res[c]) for c in res),
                  key=lambda r: _rank_key(spec, r))
    rest = sorted((c for c in ok if c not in res), key=lambda c: score(spec, est[c].rate,
                                                                        cost[c]))
    rows += [row(c, cost[c], est[c], None) for c in rest]
    acc: dict = {}
    for c in res:
        acc.setdefault((c.design, c.gpu, c.opts.get("engine")), accuracy(c))
    by_label = {c.label: acc[(c.design, c.gpu, c.opts.get("engine"))] for c in res}
    for i, r in enumerate(rows):
        r["rank"] = i + 1
        if r["config"] in by_label:
            r["accuracy"] = by_label[r["config"]]
    return rows


def _pick(spec, res: dict, cost: dict):
    ok = [c for c, r in res.items() if r.get("status") in ("final", "router")
          and "error" not in r and (r.get("rate") or 0) > 0]
    if spec.objective == "cheapest":
        ok = [c for c in ok if res[c]["rate"] >= spec.rate]
        return min(ok, key=lambda c: (cost[c], -res[c]["rate"], c.label), default=None)
    return max(ok, key=lambda c: (res[c]["rate"] / cost[c], c.label), default=None)


def _rank_key(spec, r: dict) -> tuple:
    final = r.get("status") in ("final", "router") and (r.get("rate") or 0) > 0
    rate, hourly = r.get("rate") or 0.0, r["usd_per_hour"]
    if spec.objective == "cheapest":
        meets = final and rate >= spec.rate
        return (not meets, not final, hourly if meets else -rate / hourly, r["config"])
    return (not final, -rate / hourly, r["config"])


def _write(result: PlanResult, out: Path) -> None:
    import csv
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in result.rows for k in r if k != "options"))
    with open(out / "plan.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(result.rows)
    (out / "plan.json").write_text(json.dumps(
        {"meta": result.meta, "winner": result.winner, "rows": result.rows}, indent=1,
        default=str))
    text = result.winner_yaml()
    if text is not None:
        (out / "winner.yaml").write_text(text)
        flags = result.vllm_flags()
        if flags:
            (out / "vllm-serve.sh").write_text(flags + "\n")
    if any(r.get("rate") for r in result.rows):
        result.plot(out / "pareto.png")


class _CallablePackage(types.ModuleType):
    """This package, callable: `simserve.plan(...)` is `simserve.plan.plan(...)`."""

    def __call__(self, *args, **kw):
        return plan(*args, **kw)


sys.modules[__name__].__class__ = _CallablePackage
callable_module = sys.modules[__name__]
