"""Host<->device copies: pinned and pageable, 4 KB to 1 GB, and concurrent H2D + D2H."""
from __future__ import annotations

import torch

from ..models import CATALOG
from .timing import Budget, CsvSink, bench_cuda, bench_wall, free_gpu, log


def _sizes(max_bytes: int) -> dict[int, str]:
    sizes = {}
    s = 4096
    while s <= max_bytes:
        sizes[s] = ""
        s *= 2
    # per-layer KV sizes of the catalog models (one 16-token block, 1K and 4K tokens, TP1)
    for m in CATALOG.values():
        per = m.kv_bytes_per_token_per_layer(1)
        for ntok in (16, 1024, 4096):
            b = per * ntok
            if b <= max_bytes:
                tag = f"kv/layer {m.name} {ntok} tok"
                sizes[b] = (sizes.get(b, "") + "; " + tag).strip("; ")
    return dict(sorted(sizes.items()))


def links(sink: CsvSink, budget: Budget, checks: dict, max_bytes: int = 1 << 30,
          concurrent_sizes=(16 << 20, 64 << 20, 256 << 20)) -> None:
    dev = torch.randint(1, 255, (max_bytes,), dtype=torch.uint8, device="cuda")
    dev2 = torch.randint(1, 255, (max_bytes,), dtype=torch.uint8, device="cuda")
    pinned = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=True)
    pinned.copy_(dev)
    pinned2 = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(max_bytes, dtype=torch.uint8)
    pageable.copy_(pinned)
    torch.cuda.synchronize()
    # round trip check on 1 MiB
    n = 1 << 20
    dev2[:n].copy_(pageable[:n])
    pinned2[:n].copy_(dev2[:n], non_blocking=True)
    torch.cuda.synchronize()
    checks["links_roundtrip_equal"] = bool(torch.equal(pinned2[:n], pageable[:n]))
    sync = torch.cuda.synchronize
    for size, tag in _sizes(max_bytes).items():
        if not budget.ok():
            log("links: budget spent")
            break
        modes = {
            ("h2d", "pinned", "events"): lambda i: dev[:size].copy_(pinned[:size], non_blocking=True),
            ("d2h", "pinned", "events"): lambda i: pinned2[:size].copy_(dev[:size], non_blocking=True),
            ("h2d", "pinned", "wall"): lambda i: dev[:size].copy_(pinned[:size], non_blocking=True),
            ("d2h", "pinned", "wall"): lambda i: pinned2[:size].copy_(dev[:size], non_blocking=True),
            ("h2d", "pageable", "wall"): lambda i: dev[:size].copy_(pageable[:size]),
            ("d2h", "pageable", "wall"): lambda i: pageable[:size].copy_(dev2[:size]),
        }
        out = []
        for (dirn, mem, timer), fn in modes.items():
            if timer == "events":
                r = bench_cuda(fn, target_ms=30, min_reps=5, max_reps=100)
            else:
                r = bench_wall(fn, target_s=0.03, min_reps=5, max_reps=100, sync=sync)
            sink.add(part="links", op=f"{dirn}_{mem}", impl="tensor.copy_ (cudaMemcpyAsync)",
                     bytes=size, note=("wall: host clock incl. launch + sync" if timer == "wall" else "")
                     + (("; " if timer == "wall" and tag else "") + tag if tag else ""), **r)
            out.append(f"{dirn}_{mem}_{timer} {size / r['median_us'] / 1e3:.1f}")
        if size >= (1 << 20) and (size & (size - 1)) == 0 and size.bit_length() % 2 == 1:
            log(f"links {size >> 10} KiB GB/s: " + ", ".join(out))
    # concurrent H2D + D2H on two streams, pinned
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for size in concurrent_sizes:
        if not budget.ok():
            break
        tot, t1, t2 = [], [], []
        for rep in range(23):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
            cur = torch.cuda.current_stream()
            ev[0].record(cur)
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            with torch.cuda.stream(s1):
                ev[1].record(s1)
                dev[:size].copy_(pinned[:size], non_blocking=True)
                ev[2].record(s1)
            with torch.cuda.stream(s2):
                ev[3].record(s2)
                pinned2[:size].copy_(dev2[:size], non_blocking=True)
                ev[4].record(s2)
            cur.wait_stream(s1)
            cur.wait_stream(s2)
            ev[5].record(cur)
            torch.cuda.synchronize()
            if rep >= 3:
                tot.append(ev[0].elapsed_time(ev[5]) * 1e3)
                t1.append(ev[1].elapsed_time(ev[2]) * 1e3)
                t2.append(ev[3].elapsed_time(ev[4]) * 1e3)
        from .timing import stats
        for op, ts, b in (("bidir_concurrent_total", tot, 2 * size), ("h2d_pinned_concurrent", t1, size),
                          ("d2h_pinned_concurrent", t2, size)):
            r = stats(ts)
            sink.add(part="links", op=op, impl="two streams, tensor.copy_ non_blocking", bytes=b,
                     timer="cuda_events", note=f"{size} B each way at once",
                     **{k: v for k, v in r.items()})
        log(f"links concurrent {size >> 20} MiB each way: total {2 * size / stats(tot)['median_us'] / 1e3:.1f} GB/s, "
            f"h2d {size / stats(t1)['median_us'] / 1e3:.1f}, d2h {size / stats(t2)['median_us'] / 1e3:.1f}")
    del dev, dev2, pinned, pinned2, pageable
    free_gpu()
