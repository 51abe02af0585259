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
`$OUT/meta.json` (GPU, CPU, torch / triton versions, date, command). Afterwards, here:

    python benchmarks/neo_host_probe.py --summarize DIR

prints each measured unit beside the assumption of `swiftllm_host.py` it replaces
(`PER_SEQ_US`, `PER_TOKEN_US`; the per-call cost the `*_CALLS` counts multiply).
`--dry-run` checks the plan and the summary on a synthetic folder, without a GPU.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
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


def write(out: Path, rows: list, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "neo_host_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def summarize(folder: Path) -> dict:
    """The measured units against `swiftllm_host.py`'s assumptions."""
    from simserve.cost import swiftllm_host as H
    with open(folder / "neo_host_probe.csv") as f:
        rows = [dict(r, size=int(r["size"]), median_us=float(r["median_us"]))
                for r in csv.DictReader(f)]
    by = lambda part: [r for r in rows if r["part"] == part]   # noqa: E731
    calls = [r["median_us"] for r in by("call_linear") + by("call_add")]
    pos = by("positions")
    per_token = None
    if len(pos) >= 2:        # least-squares slope of the build time over prompt tokens
        xs, ys = [r["size"] for r in pos], [r["median_us"] for r in pos]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        per_token = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
                     / sum((x - mx) ** 2 for x in xs))
    req = max(by("requests"), key=lambda r: r["size"], default=None)
    one = lambda part: by(part)[0]["median_us"] if by(part) else None   # noqa: E731
    return {"call_us": statistics.median(calls) if calls else None, "view_us": one("view"),
            "triton_launch_us": one("triton"),
            "per_token_us": per_token, "per_seq_us": req["median_us"] if req else None,
            "sync_tolist_us": one("sync_tolist"), "sync_event_us": one("sync_event"),
            "assumed": {"PER_TOKEN_US": H.PER_TOKEN_US, "PER_SEQ_US": H.PER_SEQ_US,
                        "ITER_CALLS": H.ITER_CALLS, "SUBBATCH_CALLS": H.SUBBATCH_CALLS,
                        "STAGE_CALLS": H.STAGE_CALLS}}


def format_summary(d: dict) -> str:
    f = lambda v: "-" if v is None else f"{v:.3f}"   # noqa: E731
    a = d["assumed"]
    return "\n".join([
        f"torch call from Python {f(d['call_us'])} µs (x ITER_CALLS {a['ITER_CALLS']} + "
        f"SUBBATCH_CALLS {a['SUBBATCH_CALLS']} per iteration, STAGE_CALLS {a['STAGE_CALLS']} "
        f"per stage); view {f(d['view_us'])} µs; Triton launch {f(d['triton_launch_us'])} µs",
        f"per token {f(d['per_token_us'])} µs (PER_TOKEN_US assumed {a['PER_TOKEN_US']})",
        f"per request {f(d['per_seq_us'])} µs (PER_SEQ_US assumed {a['PER_SEQ_US']})",
        f"sampling sync {f(d['sync_tolist_us'])} µs; event handshake {f(d['sync_event_us'])} µs"])


def dry_run() -> int:
    """Here, no GPU: the CPU-only part runs for real (the per-request pass), the rest is
    synthetic rows in the probe's layout; packed, checked as a call returns it, summarized."""
    import tempfile
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from simserve import device_check as D
    rows: list = []
    probe_requests(rows, 5)
    for part, size, us in (("call_linear", 8, 6.0), ("call_add", 8, 4.0), ("view", 8, 0.8),
                           ("triton", 4096, 12.0), ("sync_tolist", 256, 40.0),
                           ("sync_event", 1, 8.0)):
        rows.append(_row(part, size, 200, [us * (1 + 0.01 * k) for k in range(10)]))
    for count, tokens in ((1, 512), (4, 4096), (16, 8192)):
        rows.append(_row("positions", tokens, count, [5 + 0.05 * tokens + k for k in range(10)]))
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp) / "raw", rows, {"gpu": "dry-run"})
        out = Path(tmp) / "OUT"
        probs = D.return_problems(os.path.dirname(D.pack(str(Path(tmp) / "raw"), str(out),
                                                          "neo-host")))
        back = Path(D.unpack(str(out / "neo-host.tar.xz"), str(Path(tmp) / "back")))
        d = summarize(back)
        print(format_summary(d))
        if d["per_token_us"] is None or abs(d["per_token_us"] - 0.05) > 1e-6:
            probs.append(f"summary's per-token slope {d['per_token_us']} on rows built at 0.05")
    return D.report("neo_host_probe", probs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="afterwards: the units")
    ap.add_argument("--dry-run", action="store_true", help="check the plan here, no GPU")
    a = ap.parse_args(argv)
    if a.dry_run:
        return dry_run()
    if a.summarize:
        print(format_summary(summarize(a.summarize)))
        return 0
    if a.out is None:
        ap.error("--out is required (or --summarize / --dry-run)")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("neo_host_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows: list = []
    probe_calls(torch, rows, a.reps)
    probe_triton(torch, rows, a.reps)
    probe_positions(torch, rows, a.reps)
    probe_requests(rows, a.reps)
    probe_sync(torch, rows, a.reps)
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    meta = {"gpu": torch.cuda.get_device_name(0), "cpu": platform.processor(),
            "python": platform.python_version(), "torch": torch.__version__, "triton": tv,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv)}
    write(a.out, rows, meta)
    for r in rows:
        print(f"{r['part']:12s} {r['size']:6d} {r['count']:5d} {r['median_us']:9.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
