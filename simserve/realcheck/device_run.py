"""Measure validation points on the GPU machine (imports torch; run there).

    python3 -m simserve.realcheck.device_run --out DIR [--parts gpu,cpu,replay] [--gpu-n 240]
        [--cpu-n 210] [--cpu-threads 16] [--cpu-layers 4] [--replay-trace FILE --replay-n 200
        --replay-rate 4] [--total-s 540]

Writes gpu_iterations.csv, cpu_iterations.csv (one row per batch, appended as measured, so a
killed run keeps its points), replay_{sim,real}_requests.csv + replay.json, and meta.json.
Predictions are made afterwards, torch-free, by `simserve validate report`.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import time
import traceback

GPU_COLS = ["i", "kind", "chunks", "chunk_ctx", "chunk_sample", "decode_ctx", "graph_us",
            "queued_us", "eager_us", "host_enqueue_us", "graph_spread_pct", "starved"]
CPU_STAGES = ["pre_layer", "pre_attention", "attention", "o", "gate_up", "down", "post_layer"]
CPU_COLS = ["i", "kind", "batch", "context", "layers", "threads", "measured_us", "spread_pct"] + [
    f"{s}_us" for s in CPU_STAGES]


class Rows:
    def __init__(self, path, cols):
        new = not os.path.exists(path)
        self.f = open(path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=cols)
        if new:
            self.w.writeheader()

    def add(self, **r):
        self.w.writerow(r)
        self.f.flush()


def _spread(r):
    return (r["max_us"] - r["min_us"]) / r["median_us"] * 100


def gpu_part(a, deadline, log):
    import torch
    from simserve.calibrate.executor import ExecBatch, GpuExecutor
    from simserve.realcheck.batches import gpu_batches
    ex = GpuExecutor(a.model, kv_pool_gib=a.kv_pool_gib, launch="graph")
    rows = Rows(os.path.join(a.out, "gpu_iterations.csv"), GPU_COLS)
    for i, b in enumerate(gpu_batches(a.gpu_n, seed=a.seed)):
        if time.monotonic() > deadline:
            log(f"gpu: deadline after {i} batches")
            break
        eb = ExecBatch(b["chunks"], b["chunk_ctx"], b["chunk_sample"], b["decode_ctx"])
        g = ex.measure(eb, reps=3, launch="graph")
        q = ex.measure(eb, reps=2, launch="queued", warmup=False)
        e = ex.measure(eb, reps=2, launch="eager", warmup=False) if i % 4 == 0 else None
        rows.add(i=i, kind=b["kind"], chunks=json.dumps(b["chunks"]),
                 chunk_ctx=json.dumps(b["chunk_ctx"]), chunk_sample=json.dumps(b["chunk_sample"]),
                 decode_ctx=json.dumps(b["decode_ctx"]), graph_us=round(g["median_us"], 2),
                 queued_us=round(q["median_us"], 2), eager_us=round(e["median_us"], 2) if e else "",
                 host_enqueue_us=round(q["host_enqueue_us"], 1),
                 graph_spread_pct=round(_spread(g), 2), starved=q["starved"])
        if i % 20 == 0 or a.gpu_n <= 20:
            log(f"gpu {i}: {b['kind']} T={eb.num_tokens} B={len(eb.decode_ctx)} graph "
                f"{g['median_us']:.0f}us queued {q['median_us']:.0f}us"
                + (f" eager {e['median_us']:.0f}us" if e else "")
                + f" host {q['host_enqueue_us']:.0f}us starved {q['starved']}")
        if i % 50 == 49:
            torch.cuda.empty_cache()
    return ex


def host_copy_gbps(threads: int) -> float:
    """The host copy ceiling now (as calibration's `stream_copy`: 1 GiB bf16 copy, bytes read
    + written), so CPU results can be compared across boots of a VM whose bandwidth varies."""
    import torch
    from simserve.calibrate.timing import bench_wall, rand
    torch.set_num_threads(threads)
    n = 1 << 29
    x = rand((n,), "cpu")
    y = torch.empty_like(x)
    r = bench_wall(lambda i: y.copy_(x), target_s=0.3, min_reps=3, max_reps=10)
    return 4 * n / r["median_us"] / 1e3


def cpu_part(a, deadline, log):
    from simserve.calibrate.cpu_executor import CpuExecutor
    from simserve.realcheck.batches import cpu_batches
    ex = CpuExecutor(a.model, threads=a.cpu_threads, layers=a.cpu_layers)
    a.cpu_copy_gbps = host_copy_gbps(a.cpu_threads)
    log(f"cpu: host copy {a.cpu_copy_gbps:.1f} GB/s at {a.cpu_threads} threads")
    rows = Rows(os.path.join(a.out, "cpu_iterations.csv"), CPU_COLS)
    for i, b in enumerate(cpu_batches(a.cpu_n, seed=a.seed + 1)):
        if time.monotonic() > deadline:
            log(f"cpu: deadline after {i} batches")
            break
        r = ex.measure(b["batch"], b["context"], reps=3)
        rows.add(i=i, kind=b["kind"], batch=b["batch"], context=b["context"], layers=a.cpu_layers,
                 threads=a.cpu_threads, measured_us=round(r["median_us"], 1),
                 spread_pct=round(_spread(r), 2),
                 **{f"{s}_us": round(r["stages_us"].get(s, 0.0), 1) for s in CPU_STAGES})
        if i % 20 == 0:
            log(f"cpu {i}: b={b['batch']} ctx={b['context']} {r['median_us']:.0f}us")
    a.cpu_copy_gbps_end = host_copy_gbps(a.cpu_threads)  # drift within the run
    log(f"cpu: host copy {a.cpu_copy_gbps_end:.1f} GB/s at the end")


def replay_part(a, ex, log):
    from simserve.calibrate.executor import ExecBatch
    from simserve.hardware.setup import HardwareConfig
    from simserve.realcheck.replay import run_pair
    from simserve.realcheck.store import save_replay
    from simserve.workload.build import build_workload
    w = build_workload(a.replay_trace, num_requests=a.replay_n, arrival="scale",
                       rate=a.replay_rate, seed=0)

    def measure(b):
        eb = ExecBatch(b["chunks"], b["chunk_ctx"], b["chunk_sample"], b["decode_ctx"])
        return ex.measure(eb, reps=1, launch=a.replay_launch, warmup=False)["median_us"]

    t = time.monotonic()
    res = run_pair(w, a.model, HardwareConfig(gpu=a.profile), measure=measure)
    log(f"replay: {res['real']['iterations']} real iterations in {time.monotonic() - t:.0f}s")
    save_replay(a.out, res, {"trace": os.path.basename(a.replay_trace), "n": a.replay_n,
                             "rate": a.replay_rate, "launch": a.replay_launch,
                             "profile": a.profile, "model": a.model})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="gpu,cpu,replay")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--profile", default="h200-sxm")
    p.add_argument("--gpu-n", type=int, default=240)
    p.add_argument("--cpu-n", type=int, default=210)
    p.add_argument("--cpu-threads", type=int, default=16)
    p.add_argument("--cpu-layers", type=int, default=4)
    p.add_argument("--kv-pool-gib", type=float, default=40.0)
    p.add_argument("--replay-trace", default=None)
    p.add_argument("--replay-n", type=int, default=200)
    p.add_argument("--replay-rate", type=float, default=4.0)
    p.add_argument("--replay-launch", default="graph", choices=["graph", "queued", "eager"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-s", default="gpu=240,cpu=150")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    budget = {k: float(v) for k, v in (x.split("=") for x in a.budget_s.split(","))}
    t0 = time.monotonic()
    logf = open(os.path.join(a.out, "run.log"), "a")

    def log(*m):
        line = f"[{time.monotonic() - t0:7.1f}s] " + " ".join(str(x) for x in m)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    import torch
    from simserve.calibrate.run_all import env_info
    meta = env_info(torch)
    meta["args"] = vars(a)
    parts = a.parts.split(",")
    ex = None
    for part in parts:
        try:
            if part == "gpu":
                ex = gpu_part(a, time.monotonic() + budget.get("gpu", 240), log)
            elif part == "cpu":
                cpu_part(a, time.monotonic() + budget.get("cpu", 150), log)
            elif part == "replay":
                if ex is None:
                    from simserve.calibrate.executor import GpuExecutor
                    ex = GpuExecutor(a.model, kv_pool_gib=a.kv_pool_gib)
                replay_part(a, ex, log)
        except Exception:  # noqa: BLE001 - keep the other parts' data
            log(f"{part} failed:\n{traceback.format_exc()}")
            meta.setdefault("failed", []).append(part)
    meta["wall_s"] = time.monotonic() - t0
    meta["cpu_stream_copy_gbps"] = getattr(a, "cpu_copy_gbps", None)
    meta["cpu_stream_copy_gbps_end"] = getattr(a, "cpu_copy_gbps_end", None)
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)


if __name__ == "__main__":
    main()
