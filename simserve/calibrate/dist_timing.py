"""Timing one iteration across the ranks of a process group (imports torch; NCCL).

Every timed run starts with the ranks lined up on the GPU: a barrier, a GPU sleep long enough
to cover the host's enqueue of the run (so the GPU never waits on Python), then a 1-element
all-reduce that both GPUs leave together; CUDA events bracket the run on each rank. A batch's
time is the slowest rank's, repeat by repeat, and the median over repeats.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist


def max_over_ranks(vals: list[float], device) -> list[float]:
    t = torch.tensor(vals, device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def aligned_us(run, cover_s: float, syncbuf: torch.Tensor) -> float:
    """This rank's elapsed µs of one `run()`, started in step with the other ranks."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda._sleep(int(cover_s * 2.0e9))
    dist.all_reduce(syncbuf, op=dist.ReduceOp.MAX)
    e0.record()
    run()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3


def median_of_max(run, cover_s: float, syncbuf, reps: int) -> float:
    ts = max_over_ranks([aligned_us(run, cover_s, syncbuf) for _ in range(reps)], syncbuf.device)
    return sorted(ts)[len(ts) // 2]


def host_enqueue_s(run, device) -> float:
    """One eager run (warm-up: Triton JIT, cuBLAS heuristics, NCCL) and its host enqueue time,
    the largest over ranks."""
    t0 = time.perf_counter()
    run()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return max_over_ranks([host], device)[0]


def graph_us(capture, syncbuf, reps: int) -> float | None:
    """Median of max µs of replays of the CUDA graph `capture()` records, or None (on every
    rank) when any rank failed to capture."""
    ok, g = 1.0, None
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            capture()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the caller falls back to queued timings
        ok = 0.0
    if max_over_ranks([1.0 - ok], syncbuf.device)[0] > 0:
        return None
    g.replay()
    t = median_of_max(g.replay, 2e-3, syncbuf, reps)
    del g
    return t
