"""Measure multi-GPU iterations on R real GPUs (imports torch; run on the GPU machine):
Conflux Parallelism (`--mode sp`) or tensor parallelism (`--mode tp`).

    python3 -m simserve.realcheck.sp_run --out DIR [--mode sp|tp] [--models qwen3-14b,llama-3.1-8b]
        [--n 150] [--budget-s 200] [--nproc 2]

`--mode tp`: the single-GPU validation batches (`batches.gpu_batches`) through `GpuExecutor`
at TP R (heads, FFN and vocabulary sharded, NCCL all-reduces after O and down), as a CUDA-graph
replay and with queued eager launches; rows in DIR/<model>-tp<R>/gpu_iterations.csv, scored by
`simserve validate report DIR/<model>-tp<R> --tp R`.

One process per GPU (NCCL; NVLink multicast forced off). Per model: a correctness check of the
Ulysses attention path against full-head attention, then `sp_batches` measured in the three
variants of `SpExecutor` (queued eager launches) plus a CUDA-graph replay of the overlapped
iteration. Rank 0 appends one row per batch to DIR/<model>/sp_iterations.csv as it goes (a
killed run keeps its points) and writes meta.json. Predictions are made afterwards, torch-free,
by `simserve validate sp-report`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                   "NVSHMEM_DISABLE_NVLS": "1"})

COLS = ["i", "kind", "chunks", "chunk_ctx", "chunk_sample", "shards", "decode_ctx",
        "overlap_graph_us", "overlap_queued_us", "serial_queued_us", "linear_queued_us",
        "overlap_host_us"]


def _model(rank, world, a, model, deadline, log):
    import torch
    import torch.distributed as dist

    from simserve.calibrate.sp_executor import SpBatch, SpExecutor, check_sp
    from simserve.realcheck.device_run import Rows
    from simserve.realcheck.sp_batches import as_row, sp_batches
    ex = SpExecutor(model, kv_pool_gib=a.kv_pool_gib, launch="graph", seed=rank)
    err = check_sp(ex)
    log(f"{model}: Ulysses attention vs full-head reference, rel err {err:.2e}")
    out = os.path.join(a.out, model)
    rows = None
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        rows = Rows(os.path.join(out, "sp_iterations.csv"), COLS)
    graph_ok, done = True, 0
    for b in sp_batches(a.n, ranks=world, seed=a.seed):
        flag = torch.tensor([1.0 if time.monotonic() > deadline else 0.0], device=ex.dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            log(f"{model}: deadline after {done} batches")
            break
        r = ex.measure_sp(SpBatch.from_row(b), graph=graph_ok, reps=3)
        if graph_ok and r.get("overlap_graph_us") is None:
            graph_ok = False
            log(f"{model}: CUDA graph capture failed; queued timings only from here")
        if rows:
            rows.add(**{k: v for k, v in as_row(b).items() if k in COLS},
                     **{k: (round(v, 2) if isinstance(v, float) else "") for k, v in r.items()
                        if k in COLS})
        if b["i"] % 10 == 0:
            log(f"{model} {b['i']}: {b['kind']} P={sum(b['chunks'])} shards={b['shards']} "
                f"B={[len(d) for d in b['decode_ctx']]} " + " ".join(
                    f"{k[:-3]}={v:.0f}" for k, v in r.items() if isinstance(v, float)))
        done += 1
        if done % 40 == 0:
            torch.cuda.empty_cache()
    del ex
    torch.cuda.empty_cache()
    return {"batches": done, "check_rel_err": err, "graph": graph_ok}


def _model_tp(rank, world, a, model, deadline, log):
    import torch
    import torch.distributed as dist

    from simserve.calibrate import dist_timing as DT
    from simserve.calibrate.executor import ExecBatch, GpuExecutor
    from simserve.realcheck.batches import gpu_batches
    from simserve.realcheck.device_run import GPU_COLS, Rows
    ex = GpuExecutor(model, kv_pool_gib=a.kv_pool_gib, launch="graph", seed=rank, tp=world)
    sync = torch.ones(1, device=f"cuda:{rank}")
    rows = None
    if rank == 0:
        out = os.path.join(a.out, f"{model}-tp{world}")
        os.makedirs(out, exist_ok=True)
        rows = Rows(os.path.join(out, "gpu_iterations.csv"), GPU_COLS)
    graph_ok, done = True, 0
    for i, b in enumerate(gpu_batches(a.n, seed=a.seed)):
        flag = torch.tensor([1.0 if time.monotonic() > deadline else 0.0], device=sync.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            log(f"{model} TP{world}: deadline after {done} batches")
            break
        inp = ex.prepare(ExecBatch(b["chunks"], b["chunk_ctx"], b["chunk_sample"], b["decode_ctx"]))
        run = (lambda: ex.forward(inp))
        host = DT.host_enqueue_s(run, sync.device)
        q = DT.median_of_max(run, min(0.5, 1.5 * host + 2e-3), sync, 2)
        g = DT.graph_us(run, sync, 3) if graph_ok else None
        if graph_ok and g is None:
            graph_ok = False
            log(f"{model} TP{world}: CUDA graph capture failed; queued timings only from here")
        if rows:
            rows.add(i=i, kind=b["kind"], chunks=json.dumps(b["chunks"]),
                     chunk_ctx=json.dumps(b["chunk_ctx"]), chunk_sample=json.dumps(b["chunk_sample"]),
                     decode_ctx=json.dumps(b["decode_ctx"]),
                     graph_us=round(g if g is not None else q, 2), queued_us=round(q, 2),
                     eager_us="", host_enqueue_us=round(host * 1e6, 1),
                     graph_spread_pct="", starved="" if g is not None else "no graph")
        if i % 20 == 0:
            log(f"{model} TP{world} {i}: {b['kind']} T={sum(b['chunks']) + len(b['decode_ctx'])} "
                f"B={len(b['decode_ctx'])} graph {g or float('nan'):.0f}us queued {q:.0f}us")
        done += 1
        if done % 40 == 0:
            torch.cuda.empty_cache()
    return {"batches": done, "graph": graph_ok}


def worker(rank: int, world: int, a) -> None:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device(f"cuda:{rank}"))
    t0 = time.monotonic()
    logf = open(os.path.join(a.out, "run.log"), "a") if rank == 0 else None

    def log(*m):
        if rank == 0:
            line = f"[{time.monotonic() - t0:7.1f}s] " + " ".join(str(x) for x in m)
            print(line, flush=True)
            logf.write(line + "\n")
            logf.flush()

    meta = {"models": {}}
    if rank == 0:
        from simserve.calibrate.run_all import env_info
        meta.update(env_info(torch))
        meta["args"] = vars(a)
        meta["world_size"] = world
        meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    for model in a.models.split(","):
        try:
            fn = _model if a.mode == "sp" else _model_tp
            meta["models"][f"{model}-{a.mode}{world}"] = fn(rank, world, a, model,
                                                            time.monotonic() + a.budget_s, log)
        except Exception:  # noqa: BLE001 - keep the other model's points
            log(f"{model} failed:\n{traceback.format_exc()}")
            meta["models"][f"{model}-{a.mode}{world}"] = {"failed": traceback.format_exc()[-800:]}
            break  # a failed collective can leave the group unusable
        torch.cuda.empty_cache()
        if rank == 0:
            meta["wall_s"] = time.monotonic() - t0
            with open(os.path.join(a.out, f"meta-{a.mode}.json"), "w") as f:
                json.dump(meta, f, indent=1, default=str)
    dist.destroy_process_group()


def _spawned(rank, world, a):
    worker(rank, world, a)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="sp", choices=["sp", "tp"])
    p.add_argument("--models", default="qwen3-14b,llama-3.1-8b")
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=200.0, help="per model")
    p.add_argument("--kv-pool-gib", type=float, default=40.0)
    p.add_argument("--nproc", type=int, default=2)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    mp.spawn(_spawned, args=(a.nproc, a), nprocs=a.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
