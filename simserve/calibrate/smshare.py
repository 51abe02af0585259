"""Spatial sharing of one GPU's SMs (MuxWise / SGLang pdmux): kernel time on a partition of the
SMs, and the slowdown of decode and prefill when they run at once on disjoint partitions.

    python3 -m simserve.calibrate.smshare --out DIR [--model qwen3-14b --shard 4 --layers 4]

The partitions are CUDA green contexts (driver API through `cuda.bindings`): the device's SMs are
split into one group of `s` SMs for decode and the remaining SMs for prefill, each with its own
stream, as pdmux does. The forward passes are `GpuExecutor`'s (the kernels calibration fits) at a
TP group's per-GPU shapes (`--shard`: 1/shard of the heads, FFN and vocabulary) with the
all-reduces left out: MuxWise's model keeps the measured NCCL time separately.

For each decode SM count `s` and each (decode batch, prefill batch) pair:
- decode alone on its `s` SMs, prefill alone on the other SMs (and both on the whole GPU),
  each a run of back-to-back forward passes queued behind a GPU sleep (no launch gaps);
- both at once: a run of decode passes on the decode partition covering a run of prefill
  passes (at least three decode passes long) on the other partition; per-pass events give
  the decode passes that lie wholly inside the prefill run.
  alpha = median decode pass inside the prefill run / decode alone on s SMs;
  beta  = the prefill run per pass / prefill alone on the other SMs.

Writes smshare.csv (one row per measurement) and meta.json. Needs torch with CUDA, Triton and
cuda-bindings; `simserve.hardware` fits `bw_saturation`, alpha and beta from the CSV
(`simserve calibrate fit` puts them in the profile's `overheads.sm_share`).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time

import torch

from .executor import ExecBatch, GpuExecutor

COLUMNS = ["kind", "decode_sms", "prefill_sms", "decode_batch", "decode_ctx", "prefill_chunk",
           "prefill_ctx", "alone_us", "corun_us", "ratio", "n", "note"]


def _ok(res):
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")
    return res[1] if len(res) == 2 else res[1:]


class Partition:
    """Two green contexts over disjoint SMs of device 0: `s` SMs (rounded up to the driver's
    granularity) and the rest. `.streams` = (decode stream, prefill stream) as torch streams."""

    def __init__(self, s: int):
        from cuda.bindings import driver as cu
        torch.cuda.init()
        dev = _ok(cu.cuDeviceGet(0))
        res = _ok(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        groups, _, rest = _ok(cu.cuDevSmResourceSplitByCount(1, res, 0, s))
        self.sms = (int(groups[0].sm.smCount), int(rest.sm.smCount))
        self._keep = []
        streams = []
        for part in (groups[0], rest):
            desc = _ok(cu.cuDevResourceGenerateDesc([part], 1))
            ctx = _ok(cu.cuGreenCtxCreate(desc, dev,
                                          cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            st = _ok(cu.cuGreenCtxStreamCreate(ctx, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            self._keep.append((ctx, st))
            streams.append(torch.cuda.get_stream_from_external(int(st)))
        self.streams = tuple(streams)


class ShardExecutor(GpuExecutor):
    """A TP group's per-GPU kernels on one GPU, without the all-reduces."""

    def _reduce(self, x):
        return x


def _sleep(stream, cover_s: float):
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(cover_s * 2.0e9))


def _passes(ex, inp, n: int, stream, events: bool):
    """Queue `n` forward passes on `stream`; the start event and the end event of every pass
    (or of the last one only)."""
    with torch.cuda.stream(stream):
        e0 = torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        ends = []
        for i in range(n):
            ex.forward(inp)
            if events or i == n - 1:
                e = torch.cuda.Event(enable_timing=True)
                e.record(stream)
                ends.append(e)
    return e0, ends


def alone_us(ex, inp, stream, n: int, reps: int, cover_s: float) -> float:
    """Median per-pass time (µs) of `n` back-to-back passes on `stream`, over `reps` runs."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        _sleep(stream, cover_s)  # the GPU waits while the host queues the passes
        e0, ends = _passes(ex, inp, n, stream, events=False)
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(ends[-1]) * 1e3 / n)
    return statistics.median(ts)


def corun(ex, dinp, pinp, dstream, pstream, n_dec: int, n_pre: int, cover_s: float) -> dict:
    """`n_pre` prefill passes on `pstream` beside `n_dec` decode passes on `dstream`, both
    queued behind sleeps started together (so both start when the sleeps end). The prefill
    run's time per pass, the decode passes wholly inside the prefill run, and whether the
    decode run covered the whole prefill run."""
    torch.cuda.synchronize()
    _sleep(pstream, cover_s)
    _sleep(dstream, cover_s)
    p0, pends = _passes(ex, pinp, n_pre, pstream, events=False)
    d0, dends = _passes(ex, dinp, n_dec, dstream, events=True)
    torch.cuda.synchronize()
    p_start = d0.elapsed_time(p0) * 1e3          # µs after the decode run's start
    p_end = d0.elapsed_time(pends[-1]) * 1e3
    t = [0.0] + [d0.elapsed_time(e) * 1e3 for e in dends]
    inside = [t[i + 1] - t[i] for i in range(n_dec) if t[i] >= p_start and t[i + 1] <= p_end]
    return {"prefill_us": (p_end - p_start) / n_pre, "decode_inside": inside,
            "covered": t[0] <= p_start + 50 and t[-1] >= p_end, "start_gap_us": p_start}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="qwen3-14b")
    ap.add_argument("--shard", type=int, default=4, help="per-GPU shapes of a TP group of this size")
    ap.add_argument("--layers", type=int, default=4,
                    help="layers per pass (0: the whole model; co-run slowdowns are fitted "
                         "from whole-model runs where there are any)")
    ap.add_argument("--decode-sms", default="16,24,32,48,64")
    ap.add_argument("--alone-sms", default="8,16,24,32,40,48,56,64,80,96,112",
                    help="partition sizes for the alone-only scaling curves")
    ap.add_argument("--decodes", default="96x8192,32x4096", help="BxCTX decode batches")
    ap.add_argument("--prefills", default="8192x0,2048x8192", help="CHUNKxCTX prefill batches")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420.0)
    return ap


class _Rows:
    """smshare.csv, flushed after every row."""

    def __init__(self, path: str):
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS)
        self.w.writeheader()

    def __call__(self, **r):
        self.w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
        self.f.flush()

    def close(self):
        self.f.close()


def _host_times(ex, dinps: dict, pinps: dict) -> dict:
    """Warm up every input once (Triton JIT, cuBLAS heuristics), then the host time (s) to queue
    one pass of each, keyed ("d", decode) / ("p", prefill)."""
    for inp in [*dinps.values(), *pinps.values()]:
        ex.forward(inp)
    torch.cuda.synchronize()
    host = {}
    for key, inp in [*((("d", d), i) for d, i in dinps.items()),
                     *((("p", q), i) for q, i in pinps.items())]:
        t0 = time.perf_counter()
        ex.forward(inp)
        host[key] = time.perf_counter() - t0
        torch.cuda.synchronize()
    return host


def _whole_gpu(ex, dinps, pinps, full, reps: int, total: int, cover, row) -> dict:
    """Each decode and prefill batch alone on the whole GPU (`full`, a stream outside any
    partition): the baselines of every ratio."""
    base = {}
    for d, inp in dinps.items():
        base["d", d] = alone_us(ex, inp, full, 10, reps, cover(10, d=d))
        row(kind="decode_alone", decode_sms=total, decode_batch=d[0], decode_ctx=d[1],
            alone_us=base["d", d], n=reps)
    for p, inp in pinps.items():
        base["p", p] = alone_us(ex, inp, full, 2, reps, 2 * cover(0, p=p))
        row(kind="prefill_alone", prefill_sms=total, prefill_chunk=p[0], prefill_ctx=p[1],
            alone_us=base["p", p], n=reps)
    print("whole GPU (us):", {str(k): round(v, 1) for k, v in base.items()}, flush=True)
    return base


def _partitions(a, meta: dict) -> dict:
    """A green-context partition per size asked for; a size the driver refuses is reported
    and left out."""
    parts = {}
    for s in sorted({int(x) for x in a.alone_sms.split(",")} | {int(x) for x in a.decode_sms.split(",")}):
        try:
            parts[s] = Partition(s)
        except Exception as e:  # noqa: BLE001 - record and go on with the other sizes
            print(f"partition {s}: {e!r}", flush=True)
            continue
        meta["partitions"][s] = parts[s].sms
    return parts


def _alone_on_partitions(ex, dinps, pinps, parts, base, a, t_start, cover, row) -> None:
    """Decode and prefill each alone on a partition's `s`-SM group (the scaling curves);
    prefill points stop at half the budget."""
    for s, pt in parts.items():
        ds, _ = pt.streams
        for d, inp in dinps.items():
            t = alone_us(ex, inp, ds, 10, a.reps, cover(10, d=d))
            row(kind="decode_alone", decode_sms=pt.sms[0], decode_batch=d[0], decode_ctx=d[1],
                alone_us=t, ratio=t / base["d", d], n=a.reps)
        for p, inp in pinps.items():
            if time.monotonic() - t_start > a.budget_s * 0.5:
                break
            t = alone_us(ex, inp, ds, 1, 3, cover(0, p=p))
            row(kind="prefill_alone", prefill_sms=pt.sms[0], prefill_chunk=p[0], prefill_ctx=p[1],
                alone_us=t, ratio=t / base["p", p], n=3)
        print(f"alone on {pt.sms[0]} SMs done ({time.monotonic() - t_start:.0f} s)", flush=True)


def _corun_partitions(ex, dinps, pinps, parts, base, a, t_start, host, cover, row) -> None:
    """Decode on the `s`-SM group beside prefill on the rest, for every decode SM count."""
    for s in [int(x) for x in a.decode_sms.split(",")]:
        if s not in parts:
            continue
        pt = parts[s]
        ds, ps = pt.streams
        for p, pinp in pinps.items():
            p_rest = alone_us(ex, pinp, ps, 1, a.reps, cover(0, p=p))
            row(kind="prefill_alone", prefill_sms=pt.sms[1], prefill_chunk=p[0], prefill_ctx=p[1],
                alone_us=p_rest, ratio=p_rest / base["p", p], n=a.reps)
            for d, dinp in dinps.items():
                if time.monotonic() - t_start > a.budget_s:
                    break
                _corun_point(ex, pt, d, dinp, p, pinp, p_rest, a.reps, host, cover, row)


def _corun_point(ex, pt, d, dinp, p, pinp, p_rest: float, reps: int, host, cover, row) -> None:
    """One (decode batch, prefill batch) pair co-running on `pt`: decode alone on its SMs, then
    `reps` co-runs; rows corun_decode and corun_prefill (or one corun row when no run covered)."""
    ds, ps = pt.streams
    d_s = alone_us(ex, dinp, ds, 10, reps, cover(10, d=d))
    # the prefill run holds >= 3 decode passes; the decode run covers it even if
    # decode slows 2x
    n_pre = max(1, -(-3 * d_s // p_rest))
    n_dec = int(2.0 * n_pre * p_rest / d_s) + 4
    c = cover(n_dec, d=d, p=p) + 1.5 * (n_pre - 1) * host["p", p]
    rs = [corun(ex, dinp, pinp, ds, ps, n_dec, int(n_pre), c) for _ in range(reps)]
    good = [r for r in rs if r["covered"] and r["decode_inside"]]
    note = f"{len(good)}/{len(rs)} runs covered; start gap " \
           f"{statistics.median(r['start_gap_us'] for r in rs):.0f} us"
    if not good:
        row(kind="corun", decode_sms=pt.sms[0], prefill_sms=pt.sms[1],
            decode_batch=d[0], decode_ctx=d[1], prefill_chunk=p[0], prefill_ctx=p[1],
            note="no covered run: " + note)
        return
    pre = statistics.median(r["prefill_us"] for r in good)
    dec = statistics.median(x for r in good for x in r["decode_inside"])
    note += f"; {int(n_pre)} prefill and {n_dec} decode passes"
    common = dict(decode_sms=pt.sms[0], prefill_sms=pt.sms[1], decode_batch=d[0],
                  decode_ctx=d[1], prefill_chunk=p[0], prefill_ctx=p[1], n=len(good),
                  note=note)
    row(kind="corun_decode", alone_us=d_s, corun_us=dec, ratio=dec / d_s, **common)
    row(kind="corun_prefill", alone_us=p_rest, corun_us=pre, ratio=pre / p_rest,
        **common)
    print(f"s={pt.sms}: decode {d} {d_s:.0f}->{dec:.0f} us (x{dec / d_s:.3f}), "
          f"prefill {p} {p_rest:.0f}->{pre:.0f} us (x{pre / p_rest:.3f}); {note}",
          flush=True)


def main(argv=None) -> None:
    a = _parser().parse_args(argv)
    t_start = time.monotonic()
    os.makedirs(a.out, exist_ok=True)
    total = torch.cuda.get_device_properties(0).multi_processor_count
    ex = ShardExecutor(a.model, layers=a.layers, kv_pool_gib=24.0, launch="queued", tp=a.shard,
                       max_tokens=16384)
    decs = [tuple(int(v) for v in x.split("x")) for x in a.decodes.split(",")]
    pres = [tuple(int(v) for v in x.split("x")) for x in a.prefills.split(",")]
    dinps = {d: ex.prepare(ExecBatch(decode_ctx=[d[1]] * d[0])) for d in decs}
    pinps = {p: ex.prepare(ExecBatch(chunks=[p[0]], chunk_ctx=[p[1]], chunk_sample=[True]))
             for p in pres}
    meta = {"model": a.model, "shard": a.shard, "layers": a.layers, "device_sms": total,
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "partitions": {}}
    row = _Rows(os.path.join(a.out, "smshare.csv"))
    full = torch.cuda.Stream()
    # host time to queue one pass (s): sizes the GPU sleeps that hide the queueing
    host = _host_times(ex, dinps, pinps)
    meta["host_queue_ms_per_pass"] = {str(k): round(v * 1e3, 3) for k, v in host.items()}

    def cover(n_dec, d=None, p=None):
        return 1.5 * ((host["d", d] * n_dec if d else 0.0) + (host["p", p] if p else 0.0)) + 0.005
    base = _whole_gpu(ex, dinps, pinps, full, a.reps, total, cover, row)
    parts = _partitions(a, meta)
    _alone_on_partitions(ex, dinps, pinps, parts, base, a, t_start, cover, row)
    _corun_partitions(ex, dinps, pinps, parts, base, a, t_start, host, cover, row)
    row.close()
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)


if __name__ == "__main__":
    main()
