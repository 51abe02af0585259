"""Device plan: measure the unit costs of SwiftLLM's host path (`simserve/cost/swiftllm_host.py`)
on a GPU machine, in one call of a few minutes. Not run here (no GPU on the project machine);
the constants of `swiftllm_host.py` stay named assumptions until it is.

    python benchmarks/neo_host_probe.py --out $OUT          # on the H200 (+ its Xeon host)

It times, with PyTorch on CUDA (and Triton when installed), the kinds of work NEO's code does on
the host, written independently here (NEO's code is not copied):

- `call`: one eager torch call from Python that launches a small kernel (`F.linear` on a few
  rows, an in-place add), the unit `ITER_CALLS` / `SUBBATCH_CALLS` / `STAGE_CALLS` count;
- `view`: a Python-level slice / view (no kernel), which the counts leave out;
- `triton`: one launch of an already compiled Triton kernel (NEO's paged attention launches
  two per layer);
- `positions`: building the prompt positions of a batch as Python lists and copying them to
  the GPU, by total prompt tokens and prompt count (`PER_TOKEN_US`);
- `requests`: a per-request Python pass of the shape NEO's scheduler, block manager and
  `update_output` make (attribute reads, block arithmetic, list appends), by batch size
  (`PER_SEQ_US`);
- `sync`: a `.tolist()` of an argmax (the sampling sync at the end of every iteration) and a
  CUDA event `synchronize()` (the per-stage q/k/v handshake).

Writes `$OUT/neo_host_probe.csv` (part, size, count, median_us, p10_us, p90_us) and
`$OUT/meta.json` (GPU, CPU, torch / triton versions, date, command).
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def _timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def _row(part, size, count, ts):
    ts = sorted(ts)
    q = statistics.quantiles(ts, n=10)
    return {"part": part, "size": size, "count": count, "median_us": statistics.median(ts),
            "p10_us": q[0], "p90_us": q[-1]}


def probe_calls(torch, rows: list, reps: int) -> None:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    y = torch.zeros(8, 4096, device="cuda", dtype=torch.float16)
    n = 200
    torch.cuda.synchronize()

    def linears():
        for _ in range(n):
            torch.nn.functional.linear(x, w)

    def adds():
        for _ in range(n):
            y.add_(x)

    def views():
        for _ in range(n):
            x[:4].view(4, 32, 128)

    for part, fn in (("call_linear", linears), ("call_add", adds), ("view", views)):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6 / n)   # host time per call (async)
            torch.cuda.synchronize()
        rows.append(_row(part, 8, n, ts))


def probe_triton(torch, rows: list, reps: int) -> None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return

    @triton.jit
    def _k(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1.0, mask=m)

    x = torch.zeros(4096, device="cuda")
    _k[(4,)](x, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    n = 200

    def launches():
        for _ in range(n):
            _k[(4,)](x, 4096, BLOCK=1024)

    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        launches()
        ts.append((time.perf_counter() - t) * 1e6 / n)
        torch.cuda.synchronize()
    rows.append(_row("triton", 4096, n, ts))


def probe_positions(torch, rows: list, reps: int) -> None:
    for count, tokens in ((1, 512), (1, 4096), (4, 4096), (16, 8192), (32, 20480)):
        lens = [tokens // count] * count

        def build():
            pos = []
            for ln in lens:
                pos = pos + list(range(ln))          # list concatenation, prompt by prompt
            torch.tensor(pos, dtype=torch.int32, device="cuda")

        rows.append(_row("positions", tokens, count, _timed(build, reps)))


class _Req:
    __slots__ = ("rid", "prompt_len", "out", "max_out", "blocks")

    def __init__(self, rid):
        self.rid, self.prompt_len, self.out, self.max_out, self.blocks = rid, 700, [1] * 90, 200, 50


def probe_requests(rows: list, reps: int) -> None:
    for batch in (16, 64, 256, 1024):
        reqs = [_Req(i) for i in range(batch)]

        def one_pass():
            rows_left, toks_left, need = 1024, 20480, 0
            ids, lens, new_blocks = [], [], []
            for r in reqs:
                seq = r.prompt_len + len(r.out)
                blk = (seq + 15) // 16
                need += blk
                rows_left -= 1
                toks_left -= 1
                ids.append(r.rid)
                lens.append(seq)
                if blk > r.blocks:
                    new_blocks.extend(r.rid * 1280 + j for j in range(r.blocks, blk))
            done = [r for r in reqs if len(r.out) >= r.max_out]
            return ids, lens, new_blocks, done, need, rows_left, toks_left

        ts = _timed(one_pass, reps)
        rows.append(_row("requests", batch, batch, [t / batch for t in ts]))


def probe_sync(torch, rows: list, reps: int) -> None:
    logits = torch.randn(256, 128256, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    rows.append(_row("sync_tolist", 256, 1, _timed(lambda: torch.argmax(logits, 1).tolist(),
                                                    reps)))
    s = torch.cuda.Stream()
    ev = torch.cuda.Event()

    def handshake():
        with torch.cuda.stream(s):
            ev.record()
        ev.synchronize()

    rows.append(_row("sync_event", 1, 1, _timed(handshake, reps)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("neo_host_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list = []
    probe_calls(torch, rows, a.reps)
    probe_triton(torch, rows, a.reps)
    probe_positions(torch, rows, a.reps)
    probe_requests(rows, a.reps)
    probe_sync(torch, rows, a.reps)
    with open(a.out / "neo_host_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    meta = {"gpu": torch.cuda.get_device_name(0), "cpu": platform.processor(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": tv,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv)}
    (a.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    for r in rows:
        print(f"{r['part']:12s} {r['size']:6d} {r['count']:5d} {r['median_us']:9.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
