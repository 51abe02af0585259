"""The deployment planner: strict plan YAML, prices, pruning, the screen, resume, and the
planner's winner against an exhaustive grid with full bisection of every candidate."""
from __future__ import annotations

import math
import textwrap

import pytest

from simserve.errors import ConfigError
from simserve.plan import parse_plan, plan
from simserve.plan.estimate import Estimator, workload_stats
from simserve.plan.prices import load_prices
from simserve.plan.search import score
from simserve.plan.simulate import bisect_task, experiment, target_expr
from simserve.plan.space import expand, infeasible

SMALL = {
    "name": "small", "model": "llama-3.1-8b",
    "workload": {"trace": "synthetic-conversation", "num_requests": 300, "rate": 4},
    "slo": {"ttft_ms": 3000, "tbt_ms": 100, "attainment": 0.9},
    "hardware": [{"gpu": "h100-sxm", "num_gpus": [1, 2]}, {"gpu": "h20", "num_gpus": [1, 2]}],
    "designs": [{"policy": "vllm", "tp": [1, 2], "max_num_batched_tokens": [512, 2048]},
                {"policy": "distserve"}],
    "search": {"frontier": 2, "seeds": [0], "rtol": 0.1, "routers_for_winner": False},
}


def write(tmp_path, text: str):
    p = tmp_path / "plan.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_unknown_key_names_file_line_and_field(tmp_path):
    from simserve.cli import main
    p = write(tmp_path, """\
        name: bad
        model: llama-3.1-8b
        workload: {trace: synthetic-conversation, num_requests: 50, rate: 4}
        slo: {ttft_ms: 3000, tbt_ms: 150}
        hardware:
          - {gpu: h100-sxm, num_gpus: [1]}
        designs:
          - {policy: vllm, max_num_batched_token: [512]}
        """)
    assert main(["plan", str(p), "--out", str(tmp_path / "o"), "-q"]) == 2
    with pytest.raises(ConfigError, match=r"plan.yaml:8: designs\[0\].max_num_batched_token"):
        from simserve.plan import load_plan
        load_plan(p)


def test_workload_errors_point_at_the_plan(tmp_path):
    from simserve.plan import load_plan
    p = write(tmp_path, """\
        model: llama-3.1-8b
        workload: {trace: synthetic-conversation, num_request: 50, rate: 4}
        slo: {ttft_ms: 3000, tbt_ms: 150}
        hardware: [{gpu: h100-sxm}]
        designs: [{policy: vllm}]
        """)
    with pytest.raises(ConfigError, match=r"plan.yaml:2: .*num_request"):
        load_plan(p)


def test_cheapest_needs_a_rate():
    d = dict(SMALL, workload={"trace": "synthetic-conversation", "rate": "maximise"},
             objective="cheapest")
    with pytest.raises(ConfigError, match="cheapest needs a workload.rate"):
        parse_plan(d)
    assert parse_plan(dict(d, objective="goodput_per_dollar")).rate is None


def test_prices_have_sources_and_overrides():
    t = load_prices()
    for p in list(t.gpu_hour.values()) + [t.cpu_core_hour, t.host_memory_gib_hour]:
        assert p.usd > 0 and p.source and p.date
    o = load_prices({"gpu_hour": {"h20": 1.5}})
    assert o.gpu("h20").usd == 1.5 and o.gpu("h100-sxm").usd == t.gpu("h100-sxm").usd
    with pytest.raises(ConfigError, match="no GPU-hour price for 'b200'"):
        t.gpu("b200")
    assert t.hourly("h100-sxm", 2, 10, 100) == pytest.approx(
        2 * t.gpu("h100-sxm").usd + 10 * t.cpu_core_hour.usd + 100 * t.host_memory_gib_hour.usd)


def test_pruning_reasons():
    d = dict(SMALL, model="qwen3-32b",
             hardware=[{"gpu": "rtx4090", "num_gpus": [1, 2]}, {"gpu": "h100-sxm",
                                                                "num_gpus": [1, 4]}],
             designs=[{"policy": "vllm", "tp": [1, 3, 4]},
                      {"policy": "conflux", "instances": [1], "tp": [1]},
                      {"policy": "dualpace"}])
    spec = parse_plan(d)
    why = {c.label: infeasible(c, 8000, None) for c in expand(spec)}
    assert "KV" in why["vllm[tp=1]@1xrtx4090"]        # 64 GB of weights on a 24 GB card
    assert "GPU-GPU link" in why["vllm[tp=1]@2xrtx4090"]
    assert "does not divide" in why["vllm[tp=3]@4xh100-sxm"]
    assert why["vllm[tp=4]@4xh100-sxm"] is None
    assert "without a host CPU" in why["dualpace@1xh100-sxm"]
    assert why["conflux[instances=1,tp=1]@4xh100-sxm"] is None


def test_screen_grows_with_gpus_and_ranks_by_cost():
    spec = parse_plan(SMALL)
    E = Estimator(spec, workload_stats(spec))
    c = {x.label: x for x in expand(spec)}
    one = E.capacity(c["vllm[tp=1,max_num_batched_tokens=2048]@1xh100-sxm"]).rate
    two = E.capacity(c["vllm[tp=1,max_num_batched_tokens=2048]@2xh100-sxm"]).rate
    h20 = E.capacity(c["vllm[tp=1,max_num_batched_tokens=2048]@1xh20"]).rate
    assert one > 0 and two == pytest.approx(2 * one) and 0 < h20 < one
    assert score(spec, 5, 4.0) < score(spec, 5, 5.0) < score(spec, 3, 1.0)


def test_bisect_task_finds_a_rate_that_passes_every_seed():
    spec = parse_plan(SMALL)
    c = next(x for x in expand(spec) if x.label == "vllm[tp=1,max_num_batched_tokens=2048]@1xh20")
    item = {"experiment": experiment(spec, c, [2.0], [0, 1], 150),
            "target": target_expr(0.9, 150), "start": [1.0, 2.0], "hi": 40.0, "rtol": 0.1}
    # (a hi far above the request list's span: this checks the bisection, not the cap)
    r = bisect_task(item)
    assert r["rate"] > 0 and not r["censored"]
    assert r["at"]["slo_attainment"] >= 0.9
    lo, hi = r["bracket"]
    assert hi <= lo * 1.1 + 1e-9
    assert all(math.isnan(v) or v < 0.9 for rr, v in r["probes"] if rr >= hi)


def _exhaustive(spec):
    """Every feasible candidate bisected at full fidelity; the cheapest that sustains."""
    from simserve.plan.estimate import Estimator
    from simserve.plan.search import HI_FACTOR
    stats = workload_stats(spec)
    prices = load_prices(spec.prices)
    E = Estimator(spec, stats)
    n = spec.workload["num_requests"]
    best = None
    for c in expand(spec):
        if infeasible(c, stats.max_tokens, None):
            continue
        horizon = (spec.slo["ttft_ms"] + stats.mean_output * spec.slo["tbt_ms"]) / 1e3
        hi = min(HI_FACTOR * max(E.capacity(c).rate, 0.05), n / horizon)
        g = min(max(E.capacity(c).rate, 0.05), hi)
        r = bisect_task({"experiment": experiment(spec, c, [g], spec.search.seeds, n),
                         "target": target_expr(spec.attainment, n),
                         "start": [min(0.6 * g, 0.5 * hi), min(1.2 * g, hi)], "hi": hi,
                         "rtol": spec.search.rtol})
        if r.get("rate", 0) >= spec.rate:
            key = (c.hourly(prices), -r["rate"], c.label)
            best = min(best, (key, c.label)) if best else (key, c.label)
    return best[1]


@pytest.mark.timeout(600)
def test_small_plan_winner_equals_exhaustive_grid(tmp_path):
    spec = parse_plan(SMALL)
    assert len(expand(spec)) <= 30
    res = plan(spec, out=tmp_path / "o", workers=1)
    assert res.meta["num_simulated"] < res.meta["num_screened"]   # not a grid in disguise
    assert res.winner is not None
    assert res.winner["config"] == _exhaustive(spec)
    # resume: the same plan again runs no simulation; its rows are the state file's
    again = plan(spec, out=tmp_path / "o", workers=1)
    assert again.meta["num_simulations"] == 0 and again.meta["num_reused"] > 0
    assert again.winner["config"] == res.winner["config"]
    # another plan (a different SLO) never reads those rows back
    other = plan(parse_plan(dict(SMALL, slo={"ttft_ms": 2500, "tbt_ms": 150,
                                             "attainment": 0.9})), out=tmp_path / "o",
                 workers=1)
    assert other.meta["num_reused"] == 0


@pytest.mark.timeout(600)
def test_winner_yaml_meets_the_slo_with_fresh_seeds(tmp_path):
    import yaml

    from simserve.api import run_experiment
    res = plan(parse_plan(SMALL), out=tmp_path / "o", workers=1)
    text = (tmp_path / "o" / "winner.yaml").read_text()
    exp = yaml.safe_load(text)
    assert exp["workload"]["rates"] == [4.0] and exp["workload"]["seeds"] == [1000, 1001, 1002]
    df = run_experiment(tmp_path / "o" / "winner.yaml")
    assert len(df) == 3 and (df["slo_attainment"] >= 0.9).all()
    assert (tmp_path / "o" / "pareto.png").stat().st_size > 0
    assert res.vllm_flags() is None or res.vllm_flags().startswith("vllm serve")


def test_simserve_plan_is_callable_and_pareto_front():
    import simserve
    from simserve.plan.report import pareto
    assert callable(simserve.plan) and simserve.plan.plan is plan
    pts = [(1.0, 1.0), (2.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 5.0)]
    assert pareto(pts) == [0, 1, 4]


def test_percentile_targets_bound_the_capacity(tmp_path):
    from simserve.plan import load_plan
    p = write(tmp_path, """\
        model: llama-3.1-8b
        workload: {trace: synthetic-conversation, num_requests: 150, rate: 1}
        slo: {ttft_ms: 3000, tbt_ms: 100, targets: [p99_itl_ms<=banana]}
        hardware: [{gpu: h100-sxm}]
        designs: [{policy: vllm}]
        """)
    with pytest.raises(ConfigError, match=r"plan.yaml:3: slo.targets: .*not a number"):
        load_plan(p)
    one = dict(SMALL, hardware=[{"gpu": "h100-sxm", "num_gpus": [1]}],
               designs=[{"policy": "vllm", "max_num_batched_tokens": [2048]}],
               workload={"trace": "synthetic-conversation", "num_requests": 150, "rate": 1})
    free = plan(parse_plan(one), workers=1)
    assert free.winner is not None
    tight = dict(one, slo=dict(one["slo"], targets=["p99_ttft_ms<=1"]))   # 1 ms: impossible
    res = plan(parse_plan(tight), workers=1)
    assert res.winner is None and res.rows[0]["status"] == "final" and not res.rows[0]["rate"]


def test_screen_only_simulates_nothing():
    res = plan(parse_plan(SMALL), workers=1, simulate=False)
    assert res.meta["num_simulated"] == 0 and res.winner is None
    assert all(r["status"] == "screened" for r in res.rows)
    assert "screen only" in res.summary()


HETERO = dict(SMALL, workload={"trace": "synthetic-conversation", "num_requests": 120, "rate": 2},
              hardware=[{"gpu": "h100-sxm", "num_gpus": [1, 2]}],
              designs=[{"policy": "distserve", "decode_gpu": ["h20"],
                        "decode_num_gpus": [1, 2]}])


def test_heterogeneous_pools_are_pruned_and_screened_per_pool():
    spec = parse_plan(dict(HETERO, model="qwen3-32b",
                           designs=[{"policy": "distserve", "decode_gpu": ["rtx4090", "h20"],
                                     "decode_num_gpus": [1, 2], "decode_tp": [1, 2]}]))
    why = {c.label: infeasible(c, 8000, None) for c in expand(spec)}
    # 64 GB of weights fit the H100 prefill GPU but not a 24 GB decode card
    assert "on rtx4090" in why["distserve[decode_tp=1]@1xh100-sxm+1xrtx4090"]
    assert "GPU-GPU link" in why["distserve[decode_tp=2]@1xh100-sxm+2xrtx4090"]
    assert why["distserve[decode_tp=1]@1xh100-sxm+1xh20"] is None
    assert "do not divide" in why["distserve[decode_tp=2]@1xh100-sxm+1xh20"]
    # the decode pool's kind and size move the screen: more decode GPUs, no lower a rate
    spec = parse_plan(dict(HETERO, designs=[{"policy": "distserve",
                                             "decode_gpu": ["h20", "h200-sxm"],
                                             "decode_num_gpus": [1, 2]}]))
    E = Estimator(spec, workload_stats(spec))
    est = {c.label: E.capacity(c) for c in expand(spec)}
    assert (est["distserve@2xh100-sxm+2xh20"].rate > est["distserve@2xh100-sxm+1xh20"].rate)
    # decode-bound: the decode GPU's bandwidth sets the iteration time
    assert est["distserve@1xh100-sxm+1xh200-sxm"].itl_s < est["distserve@1xh100-sxm+1xh20"].itl_s


@pytest.mark.timeout(600)
def test_plan_with_a_heterogeneous_decode_pool_costs_both_pools(tmp_path):
    import yaml
    spec = parse_plan(HETERO)
    prices = load_prices()
    res = plan(spec, out=tmp_path / "o", workers=1)
    rows = {r["config"]: r for r in res.rows}
    r = rows["distserve@2xh100-sxm+2xh20"]
    assert r["usd_per_hour"] == pytest.approx(2 * prices.gpu("h100-sxm").usd
                                              + 2 * prices.gpu("h20").usd)
    assert (r["gpu"], r["num_gpus"], r["decode_gpu"], r["decode_num_gpus"]) == \
        ("h100-sxm", 2, "h20", 2)
    assert res.winner is not None and "xh20" in res.winner["config"]
    assert res.winner["rate"] > 0
    exp = yaml.safe_load((tmp_path / "o" / "winner.yaml").read_text())
    pol = exp["policies"][0]
    assert pol.get("decode_gpu", (pol.get("options") or {}).get("decode_gpu")) == "h20"
    assert "xh20" in res.table() and "h20 (decode)" in res.table()


def test_an_slo_without_per_token_deadlines_is_refused_in_one_line(tmp_path):
    from simserve.plan import load_plan
    p = write(tmp_path, """\
        model: llama-3.1-8b
        workload: {trace: synthetic-conversation, num_requests: 150, rate: 1}
        slo: {ttft_ms: 3000, e2el_ms: 30000}
        hardware: [{gpu: h100-sxm}]
        designs: [{policy: vllm}]
        """)
    with pytest.raises(ConfigError, match=r"plan.yaml:3: slo: a plan needs slo.ttft_ms"):
        load_plan(p)


def test_a_plan_state_is_keyed_by_the_code_and_profiles(monkeypatch):
    """A refitted profile or an edited policy gives a new key: no row computed from older
    inputs is read back on resume."""
    from simserve.runner import provenance
    spec = parse_plan(SMALL)
    before = spec.key()
    monkeypatch.setattr(provenance, "code_hash", lambda: "0000000000000000")
    assert spec.key() != before


def test_the_screen_reads_defaults_from_the_policies_configs(monkeypatch):
    """Utilisation, token budgets and the host pool come from each policy's config: a default
    changed there moves the feasibility check, the estimate and the price."""
    import dataclasses

    from simserve import policies
    from simserve.plan import defaults
    from simserve.policies.distserve.config import DistServeConfig
    from simserve.policies.dualpace.config import DualPaceConfig

    d = dict(SMALL, hardware=[{"gpu": "h100-sxm", "num_gpus": [2], "cpu": "xeon-8469c"}],
             designs=[{"policy": "distserve"}, {"policy": "dualpace"}])
    spec = parse_plan(d)
    cands = {c.design: c for c in expand(spec)}
    dist, dual = cands["distserve"], cands["dualpace"]
    stats = workload_stats(spec)
    prices = load_prices()

    def screen():
        defaults.policy_config.cache_clear()
        return (infeasible(dist, 8000, None), Estimator(spec, stats).capacity(dist).rate,
                dual.host_gib(), dual.hourly(prices))

    before = screen()
    assert before[0] is None and before[1] > 0 and before[2] == DualPaceConfig().host_kv_gib

    @dataclasses.dataclass(frozen=True, slots=True)
    class TightDist(DistServeConfig):
        gpu_memory_utilization: float = 0.21   # 16.8 of 80 GB: the weights and no KV to speak of

    @dataclasses.dataclass(frozen=True, slots=True)
    class SmallHost(DualPaceConfig):
        host_kv_gib: float = 30.0

    for name, cls in (("distserve", TightDist), ("dualpace", SmallHost)):
        _, build = policies.get_policy(name)
        monkeypatch.setitem(policies._REGISTRY, name, (cls, build))
    try:
        after = screen()
    finally:
        monkeypatch.undo()
        defaults.policy_config.cache_clear()
    assert after[0] is not None and "KV" in after[0]   # 8,000 tokens no longer fit
    assert after[2] == 30.0 and after[3] < before[3]
