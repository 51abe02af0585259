"""Sensitivity of ConfluxServe's Fig. 12 headline (Qwen3-14B, 4x H100) to what was not
measured on that hardware: the split-attention contention α, β (the profile's, derived from the
H200's measurement, vs the paper's 1.28) and the 4-rank collectives (the nvlink4 band's slow
and fast edges, `simserve.hardware.collective_band`).

    python benchmarks/conflux_sensitivity.py [--requests 1000] [--rates 1,2,...,9]

Per variant: goodput (the highest Poisson rate with >= 95 % of requests meeting every
per-token deadline, linear interpolation between rates, never extrapolated) of ConfluxServe
(slo scheduler, the paper's estimator) and of Chunked++ at 4,096 tokens (Fig. 12's best "++"
baseline), and their ratio. Workload as experiments/conflux/fig12-qwen14b.yaml.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simserve.capacity import capacity_from_curve, parse_target  # noqa: E402
from simserve.hardware.collective_band import hardware_at  # noqa: E402
from simserve.hardware.setup import HardwareConfig, resolve_hardware  # noqa: E402
from simserve.metrics import SLO, summarize  # noqa: E402
from simserve.models import get_model  # noqa: E402
from simserve.run import simulate_point  # noqa: E402
from simserve.workload.build import build_workload  # noqa: E402

MODEL, SLO_ = "qwen3-14b", SLO(ttft_ms=2000.0, tbt_ms=100.0)
DESIGNS = {"confluxserve": ("conflux", {"scheduler": "slo", "ttft_ms": 2000, "tbt_ms": 100}),
           "chunked++-4096": ("chunked", {"max_num_batched_tokens": 4096, "scheduler": "srpt",
                                          "enable_prefix_caching": False})}


def goodput(hw, policy, params, rates, n) -> float:
    att = []
    for r in rates:
        w = build_workload("synthetic-mooncake-toolagent", num_requests=n, arrival="poisson",
                           rate=r, seed=0, max_context=get_model(MODEL).max_context,
                           overlong="cap")
        res = simulate_point(w, MODEL, hw, policy, **params)
        att.append(summarize(res.records, SLO_)["slo_attainment"])
    return capacity_from_curve(rates, att, parse_target("slo_attainment>=0.95"))[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rates", default="1,2,3,4,5,6,7,8,9")
    a = ap.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    base = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    c = base.gpu.overheads["sp_contention"]
    variants = [("profile alpha/beta, 2-rank fit", base, {}),
                ("paper 1.28, 2-rank fit", base, {"alpha": "paper", "beta": "paper"}),
                ("profile alpha/beta range high", base,
                 {"alpha": c["alpha_range"][1], "beta": c["beta_range"][1]}),
                ("profile alpha/beta, collectives slow", hardware_at(base, "slow"), {}),
                ("profile alpha/beta, collectives fast", hardware_at(base, "fast"), {})]
    print(f"Fig. 12 Qwen3-14B, 4x H100, {a.requests} requests, rates {rates}; H100 profile "
          f"alpha {c['alpha']}, beta {c['beta']} (range {c['beta_range']})")
    print(f"{'variant':<40} {'confluxserve':>12} {'chunked++':>10} {'ratio':>6}")
    for label, hw, extra in variants:
        g = {}
        for name, (policy, params) in DESIGNS.items():
            p = dict(params, **(extra if policy == "conflux" else {}))
            g[name] = goodput(hw, policy, p, rates, a.requests)
        ratio = g["confluxserve"] / g["chunked++-4096"] if g["chunked++-4096"] else float("nan")
        print(f"{label:<40} {g['confluxserve']:>12.2f} {g['chunked++-4096']:>10.2f} {ratio:>6.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
