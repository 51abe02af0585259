"""Collectives between GPUs of one host (NCCL): all-reduce, all-to-all, all-gather, reduce-scatter,
point-to-point copies, and all-reduce under CUDA graph capture. One process per GPU.

    torchrun --nproc_per_node=2 -m simserve.calibrate.collectives --out DIR [--total-s 240]
    python3 -m torch.distributed.run --nproc_per_node=2 -m simserve.calibrate.collectives --out DIR
    python3 -m simserve.calibrate.collectives --out DIR --nproc 2     (spawns its own processes)
    python3 -m simserve.calibrate.collectives --out DIR --nproc 2 --backend gloo --smoke   (CPU test)

Method: per point, one correctness check against an expectation computed from every rank's
(regenerated) input, a warm-up, then `repeats` timed loops of N back-to-back collectives
(CUDA events around the loop on every rank; a GPU sleep ahead of the loop covers the host's
enqueue time and a 1-element all-reduce lines the ranks up; no barrier inside the loop).
Per repeat: loop time / N, max over ranks; the row holds the stats over repeats.
Writes collectives.csv (timing.COLUMNS schema, rank 0 only, flushed per row) and meta.json.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends are forced below).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

# Keep NVLink multicast off whatever the caller's environment says (shared hosts forbid it).
_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(_SAFE_ENV)

# The timer and the parts live in their own modules (neither imports torch at import time);
# their names stay importable from here.
from .collective_parts import (HIDDENS, TP_TOKENS, part_allreduce, part_alltoall,  # noqa: E402,F401
                               part_gather_scatter, part_graph, part_p2p, pow2, reduce_sizes)
from .collective_timer import GB, Ctx  # noqa: E402,F401

def _sh(cmd: str) -> str:
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as ex:  # noqa: BLE001
        return f"failed: {ex}"


def _run_env(torch, world: int, args, cuda: bool) -> dict:
    """Versions, launcher, NCCL variables and (on GPUs) the topology, for meta.json."""
    from .run_all import env_info
    env = env_info(torch)
    env["command"] = os.environ.get("CAL_CMDLINE") or " ".join(
        [sys.executable, "-m", "simserve.calibrate.collectives", *sys.argv[1:]])
    env["launcher"] = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "torch.multiprocessing.spawn"
    env["world_size"] = world
    env["backend"] = args.backend
    env["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    env["env_vars"] = {k: v for k, v in sorted(os.environ.items())
                       if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_", "CUDA_"))}
    if cuda:
        env["nvidia_smi_topo"] = _sh("nvidia-smi topo -m")
        env["nvidia_smi_nvlink_status"] = _sh("nvidia-smi nvlink --status")
        env["nvidia_smi_list"] = _sh("nvidia-smi -L")
        env["device_count"] = torch.cuda.device_count()
        env["can_access_peer"] = {f"{i}->{j}": torch.cuda.can_device_access_peer(i, j)
                                  for i in range(torch.cuda.device_count())
                                  for j in range(torch.cuda.device_count()) if i != j}
    return env


def _plan(ctx: Ctx, args) -> list:
    """The parts in order, each with the seconds (of a 300 s run) it leaves for those after it."""
    sm = args.smoke
    mx = args.max_bytes
    red = reduce_sizes(2048, mx, with_tp=True)
    coarse = reduce_sizes(2048, mx, with_tp=not sm)
    if args.coarse:
        coarse = {b: v for b, v in coarse.items() if b in set(pow2(2048, mx)[::2]) or v["tag"]}
    a2a = pow2(4096, mx)
    p2p = pow2(4096, args.p2p_max_bytes)
    small = {b: v for b, v in red.items() if b <= (1 << 20)}
    # each part stops early if less than `reserve` seconds remain for the parts after it
    plan = [("allreduce", lambda r: part_allreduce(ctx, red, r), 130),
            ("alltoall", lambda r: part_alltoall(ctx, a2a, r), 100),
            ("p2p", lambda r: part_p2p(ctx, p2p, r), 60),
            ("allgather", lambda r: part_gather_scatter(ctx, coarse, r, "allgather"), 45),
            ("reducescatter", lambda r: part_gather_scatter(ctx, coarse, r, "reducescatter"), 30),
            ("graph", lambda r: part_graph(ctx, small, r), 15),
            ("allreduce2", lambda r: part_allreduce(ctx, red, r, second=True), 3)]
    if args.parts:
        keep = args.parts.split(",")
        plan = [p for p in plan if p[0] in keep]
    return plan


def _run_plan(ctx: Ctx, plan: list, args, write_meta) -> None:
    """Each part in turn; a part that raises is recorded as failed and the next one runs."""
    torch, meta = ctx.torch, ctx.meta
    scale = args.total_s / 300.0
    for name, fn, reserve in plan:
        t0 = time.monotonic()
        ctx.log(f"=== {name} (stops when < {reserve * scale:.0f}s remain) ===")
        status = "ok"
        try:
            fn(reserve * scale)
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            status = f"failed: {type(ex).__name__}: {ex}"[:500]
        if ctx.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        meta["parts"][name] = {"status": status, "used_s": round(time.monotonic() - t0, 1)}
        ctx.log(f"=== {name}: {status}, {time.monotonic() - t0:.1f}s ===")
        write_meta()


def worker(rank: int, world: int, args) -> int:
    import torch
    import torch.distributed as dist

    from .timing import CsvSink, log

    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        device = "cpu"
    t_start = time.monotonic()
    deadline = t_start + args.total_s
    kw = {"device_id": torch.device(device)} if cuda else {}
    dist.init_process_group(args.backend, rank=rank, world_size=world, **kw)
    sink = None
    meta = {"checks": {}, "skipped": {}, "p2p": {}, "parts": {}}
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        sink = CsvSink(os.path.join(args.out, "collectives.csv"))
        meta["env"] = _run_env(torch, world, args, cuda)
        meta["method"] = __doc__
    torch.manual_seed(1234 + rank)

    def write_meta():
        if rank == 0:
            meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
            meta["rows"] = sink.count
            with open(os.path.join(args.out, "meta.json"), "w") as f:
                json.dump(meta, f, indent=1, default=str)

    write_meta()
    if rank == 0:
        log("env:", json.dumps({k: meta["env"].get(k) for k in (
            "torch", "torch_cuda", "nccl_version", "gpu", "device_count", "can_access_peer", "env_vars",
            "launcher")}, default=str))
        if cuda:
            print(meta["env"]["nvidia_smi_topo"], flush=True)
    ctx = Ctx(torch, dist, rank, world, device, cuda, sink, meta, deadline, args)
    _run_plan(ctx, _plan(ctx, args), args, write_meta)
    write_meta()
    if rank == 0:
        log("rows:", sink.count, "checks:", json.dumps(meta["checks"]))
        sink.close()
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


def _spawned(rank, world, args):
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    os.environ["LOCAL_RANK"] = str(rank)
    worker(rank, world, args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo = CPU test")
    ap.add_argument("--total-s", type=float, default=240.0, help="deadline from start, seconds")
    ap.add_argument("--max-bytes", type=int, default=512 << 20)
    ap.add_argument("--p2p-max-bytes", type=int, default=1 << 30)
    ap.add_argument("--nproc", type=int, default=2, help="processes to spawn when not under torchrun")
    ap.add_argument("--parts", default="", help="comma list to restrict (default all)")
    ap.add_argument("--coarse", action="store_true", help="every other power of 2 for gather/scatter")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        return worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    mp.spawn(_spawned, args=(args.nproc, args), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
