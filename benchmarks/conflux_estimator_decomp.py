"""Where ConfluxServe's paper estimator misses at its dispatch points, term by term (issue 13 §2).

    PYTHONPATH=$PWD python benchmarks/conflux_estimator_decomp.py [--model qwen3-14b]
        [--gpu h100-sxm] [--gpus 4] [--tp 1]

One Table 2 decode state (24 decodes per logical rank at 8K context) and one prompt of 30K
tokens left after 0 / 8K / 20K cached; Alg. 1 (FCFS) fills the iteration to τ = 50 / 100 ms
with each estimator variant, and the cost model (the "hardware") times what it dispatched.
Variants, one choice of the paper's estimator changed at a time: f_D from the decode profile,
Eq. 2 not literal, α = β = the cost model's, and the oracle without its margin.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.conflux.admission import PendingPrefill, schedule_iteration
from simserve.policies.conflux.dispatch import RankState
from simserve.policies.conflux.fit import fit_from_cost, fit_paper, profiled_decode_fn
from simserve.policies.conflux.policy import contention


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args(argv)
    hw = resolve_hardware(HardwareConfig(gpu=a.gpu, num_gpus=a.gpus))
    R = a.gpus // a.tp
    from simserve.policies.conflux.config import ConfluxConfig
    al, be = contention(ConfluxConfig(), hw.gpu)
    cost = SpCostModel(get_model(a.model), hw.gpu, hw.nvlink, R, a.tp, al, be, table_tokens=8192)
    paper = fit_paper(cost)
    print(f"{a.model}, {a.gpus}x {a.gpu}, TP{a.tp} x SP{R}: cost model α, β = {al}, {be}; "
          f"paper's fitted α̂, β̂ = {paper.alpha}, {paper.beta}")
    variants = {
        "paper": paper,
        "paper, f_D from the profile": dataclasses.replace(paper, decode_fn=profiled_decode_fn(cost)),
        "paper, Eq. 2 not literal": dataclasses.replace(paper, literal=False),
        "paper, α, β of the cost model": dataclasses.replace(paper, alpha=al, beta=be),
        "oracle without its margin": dataclasses.replace(fit_from_cost(cost, al, be), literal=False),
    }
    nd, dctx, dmax = [24] * R, [24 * 8193] * R, [8193] * R
    for tau in (0.05, 0.1):
        for c0 in (0, 8000, 20000):
            print(f"τ {tau * 1e3:.0f} ms, prompt after {c0} cached tokens:")
            for name, est in variants.items():
                ranks = [RankState(nd[r], dctx[r], 0, 1 << 40, dmax[r]) for r in range(R)]
                plan = schedule_iteration([PendingPrefill(0, 0.0, 1e9, 30000, c0)], ranks, est,
                                          tau, 0.0, admission="fcfs")
                n_p = list(plan.rank_prefill_tokens)
                ell = np.array([c.tokens for c in plan.chunks])
                cc = np.array([c.context_tokens for c in plan.chunks])
                act = cost.iteration_s(n_p, nd, dctx, ell, cc, max(nd), dmax)
                e = est.iteration_time(n_p, nd, dctx, list(zip(ell.tolist(), cc.tolist())), dmax)
                print(f"   {name:32s} chunk {int(ell.sum()):5d}  estimate {e * 1e3:6.1f} ms  "
                      f"cost model {act * 1e3:6.1f} ms  ({(act / e - 1) * 100:+5.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
