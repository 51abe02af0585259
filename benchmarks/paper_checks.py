"""Print the profile-level numbers that `hwprofiles/README.md` sets beside the papers'.

    python benchmarks/paper_checks.py
"""
from __future__ import annotations

import numpy as np

from simserve.cost import BatchShape, GpuCostModel, prefill_batch
from simserve.policies.dualpace import controls as C
from simserve.hardware.profile import load_profile
from simserve.models import get_model


def conflux() -> None:
    q = get_model("qwen3-14b")
    h100, nv = load_profile("h100-sxm"), load_profile("nvlink4")
    c = GpuCostModel(q, h100, 1, None)
    dec = [c.decode_only_s(16, 16 * x) * 1e3 for x in (4096, 8192, 16384)]
    print("ConfluxServe, Qwen3-14B on 1x H100")
    print(f"  16 decodes at 4K / 8K / 16K: {dec[0]:.1f} / {dec[1]:.1f} / {dec[2]:.1f} ms "
          "(paper: ~20 ms at 8K; < 25 ms for all)")
    for slo in (0.05, 0.1):
        best = 0
        for ch in range(64, 8193, 64):
            b = BatchShape(num_tokens=16 + ch, prefill_chunks=np.array([ch]),
                           prefill_ctx=np.array([0]), num_decodes=16,
                           decode_ctx_sum=16 * 8193, num_sample_rows=16)
            if c.step_s(b) <= slo:
                best = ch
        print(f"  largest prefill chunk co-batched with them under {slo * 1e3:.0f} ms: {best} "
              f"(paper: ~{'1K' if slo < 0.1 else '2.2K'})")
    for tp in (1, 2, 4):
        ct = GpuCostModel(q, h100, tp, nv if tp > 1 else None)
        t = [ct.step_s(prefill_batch(n)) for n in (32768, 65536)]
        print(f"  TP{tp}: one-chunk prefill of 32K / 64K: {t[0]:.2f} / {t[1]:.2f} s "
              "(paper: 2 s TTFT needs >= 2 GPUs at 32K, >= 4 at 64K with SP)")


def dualpace() -> None:
    m = get_model("llama-3.1-8b")
    gpu, cpu = load_profile("rtx4090"), load_profile("xeon-silver-4510")
    cops = cpu.cpu_ops(m.name, 12)
    g = gpu.ops(m.name, 1)
    limit = C.gpu_token_limit_from(gpu, m, 1)
    B = np.array(C.CPU_BATCHES)
    wait = C.stage_wait_us(gpu, m, 1, limit)
    rt = C.route_times_from(g, cops, load_profile("pcie4-x16"), m, B, wait_us=wait)
    S = C.route_scores(rt, m.num_layers)
    print("DualPace, Llama-3.1-8B on RTX 4090 + 12 cores of a Xeon Silver 4510")
    print(f"  GPU batched-token limit: {limit} (paper: 1024)")
    print(f"  CPU decode batch limit: {C.cpu_batch_limit_from(cops)} (paper: 256)")
    print(f"  (P, F) exact / eps 0.25 %: {C.assist_thresholds(B, S, m.num_layers, 0.0)} / "
          f"{C.assist_thresholds(B, S, m.num_layers, 0.0025)} at a {wait:.0f} us stage wait "
          "(paper: (32, 0) / (32, 16))")
    r = lambda f, t: float(cops.dense[f](t)) / float(g.dense[f](t))
    print("  CPU/GPU time, qkv at 1/64/256/1024 tokens: " +
          " / ".join(f"{r('qkv', t):.1f}" for t in (1, 64, 256, 1024)) +
          "; gate_up: " + " / ".join(f"{r('gate_up', t):.1f}" for t in (1, 64, 256, 1024)))
    a = [cops.decode_attn.us(b, b * x) / g.decode_attn.us(b, b * x) for b, x in ((1, 512), (64, 2048))]
    print(f"  CPU/GPU paged attention, B1 ctx 512: {a[0]:.1f}; B64 ctx 2048: {a[1]:.1f} "
          "(paper: comparable at B = 1, within ~10x at larger)")


if __name__ == "__main__":
    conflux()
    dualpace()
