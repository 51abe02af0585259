"""Assemble measured profiles from a raw calibration folder (no torch needed).

    simserve calibrate fit --raw hwprofiles/raw/h200-sxm --gpu h200-sxm --cpu xeon-emr \
        --link pcie5-x16

GPU: dense, elementwise and LM-head tables per (model, TP) from `gpu_dense.csv`; prefill and
decode attention grids from `gpu_prefill_attn.csv` / `gpu_decode_attn.csv`; the varlen
penalty from the `mixed_*` points; launch costs from `launch.csv`. Where a (model, TP) was not
measured, its table is scaled from the closest measured head layout and says so in `source`;
models with no measured dense ops keep the datasheet roofline tables (`source: derived`).
CPU: dense ops and decode attention per thread count, the fastest implementation per point.
Link: copy time tables and the fitted latency + bytes/bandwidth per direction.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from simserve.calibrate.tables import fit_curve, fit_grid, read_raw
from simserve.hardware import derive
from simserve.hardware.functions import Grid
from simserve.models import CATALOG, get_model

DENSE = ("qkv", "o", "gate_up", "down")
# elementwise kernels of one layer: two fused residual-add RMSNorms, RoPE, KV-cache write,
# SiLU-and-mul, and Qwen3's per-head q/k norm
ELEMENTWISE = {"rmsnorm_add": 2, "rope": 1, "kv_write": 1, "silu_mul": 1, "qk_norm": 1}


def _meta(raw_dir: Path) -> dict:
    p = raw_dir / "meta.json"
    if not p.exists():
        return {}
    m = json.loads(p.read_text())
    return dict(m.get("env", {}), **{k: v for k, v in m.items() if k != "env"})


def _prov(raw_dir: Path, meta: dict, what: str) -> dict:
    gpu = meta.get("gpu", {})
    return {
        "type": "measured",
        "method": what,
        "raw": str(raw_dir),
        "device": gpu.get("name") or meta.get("cpu_model"),
        "cpu": meta.get("cpu_model"),
        "driver": _driver(meta.get("nvidia_smi")),
        "versions": {k: meta.get(k) for k in ("torch", "torch_cuda", "triton", "python")},
        "measured": meta.get("date_utc"),
        "command": meta.get("command"),
        "fitted_by": "simserve calibrate fit",
        "fitted": _dt.date.today().isoformat(),
    }


def _driver(smi: str | None) -> str | None:
    """The driver version from `nvidia-smi --query-gpu=name,driver_version,... --format=csv`."""
    lines = (smi or "").splitlines()
    if len(lines) < 2:
        return None
    fields = [f.strip() for f in lines[1].split(",")]
    return fields[1] if len(fields) > 1 else None


def _start(raw_dir: Path, base: dict, method: str) -> tuple[pd.DataFrame, dict]:
    """The raw points and a measured profile's header (schema, name, kind, provenance, spec)."""
    raw = read_raw(raw_dir)
    prof = {k: base[k] for k in ("schema", "name", "kind")}
    prof["provenance"] = _prov(raw_dir, _meta(raw_dir), method)
    prof["spec"] = base["spec"]
    return raw, prof


def _pts(df: pd.DataFrame, **eq) -> pd.DataFrame:
    m = np.ones(len(df), dtype=bool)
    for k, v in eq.items():
        m &= (df[k] == v).to_numpy()
    return df[m]


# -- GPU -----------------------------------------------------------------------------------
def gpu_tables(raw: pd.DataFrame, model: str, tp: int) -> dict | None:
    d = _pts(raw, part="gpu_dense", model=model, tp=tp)
    if d.empty:
        return None
    e = _pts(raw, part="gpu_elementwise", model=model, tp=tp)
    tokens = np.sort(d.tokens.unique())
    out: dict = {"source": "measured", "tokens": [int(t) for t in tokens]}
    for op in (*DENSE, "lm_head"):
        pts = d[d.op == op]
        out[f"{op}_us"] = _r(fit_curve(op, pts.tokens, pts.median_us)(tokens))
    ew = np.zeros(len(tokens))
    for op, count in ELEMENTWISE.items():
        pts = e[e.op == op]
        if not pts.empty:
            ew += count * np.asarray(fit_curve(op, pts.tokens, pts.median_us)(tokens))
    out["elementwise_us"] = _r(ew)
    return out


def _prefill_grid(raw: pd.DataFrame, model: str, tp: int) -> tuple[Grid, str] | None:
    spec = get_model(model)
    nh, nkv = spec.heads_per_rank(tp)
    pa = _pts(raw, part="gpu_prefill_attn", op="prefill_attn")
    exact = pa[(pa.model == model) & (pa.tp == tp)]
    if not exact.empty:
        return fit_grid("prefill", exact.chunk, exact.context, exact.median_us, "chunk",
                        "context"), "measured"
    # closest measured head layout: same KV heads per rank first, then nearest q heads
    cands = []
    for (m, t), g in pa.groupby(["model", "tp"]):
        h, kv = get_model(m).heads_per_rank(int(t))
        cands.append((kv != nkv, abs(np.log2(h / nh)), m, int(t), h, g))
    if not cands:
        return None
    _, _, m, t, h, g = min(cands, key=lambda c: c[:2])
    grid = fit_grid("prefill", g.chunk, g.context, g.median_us * nh / h, "chunk", "context")
    return grid, f"scaled from {m} TP{t} by q heads per rank {nh}/{h}"


def _decode_grid(raw: pd.DataFrame, model: str, tp: int) -> tuple[Grid, str] | None:
    spec = get_model(model)
    _, nkv = spec.heads_per_rank(tp)
    da = _pts(raw, part="gpu_decode_attn", op="decode_attn")
    if da.empty:
        return None
    best = None
    for (m, t), g in da.groupby(["model", "tp"]):
        kv = get_model(m).heads_per_rank(int(t))[1]
        key = (abs(np.log2(kv / nkv)), m != model)
        if best is None or key < best[0]:
            best = (key, m, int(t), kv, g)
    _, m, t, kv, g = best
    grid = fit_grid("decode", g.batch, g.context, g.median_us, "batch", "context")
    if kv == nkv:
        src = "measured" if m == model else f"measured with {m} TP{t} (same {kv} KV heads per rank)"
        return grid, src
    # memory-bound: kv/nkv as many heads read the same bytes as ctx·nkv/kv tokens
    ctx = grid.ys
    t2 = np.array([grid(b, ctx * nkv / kv) for b in grid.xs])
    return (Grid("decode", "batch", "context", grid.xs, ctx, t2),
            f"scaled from {m} TP{t} ({kv} KV heads per rank) to {nkv} by context")


def _decode_imbalance(raw: pd.DataFrame, sms: int) -> dict | None:
    """Kernel parameters of the split-K decode kernel and its per-program streaming rate,
    fitted (least squares in log time) to the mixed-context points against the equal-context
    grid; see `hardware.attention.SplitImbalance`."""
    from scipy.optimize import minimize_scalar

    from simserve.hardware.triton_kernels_params import DECODE_MIN_SPLIT, DECODE_PROGRAMS_PER_SM
    from simserve.hardware.attention import SplitImbalance
    mx = _pts(raw, part="gpu_decode_attn", op="decode_attn_mixed_ctx")
    if mx.empty:
        return None
    impl = mx.impl.iloc[0]
    block_n = int(impl.split("block_n ")[1].split()[0]) if "block_n " in impl else 64
    params = {"target_programs": DECODE_PROGRAMS_PER_SM * sms, "min_split_tokens": DECODE_MIN_SPLIT,
              "block_n": block_n}
    cases = []
    for (m, t), g in mx.groupby(["model", "tp"]):
        grid, _ = _decode_grid(raw, m, int(t))
        kvh = get_model(m).heads_per_rank(int(t))[1]
        for r in g.itertuples():
            b, cs = int(r.batch), int(r.context_sum)
            cases.append((kvh, b, cs, int(r.context), float(grid(b, cs / b)), float(r.median_us)))

    def loss(log_rate):
        err = 0.0
        for kvh, b, cs, cm, base, meas in cases:
            imb = SplitImbalance(dict(params, kv_heads=kvh, program_tokens_per_us=np.exp(log_rate)))
            err += np.log(base * float(imb.factor(b, cs, cm, base)) / meas) ** 2
        return err

    res = minimize_scalar(loss, bounds=(np.log(1.0), np.log(1000.0)), method="bounded")
    rms = float(np.sqrt(res.fun / len(cases)) * 100)
    before = float(np.sqrt(np.mean([np.log(c[4] / c[5]) ** 2 for c in cases])) * 100)
    return dict(params, program_tokens_per_us=round(float(np.exp(res.x)), 3),
                source=f"fitted to {len(cases)} mixed-context points: RMS log error "
                       f"{rms:.1f}% (equal-context grid alone: {before:.1f}%)")


def _varlen(raw: pd.DataFrame) -> dict | None:
    mx = _pts(raw, part="gpu_prefill_attn", model="llama-3.1-8b", tp=1)
    mx = mx[mx.op.str.startswith("mixed_")]
    if mx.empty:
        return None
    piv = mx.pivot_table(index=["chunk", "batch", "context", "context_sum"], columns="op",
                         values="median_us").reset_index()
    extra = piv["mixed_varlen_one_call"] - piv["mixed_prefill_alone"]
    A = np.stack([np.ones(len(piv)), piv["context_sum"].to_numpy(float)], 1)
    (c0, c1), _ = nnls(A, extra.to_numpy(float))
    return {"const_us": round(float(c0), 4), "per_context_token": float(f"{c1:.6g}"),
            "source": "measured: FA2 varlen over one prefill chunk + decodes, minus the chunk alone"}


def _add_in_situ(prof: dict, path: Path) -> None:
    """The in-situ factor `simserve validate fit` wrote from real-executor runs, if any."""
    if not path.exists():
        return
    f = json.loads(path.read_text())
    prof["overheads"]["in_situ"] = {
        "tokens": f["tokens"], "factor": f["factor"],
        "source": f"{f['source']}; MAPE {f['mape_without_pct']}% without, "
                  f"{f['mape_out_of_fold_pct']}% held out ({f.get('held_out', '2-fold CV')})"}


def _add_sp_contention(prof: dict, path: Path) -> None:
    """Contention factors α, β of Conflux Parallelism's split attention region that
    `simserve validate sp-fit` wrote from real multi-GPU runs, if any."""
    if not path.exists():
        return
    f = json.loads(path.read_text())
    def pct(d):
        return ", ".join(f"{k} {v}%" for k, v in d.items())
    held = pct({k: v["mape_pct"] for k, v in f.get("leave_one_model_out", {}).items()})
    # the spread of the fit: the pooled fit and each fit on all models but one
    fits = [f] + list(f.get("leave_one_model_out", {}).values())
    prof["overheads"]["sp_contention"] = {
        "alpha": f["alpha"], "beta": f["beta"],
        "alpha_range": [min(x["alpha"] for x in fits), max(x["alpha"] for x in fits)],
        "beta_range": [min(x["beta"] for x in fits), max(x["beta"] for x in fits)],
        "source": f"{f['source']}; MAPE {pct(f['mape_pct'])}; fitted on the other model only: "
                  f"{held}; the paper's 1.28 gives {pct(f['paper_mape_pct'])}"}


def _add_sm_share(prof: dict, path: Path) -> None:
    """Spatial-sharing curves (memory and compute throughput vs SM share, co-run slowdowns)
    that `python -m simserve.calibrate.smshare_fit` wrote from green-context runs, if any."""
    if not path.exists():
        return
    f = json.loads(path.read_text())
    m = f["mape_pct"]
    def pct(d):
        return ", ".join(f"{k} {v}%" for k, v in d.items())
    prof["overheads"]["sm_share"] = dict(
        {k: f[k] for k in ("sm_fraction", "bw_fraction", "compute_fraction",
                           "corun_decode_fraction", "decode_contention", "prefill_contention")},
        source=f"{f['source']}; SmShareCost MAPE with these curves {pct(m['measured curves, in sample'])}"
               f" (fitted on the other models: {pct(m['measured curves, fitted on the other models'])}); "
               f"analytic defaults {pct(m['analytic defaults'])}")


def _overheads(raw: pd.DataFrame, base: dict) -> dict:
    oh = dict(base)
    la = _pts(raw, part="launch")
    eager = la[(la.op == "empty_kernel_eager") & la.impl.str.startswith("aten") &
               (la.timer == "cuda_events")]
    graph = la[(la.op == "empty_kernel_graph") & la.impl.str.startswith("aten")]
    if not eager.empty:
        oh["launch_us_per_kernel"] = round(float(eager.median_us.median()), 3)
    if not graph.empty:
        oh["graph_us_per_kernel"] = round(float(graph.median_us.median()), 3)
    oh["source"] = ("launch costs measured (empty PyTorch kernel chains, eager vs CUDA graph); "
                    "iteration_us and per_seq_us still assumed (no serving engine measured)")
    return oh


def _measured_engines(name: str) -> dict | None:
    """The serving engines' host paths the current `name` profile holds (measured by
    `simserve validate engine` from a real engine, not by kernel calibration): a refit of the
    kernel tables keeps them."""
    from simserve.hardware.profile import load_profile
    try:
        return (load_profile(name).overheads or {}).get("engines")
    except Exception:  # noqa: BLE001 - no such profile yet: nothing to keep
        return None


def build_gpu(raw_dir: Path, name: str) -> dict:
    base = derive.gpu_profile(name)
    raw, prof = _start(raw_dir, base, "kernel timings fitted into monotone knot tables and "
                       "grids (simserve/calibrate/tables.py)")
    prof["overheads"] = _overheads(raw, base["overheads"])
    engines = _measured_engines(name)
    if engines:
        prof["overheads"]["engines"] = engines
    _add_in_situ(prof, raw_dir / "in_situ.json")
    _add_sp_contention(prof, raw_dir / "sp_contention.json")
    _add_sm_share(prof, raw_dir / "smshare" / "smshare.json")
    varlen = _varlen(raw)
    imbalance = _decode_imbalance(raw, int(_meta(raw_dir).get("gpu", {}).get("sms") or 132))
    ops = {}
    for m in CATALOG:
        ops[m] = {}
        for tp in derive.GPU_TP:
            t = gpu_tables(raw, m, tp)
            if t is None:
                t = dict(base["ops"][m][f"tp{tp}"], source="derived (roofline; not measured)")
                ops[m][f"tp{tp}"] = t
                continue
            roof = base["ops"][m][f"tp{tp}"]
            pg = _prefill_grid(raw, m, tp)
            dg = _decode_grid(raw, m, tp)
            t["prefill_attn"] = (dict(kind="grid", **pg[0].to_yaml(), source=pg[1]) if pg
                                 else dict(roof["prefill_attn"], source="derived (roofline)"))
            t["decode_attn"] = (dict(kind="grid", **dg[0].to_yaml(), source=dg[1]) if dg
                                else dict(roof["decode_attn"], source="derived (roofline)"))
            if dg and imbalance:
                t["decode_attn"]["imbalance"] = dict(
                    imbalance, kv_heads=get_model(m).heads_per_rank(tp)[1])
            if varlen:
                kv_ratio = get_model(m).heads_per_rank(tp)[1] / 8
                t["varlen_decode"] = dict(varlen, per_context_token=float(
                    f"{varlen['per_context_token'] * kv_ratio:.6g}"))
            ops[m][f"tp{tp}"] = t
    prof["ops"] = ops
    delta = _graph_overlap(raw, ops.get("llama-3.1-8b", {}).get("tp1"), prof["overheads"])
    if delta is not None:
        prof["overheads"]["graph_overlap_us_per_kernel"] = round(delta, 3)
        prof["overheads"]["source"] += ("; graph_overlap_us_per_kernel fitted to whole "
                                        "CUDA-graph-replayed Llama-3.1-8B decode steps")
    return prof


def _graph_overlap(raw: pd.DataFrame, t: dict | None, oh: dict) -> float | None:
    """Per-kernel time that separately timed kernels include but a graph replay hides:
    least squares on the relative error of predicted whole decode steps (launch.csv)."""
    steps = _pts(raw, part="launch", op="decode_step_graph", timer="cuda_events")
    if steps.empty or t is None or t["decode_attn"].get("kind") != "grid":
        return None
    tok = np.asarray(t["tokens"], float)
    dense = lambda b: sum(np.interp(b, tok, t[f"{op}_us"]) for op in (*DENSE, "elementwise"))
    dec = Grid.from_mapping("d", t["decode_attn"])
    L = get_model("llama-3.1-8b").num_layers
    n_k = L * int(oh.get("kernels_per_layer", 10)) + 3  # + final norm, LM head, argmax
    pred, meas = [], []
    for r in steps.itertuples():
        b = float(r.batch)
        pred.append(L * (dense(b) + float(dec(b, r.context + 1))) + np.interp(b, tok, t["lm_head_us"]))
        meas.append(float(r.median_us))
    pred, meas = np.array(pred), np.array(meas)
    delta = float(np.sum((pred - meas) * n_k / meas**2) / np.sum(n_k**2 / meas**2))
    return max(delta, 0.0)


# -- CPU -----------------------------------------------------------------------------------
def build_cpu(raw_dir: Path, name: str) -> dict:
    base = derive.cpu_profile(name)
    raw, prof = _start(raw_dir, base, "bf16 oneDNN (AMX) dense ops and SDPA decode attention; "
                       "fastest implementation per point")
    prof["spec"] = dict(base["spec"], cpu_model=_meta(raw_dir).get("cpu_model"))
    prof["overheads"] = dict(base["overheads"])
    _add_in_situ(prof, raw_dir / "in_situ_cpu.json")
    for path in sorted(raw_dir.glob("in_situ_cpu-*.json")):  # a model's own, where measured
        model = path.stem[len("in_situ_cpu-"):]
        one = {"overheads": {}}
        _add_in_situ(one, path)
        prof["overheads"].setdefault("in_situ", {}).setdefault("by_model", {})[model] = \
            one["overheads"]["in_situ"]
    cpu = _pts(raw, part="cpu")
    copy = cpu[(cpu.op == "stream_copy") & cpu.threads.notna()]
    if not copy.empty:  # the host copy ceiling per thread count (cost_cpu.host_copy_gbps)
        gbps = (copy.bytes / copy.median_us / 1e3).groupby(copy.threads.astype(int)).max()
        prof["overheads"]["host_copy_gbps"] = {int(t): float(g) for t, g in gbps.items()}
    cpu = cpu[cpu.model != ""]  # ceilings (host copy) carry no model
    ops: dict = {}
    for (m, threads), g in cpu.groupby(["model", "threads"]):
        best = g.groupby(["op", "tokens", "batch", "context"], dropna=False).median_us.min()
        best = best.reset_index()
        tokens = np.sort(best[best.op == "qkv"].tokens.unique())
        t: dict = {"source": "measured", "tokens": [int(x) for x in tokens]}
        for op in (*DENSE, "lm_head"):
            pts = best[best.op == op]
            t[f"{op}_us"] = _r(fit_curve(op, pts.tokens, pts.median_us)(tokens))
        da = best[best.op == "decode_attn"]
        if not da.empty:
            t["decode_attn"] = dict(kind="grid", **fit_grid("cpu_decode", da.batch, da.context,
                                                             da.median_us, "batch",
                                                             "context").to_yaml())
        ops.setdefault(m, {})[f"cores{int(threads)}"] = t
    # decode attention reads KV: reuse a measured grid of a model with the same KV heads
    for m, per in ops.items():
        for key, t in per.items():
            if "decode_attn" in t:
                continue
            kv = get_model(m).num_kv_heads
            donors = [(m2, p2[key]) for m2, p2 in ops.items() if key in p2 and "decode_attn" in
                      p2[key] and get_model(m2).num_kv_heads == kv and
                      get_model(m2).head_dim == get_model(m).head_dim]
            if donors:
                m2, t2 = donors[0]
                t["decode_attn"] = dict(t2["decode_attn"], source=f"measured with {m2} heads "
                                        f"(same {kv} KV heads x {get_model(m).head_dim})")
    prof["ops"] = ops
    return prof


# -- links ---------------------------------------------------------------------------------
def build_link(raw_dir: Path, name: str) -> dict:
    base = derive.link_profile(name)
    raw, prof = _start(raw_dir, base, "cudaMemcpyAsync copies, GPU time by CUDA events; "
                       "latency + bytes/bandwidth fitted by non-negative least squares")
    link = dict(base["link"])
    tables = {}
    for direction in ("h2d", "d2h"):
        for mem in ("pinned", "pageable"):
            timer = "cuda_events" if mem == "pinned" else "wall"
            d = _pts(raw, part="links", op=f"{direction}_{mem}", timer=timer)
            if d.empty:
                continue
            lat, per_byte = _fit_latency_bw(d.bytes, d.median_us)
            gbps = 1e-3 / per_byte if per_byte > 0 else float("inf")
            if mem == "pinned":
                link[f"{direction}_gbps"] = round(float(gbps), 2)
                link[f"{direction}_latency_us"] = round(float(lat), 3)
            else:
                link[f"{direction}_{mem}_gbps"] = round(float(gbps), 2)
            c = fit_curve(f"{direction}_{mem}", d.bytes, d.median_us)
            tables[f"{direction}_{mem}"] = {"bytes": [int(v) for v in c.x], "us": _r(c.y)}
    link["latency_us"] = float(max(link.get("h2d_latency_us", 0), link.get("d2h_latency_us", 0)))
    bi = _pts(raw, part="links", op="bidir_concurrent_total")
    if not bi.empty:
        # `bytes` counts both directions together
        link["bidir_total_gbps"] = round(float((bi.bytes / bi.median_us / 1e3).max()), 2)
    prof["link"] = link
    prof["copy_tables"] = tables
    return prof


def build_nvlink(raw_dir: Path, name: str) -> dict:
    """NVLink profile from `collectives.csv` (NCCL between two GPUs of one host)."""
    base = derive.link_profile(name)
    raw, prof = _start(raw_dir, base, "NCCL collectives between 2 GPUs, max over ranks of "
                       "back-to-back loops; latency + bytes/bus-bandwidth fitted by NNLS")
    link = dict(base["link"])
    tables = {}
    col = _pts(raw, part="collectives")
    n = int(_meta(raw_dir).get("world_size", 2))   # ranks of the run (meta.json)

    def fit(op: str, impl_prefix: str, factor: float):
        d = col[(col.op == op) & col.impl.str.startswith(impl_prefix)]
        d = d[~d.impl.str.contains("second pass|host-bound|graph")]
        if d.empty:
            return None
        lat, per_byte = _fit_latency_bw(d.bytes, d.median_us)
        c = fit_curve(op, d.bytes, d.median_us)
        tables[f"{op}_ranks{n}"] = {"bytes": [int(v) for v in c.x], "us": _r(c.y)}
        return float(lat), float(factor * 1e-3 / per_byte)

    ar = fit("allreduce", "nccl all_reduce", 2 * (n - 1) / n)
    if ar:
        link["collective_latency_us"], link["allreduce_busbw_gbps"] = round(ar[0], 3), round(ar[1], 1)
    a2a = fit("alltoall", "nccl all_to_all", (n - 1) / n)
    if a2a:
        link["alltoall_latency_us"], link["alltoall_busbw_gbps"] = round(a2a[0], 3), round(a2a[1], 1)
    p2p = fit("p2p_copy", "tensor.copy_", 1.0)
    if p2p:
        link["latency_us"], link["p2p_gbps"] = round(p2p[0], 3), round(p2p[1], 1)
    link["measured_ranks"] = n
    from simserve.hardware.collective_band import BAND   # published band for more ranks
    link["multi_rank_band"] = dict(BAND)
    prof["link"] = link
    prof["copy_tables"] = tables
    return prof


def _fit_latency_bw(nbytes, us) -> tuple[float, float]:
    """t = latency + bytes·per_byte, non-negative, minimising relative (not absolute) error
    so that small transfers fix the latency and large ones the bandwidth."""
    t = np.asarray(us, dtype=np.float64)
    A = np.stack([np.ones(len(t)), np.asarray(nbytes, dtype=np.float64)], 1) / t[:, None]
    (lat, per_byte), _ = nnls(A, np.ones(len(t)))
    return float(lat), float(per_byte)


def _r(a) -> list[float]:
    return [float(f"{v:.6g}") for v in np.asarray(a, dtype=np.float64)]
