"""ConfluxServe Fig. 13 (component ablation), Fig. 14b (SP degree scaling) and Fig. 15 (waterfill vs even dispatch; decode
placement skew), Qwen3-14B on H100s, ours beside the paper's.

    python benchmarks/conflux_ablations.py [--skip-14b]

Fig. 14b runs the `conflux` engine: N GPUs (base TP1, SP N), 24 decodes per GPU with 8K
contexts under a 100 ms TBT, then one 32K prompt (32,000 tokens: Qwen3's context is 32,768);
its completion time (TTFT) at N = 1, 2, 4, 8. Fig. 15 prices single iterations with the SP cost
model: the waterfill assignment (`dispatch`) against an even split, and worst-fit against skewed
decode placements, reporting the shared-linear and split-attention regions separately.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.conflux.dispatch import Candidate, RankState, dispatch
from simserve.policies.conflux.fit import fit_from_cost
from simserve.run import simulate_point
from simserve.workload.spec import Workload

MODEL = "qwen3-14b"


def fig14b(hw) -> None:
    print("Fig. 14b: 32K prefill with 24 decodes/GPU at 8K context, 100 ms TBT (speedup vs N=1)")
    paper = {2: 1.93, 4: 4.17, 8: 7.94}
    base = None
    for n in (1, 2, 4, 8):
        h = dataclasses.replace(hw, num_gpus=n)
        nd = 24 * n

        def run(start):
            w = Workload(np.concatenate([np.zeros(nd), [start]]),
                         np.concatenate([np.full(nd, 8192), [32000]]).astype(np.int64),
                         np.concatenate([np.full(nd, 3000), [1]]).astype(np.int64), name="f14b")
            return simulate_point(w, MODEL, h, "conflux", scheduler="fcfs", tbt_ms=100.0)
        probe = run(1e6)
        start = float(np.nanmax(probe.records.first_token_s[:nd])) + 0.5
        ttft = float(run(start).records.first_token_s[nd]) - start
        base = base or ttft
        p = f"(paper {paper[n]:.2f}x)" if n in paper else ""
        print(f"  N={n}: {ttft:6.2f} s  speedup {base / ttft:5.2f}x {p}")


def _ttft_beside_decodes(hw, prompt: int, policy: str, params: dict, nd: int) -> float:
    """TTFT of one `prompt`-token request arriving once `nd` 8K-context decodes all run."""
    def run(start):
        w = Workload(np.concatenate([np.zeros(nd), [start]]),
                     np.concatenate([np.full(nd, 8192), [prompt]]).astype(np.int64),
                     np.concatenate([np.full(nd, 3000), [1]]).astype(np.int64), name="f13")
        return simulate_point(w, MODEL, hw, policy, **params)
    probe = run(1e6)
    start = float(np.nanmax(probe.records.first_token_s[:nd])) + 0.5
    return float(run(start).records.first_token_s[nd]) - start


def fig13(hw) -> None:
    """Fig. 13: components removed one after another, 4 GPUs, 24 decodes/GPU at 8K, 100 ms:
    attention overlap (prefill and decode attention run back to back), then phase-specific
    parallelism (TP4 for everything), then co-batching (prefill and decode iterations
    alternate under TP4: `loongserve` on one TP4 instance, prefill iterations capped by the
    TBT)."""
    print("Fig. 13: 24 decodes/GPU at 8K, 100 ms TBT; prefill TTFT slowdown as components go")
    h = dataclasses.replace(hw, num_gpus=4)
    paper = {8192: (1.07, 1.13, 1.23), 32000: (1.11, 1.16, 1.34)}
    steps = [("Conflux Parallelism", "conflux", dict(scheduler="fcfs", tbt_ms=100.0)),
             ("- attention overlap", "conflux", dict(scheduler="fcfs", tbt_ms=100.0, overlap=False)),
             ("- phase-specific parallelism", "conflux",
              dict(scheduler="fcfs", tbt_ms=100.0, overlap=False, tp=4)),
             ("- co-batching", "loongserve",
              dict(scheduler="fcfs", tp=4, max_wait_tokens=1, tbt_ms=100.0))]
    for prompt in (8192, 32000):
        base = None
        for k, (label, pol, params) in enumerate(steps):
            t = _ttft_beside_decodes(h, prompt, pol, params, 96)
            base = base or t
            p = f"(paper {paper[prompt][k - 1]:.2f}x)" if k else ""
            print(f"  {prompt:5d}-token prefill, {label:30s} TTFT {t:6.3f} s  {t / base:5.2f}x {p}")


def _regions(cost: SpCostModel, n_p, n_d, dctx, chunk: int):
    lin = max(cost.base.dense_layer_us(int(p + d)) for p, d in zip(n_p, n_d))
    t_p = cost.prefill_path_us(int(max(n_p)), np.array([chunk]), np.array([0]))
    attn = cost.split_attention_us(t_p, cost.decode_path_us(n_d, dctx))
    return lin, attn


def fig15(hw) -> None:
    model = get_model(MODEL)
    cost = SpCostModel(model, hw.gpu, hw.nvlink, 4)
    est = fit_from_cost(cost, cost.alpha, cost.beta)
    chunk = 1024
    print("Fig. 15a: one rank with 128 decodes at 2K, 1K prefill: even dispatch / waterfill")
    ranks = [RankState(128, 128 * 2049)] + [RankState()] * 3
    _, wf = dispatch(10.0, est, ranks, None, Candidate(chunk, 0))
    nd, dc = [s.num_decodes for s in ranks], [s.decode_ctx_tokens for s in ranks]
    lw, aw = _regions(cost, wf, nd, dc, chunk)
    le, ae = _regions(cost, [chunk // 4] * 4, nd, dc, chunk)
    print(f"  waterfill split {list(wf)}; shared-linear {le / lw:.2f}x (paper 1.32x), "
          f"split-attention {ae / aw:.2f}x (paper 0.99x)")
    print("Fig. 15b: 64 decodes at 8K, 1K prefill waterfilled: skewed / worst-fit placement")
    out = {}
    for name, place in (("worst-fit", [16, 16, 16, 16]), ("moderate", [8, 8, 24, 24]),
                        ("severe", [0, 0, 32, 32])):
        rs = [RankState(k, k * 8193) for k in place]
        _, a = dispatch(10.0, est, rs, None, Candidate(chunk, 0))
        out[name] = _regions(cost, a, place, [k * 8193 for k in place], chunk)
    paper = {"moderate": (1.03, 1.39), "severe": (1.01, 1.75)}
    for name in ("moderate", "severe"):
        lin = out[name][0] / out["worst-fit"][0]
        att = out[name][1] / out["worst-fit"][1]
        print(f"  {name:8s}: shared-linear {lin:.2f}x (paper {paper[name][0]:.2f}x), "
              f"split-attention {att:.2f}x (paper {paper[name][1]:.2f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-14b", action="store_true", help="only the cost-model figures")
    a = ap.parse_args(argv)
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    fig15(hw)
    if not a.skip_14b:
        fig13(hw)
        fig14b(hw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
