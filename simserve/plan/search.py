"""The simulated stage of a plan: the frontier the analytical screen picks, capacity bisection
of each frontier candidate on the executors, successive halving over request counts and
seeds, early stopping of candidates dominated in cost, and the winner's router variants.

Rungs: the first bisects every frontier candidate with `screen_requests` requests (default half
the plan's, at least 100) and the first seed; the survivors — the best 1/eta by the objective,
at least three — are bisected again with the plan's requests and every seed. With a rate to
serve, the last rung runs in order of cost, a batch of `workers` at a time, and stops as soon
as a candidate sustains the rate: every dearer one is dominated ("dominated" in the table;
one of equal cost still runs, as it may sustain more)."""
from __future__ import annotations

import math
import sys

from simserve.plan.simulate import bisect_task, experiment, target_expr
from simserve.plan.space import Candidate
from simserve.plan.state import task_key

MIN_KEEP = 3
# bisection never probes above this multiple of its first guess (the screen's estimate, or
# the previous rung's capacity): a short request list at a huge rate arrives as one burst
# that a generous TTFT target absorbs, and the bracket would double without bound
HI_FACTOR = 4.0
MIN_SCREEN_REQUESTS = 100


def frontier(spec, cands: list[Candidate], est: dict, cost: dict, k: int) -> list[Candidate]:
    """The best `k` distinct candidates (router variants count once, the plan's first router
    standing for them) per (design, GPU kind), best estimate first."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in sorted(cands, key=lambda c: score(spec, est[c].rate, cost[c])):
        if est[c].rate <= 0:
            continue
        g = groups.setdefault((c.design, c.gpu), [])
        if len(g) < k and all(x.base != c.base for x in g):
            g.append(c)
    return [c for g in groups.values() for c in g]


def score(spec, rate: float, hourly: float) -> tuple:
    """Sort key, best first: with a rate to serve, those that sustain it by cost, then the
    rest by rate per dollar; else rate per dollar."""
    per_dollar = rate / hourly if hourly > 0 else math.inf
    if spec.objective == "cheapest":
        return (0, hourly, -rate) if rate >= spec.rate else (1, -per_dollar, hourly)
    return (0, -per_dollar, hourly)


class Simulator:
    """Runs bisection tasks on an executor, reusing the state file's finished ones."""

    def __init__(self, spec, state, executor, progress: bool, total: int, horizon_s: float):
        self.spec, self.state, self.executor = spec, state, executor
        self.horizon_s = horizon_s
        self.bar = None
        self.num_simulations = 0
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc=f"plan {spec.name}", unit="cand",
                            file=sys.stderr, leave=False)

    def close(self):
        if self.bar is not None:
            self.bar.close()

    def item(self, c: Candidate, guess: float, num_requests: int, seeds) -> dict:
        """A bisection task; its probes stay below `HI_FACTOR` × the guess and below the rate
        whose arrivals span less than one SLO horizon (`horizon_s`: the TTFT target plus the
        mean output's TBT deadlines), where a burst would pass for a steady state: a
        candidate that passes there is reported censored (at least that rate)."""
        hi = min(HI_FACTOR * max(guess, 0.05), num_requests / self.horizon_s)
        g = min(max(guess, 0.05), hi)
        return {"experiment": experiment(self.spec, c, [g], seeds, num_requests),
                "profiles": _profiles(c),   # a refitted profile never reuses a stored row
                "target": target_expr(self.spec.attainment, num_requests,
                                      self.spec.targets),
                "start": [min(0.6 * g, 0.5 * hi), min(1.2 * g, hi)], "hi": hi,
                "rtol": self.spec.search.rtol}

    def run(self, jobs: list[tuple[Candidate, dict]]) -> dict[Candidate, dict]:
        out, todo = {}, []
        for c, item in jobs:
            key = task_key(item)
            r = self.state.get(key)
            if r is None:
                todo.append((c, item, key))
            else:
                out[c] = r
                self._tick(c, r)
        if todo:
            it = self.executor.map_unordered(bisect_task, [x[1] for x in todo], None)
            for i, r in it:
                c, _, key = todo[i]
                self.state.put(key, r)
                self.num_simulations += r.get("num_simulations", 0)
                out[c] = r
                self._tick(c, r)
        return out

    def _tick(self, c: Candidate, r: dict) -> None:
        if self.bar is not None:
            self.bar.update()
            self.bar.set_postfix_str(f"{c.label[:60]} -> {r.get('rate', 0):.3g} req/s")


def run_rungs(spec, front: list[Candidate], est: dict, cost: dict, sim: Simulator,
              workers: int) -> dict[Candidate, dict]:
    """Successive halving over the frontier; returns each candidate's last result, with
    `rung` (0-based) and `status` (final, halted, dominated) added."""
    s = spec.search
    full = int(spec.workload.get("num_requests") or 2000)
    first = s.screen_requests or min(full, max(full // 2, MIN_SCREEN_REQUESTS))
    rungs = [(first, s.seeds[:1]), (full, s.seeds)] if first < full or len(s.seeds) > 1 \
        else [(full, s.seeds)]
    res: dict[Candidate, dict] = {}
    alive = list(front)
    if s.max_simulated:
        alive = alive[:s.max_simulated]
    for i, (n, seeds) in enumerate(rungs):
        last = i == len(rungs) - 1
        guess = {c: (_ranking_rate(res[c], est[c].rate) if c in res else est[c].rate)
                 for c in alive}
        if last and spec.objective == "cheapest":
            got = _cheapest_last(spec, alive, guess, cost, sim, n, seeds, workers)
        else:
            got = sim.run([(c, sim.item(c, guess[c], n, seeds)) for c in alive])
        for c, r in got.items():
            res[c] = dict(r, rung=i, status="final" if last else "halted",
                          fidelity=f"{n} req x {len(seeds)} seed" + ("s" if len(seeds) > 1 else ""))
        if last:
            for c in alive:
                if c not in got:
                    res[c] = dict(res.get(c, {}), rung=i - 1, status="dominated")
            break
        ranked = sorted(alive, key=lambda c: score(spec, _ranking_rate(res[c], est[c].rate),
                                                   cost[c]))
        keep = max(MIN_KEEP, math.ceil(len(ranked) / s.eta))
        alive = ranked[:keep]
    return res


def _profiles(c: Candidate) -> str:
    from simserve.hardware.setup import HardwareConfig, profiles_digest
    digest = profiles_digest(HardwareConfig(**c.hardware()))
    if c.decode_pool:   # the decode pool's profile too: a refit of it makes the row stale
        digest += "+" + profiles_digest(HardwareConfig(gpu=c.decode_pool[0]))
    return digest


def _ranking_rate(r: dict, estimate: float) -> float:
    """A rung's rate for ranking: a censored one (the request list was too short to push the
    candidate past it) is a lower bound, so the screen's estimate may stand above it."""
    rate = _rate(r)
    return max(rate, estimate) if r.get("censored") and rate > 0 else (rate or 0.0)


def _rate(r: dict) -> float:
    return float(r.get("rate") or 0.0) if "error" not in r else 0.0


def _cheapest_last(spec, alive, guess, cost, sim, n, seeds, workers) -> dict:
    """The last rung in order of cost; stops after the first batch in which one sustains."""
    order = sorted(alive, key=lambda c: (cost[c], -guess[c]))
    got: dict = {}
    for j in range(0, len(order), max(workers, 1)):
        batch = order[j:j + max(workers, 1)]
        got.update(sim.run([(c, sim.item(c, guess[c], n, seeds)) for c in batch]))
        best = [c for c in batch if _rate(got[c]) >= spec.rate]
        if best:
            cap = min(cost[c] for c in best)
            if all(cost[c] > cap for c in order[j + len(batch):]):
                break   # every one left costs more: dominated (an equal cost may sustain more)
    return got


def refine_routers(spec, winner: Candidate, all_cands: list[Candidate], est: dict,
                   res: dict, sim: Simulator) -> list[Candidate]:
    """The winner's siblings under the plan's other routers, bisected at full fidelity."""
    sibs = [c for c in all_cands if c.base == winner.base and c != winner
            and c.policy == winner.policy]
    if not sibs:
        return []
    full = int(spec.workload.get("num_requests") or 2000)
    g = _rate(res[winner]) or est[winner].rate
    got = sim.run([(c, sim.item(c, g, full, spec.search.seeds)) for c in sibs])
    for c, r in got.items():
        res[c] = dict(r, rung=res[winner].get("rung", 0), status="router",
                      fidelity=res[winner].get("fidelity"))
    return sibs
