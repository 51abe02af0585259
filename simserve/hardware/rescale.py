"""Derive a profile for hardware nobody here can run from a measured one, by datasheet ratios.

Every table point of the measured device is split into a fixed part (the kernel floor: 80 % of
the table's smallest time, at most 4 µs) and a part that follows the roofline. The roofline part
is scaled by max(F/P', B/W') / max(F/P, B/W) at that point — FLOPs F and bytes B of the op at
that point, peak bf16 rate P and memory bandwidth W of the measured (unprimed) and target
(primed) devices from their datasheets — so compute-bound regimes scale by the peak-FLOPs
ratio and memory-bound regimes by the bandwidth ratio, and the measured efficiency carries over.

    python -m simserve.hardware.rescale --from h200-sxm --to h100-sxm h20 rtx4090
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
from pathlib import Path

import numpy as np

from simserve.hardware import datasheets as ds
from simserve.hardware.derive import gpu_profile, write_profile
from simserve.hardware.profile import load_profile
from simserve.paths import REPO_ROOT, profile_write_dir
from simserve.models import DTYPE_BYTES, get_model

FLOOR_FRACTION, FLOOR_MAX_US = 0.8, 4.0


def _scale(t, flops, nbytes, src: tuple[float, float], dst: tuple[float, float]):
    t = np.asarray(t, dtype=np.float64)
    floor = min(FLOOR_FRACTION * float(t.min()), FLOOR_MAX_US)
    r_src = np.maximum(flops / src[0], nbytes / src[1])
    r_dst = np.maximum(flops / dst[0], nbytes / dst[1])
    ratio = np.where(r_src > 0, r_dst / np.where(r_src > 0, r_src, 1.0), 1.0)
    return floor + (t - floor) * ratio


def _r(a):
    return [float(f"{v:.6g}") for v in np.asarray(a, dtype=np.float64).ravel()]


def _scale_gemms(t: dict, out: dict, m, tp: int, src, dst) -> None:
    tok = np.asarray(t["tokens"], dtype=np.float64)
    for g in (*m.gemms(tp), m.lm_head(tp)):
        F = 2.0 * tok * g.k * g.n
        B = (g.k * g.n + tok * (g.k + g.n)) * DTYPE_BYTES
        out[f"{g.name}_us"] = _r(_scale(t[f"{g.name}_us"], F, B, src, dst))


def _scale_decode_grid(da: dict, m, tp: int, src, dst) -> dict:
    b = np.asarray(da["batch"], float)[:, None]
    x = np.asarray(da["context"], float)[None, :]
    nh, nkv = m.heads_per_rank(tp)
    us = _scale(da["us"], 4.0 * nh * m.head_dim * b * x,
                2.0 * b * x * nkv * m.head_dim * DTYPE_BYTES, src, dst)
    return dict(da, us=[_r(row) for row in us])


def _scale_imbalance(imb: dict, src_ds: dict, dst_ds: dict) -> dict:
    """The split-K decode kernel on another GPU: it aims for the same programs per SM, and a
    program streams at its SM's share of the memory bandwidth."""
    from simserve.hardware.triton_kernels_params import DECODE_PROGRAMS_PER_SM
    per_sm = (dst_ds["mem_bandwidth_gbps"] / dst_ds["sms"]) / (src_ds["mem_bandwidth_gbps"] / src_ds["sms"])
    return dict(imb, target_programs=DECODE_PROGRAMS_PER_SM * int(dst_ds["sms"]),
                program_tokens_per_us=round(float(imb["program_tokens_per_us"]) * per_sm, 3),
                source=f"{imb.get('source', 'measured')}; scaled to {dst_ds['sms']} SMs and "
                       f"{dst_ds['mem_bandwidth_gbps']} GB/s")


# vLLM's FLASH_ATTN backend runs FlashAttention 3 on Hopper (sm_90) and FlashAttention 2
# elsewhere: FA3 tables timed on the H200 carry over only to another Hopper GPU
HOPPER = ("h100-sxm", "h200-sxm", "h20")


def carry_engines(engines: dict, src_name: str, dst_name: str, src, dst) -> dict:
    """A measured GPU's serving-engine entries (`overheads.engines`, `simserve.cost.host`) for
    a derived GPU: the host path (engine-core step work, async overlap, API-server front end)
    is the host CPU's and carries over as measured; vLLM's attention tables are rescaled by
    datasheet ratios like the profile's own, on Hopper targets only (FA3 is Hopper's),
    and the in-situ factor with them. Each entry says `carried_from`: a policy's default
    engine uses only entries measured on the GPU itself (`engine_host`)."""
    out = {}
    for name, e in engines.items():
        e = copy.deepcopy(e)
        e["carried_from"] = src_name
        att = e.pop("attention", None) or {}
        if dst_name in HOPPER and att:
            e["attention"] = {}
            for model, tabs in att.items():
                t = rescale_ops(dict(tabs, tokens=[1], elementwise_us=[1.0],
                                     **{f"{g.name}_us": [1.0] for g in (*get_model(model).gemms(1),
                                                                         get_model(model).lm_head(1))}),
                                model, 1, src, dst)
                e["attention"][model] = {k: t[k] for k in tabs}
        else:
            e.pop("gpu_in_situ", None)   # fitted against vLLM's FA3 tables
        e["source"] = (f"carried over from {src_name} (host path as measured there, not "
                       f"validated on {dst_name}" + ("; vLLM's attention tables rescaled by "
                                                     "datasheet ratios)" if "attention" in e else
                                                     "; no FA3 tables: not a Hopper GPU)")
                       + ": " + str(e.get("source", "")))
        out[name] = e
    return out


def rescale_ops(t: dict, model: str, tp: int, src, dst, src_ds=None, dst_ds=None) -> dict:
    m = get_model(model)
    out = copy.deepcopy(t)
    tok = np.asarray(t["tokens"], dtype=np.float64)
    _scale_gemms(t, out, m, tp, src, dst)
    nh, nkv = m.heads_per_rank(tp)
    hd = m.head_dim
    per_tok = (2 * 4 * m.hidden + 3 * (nh + nkv) * hd + 3 * m.ffn // tp) * DTYPE_BYTES
    out["elementwise_us"] = _r(_scale(t["elementwise_us"], 0.0 * tok, tok * per_tok, src, dst))
    pa = t["prefill_attn"]
    if pa.get("kind") == "grid":
        c = np.asarray(pa["chunk"], float)[:, None]
        x = np.asarray(pa["context"], float)[None, :]
        F = 4.0 * nh * hd * c * (x + (c + 1) / 2)
        B = (2 * c * nh + 2 * (x + c) * nkv) * hd * DTYPE_BYTES
        us = _scale(pa["us"], F, B, src, dst)
        out["prefill_attn"]["us"] = [_r(row) for row in us]
    if t["decode_attn"].get("kind") == "grid":
        out["decode_attn"] = _scale_decode_grid(t["decode_attn"], m, tp, src, dst)
        if "imbalance" in t["decode_attn"] and src_ds and dst_ds:
            out["decode_attn"]["imbalance"] = _scale_imbalance(t["decode_attn"]["imbalance"],
                                                               src_ds, dst_ds)
    if "varlen_decode" in t:
        v = dict(t["varlen_decode"])
        v["per_context_token"] = float(f"{v['per_context_token'] * src[1] / dst[1]:.6g}")
        out["varlen_decode"] = v
    out["source"] = f"derived from {t.get('source', 'measured')} tables by datasheet ratios"
    return out


def rescale_sm_share(share: dict, src_name: str, s: dict, d: dict) -> dict:
    """Spatial-sharing curves for a GPU with the same SMs (count and peak) but another HBM: an
    SM partition draws the same absolute bandwidth (the SMs' outstanding requests set it), so
    its share of the target's bandwidth scales by W_src / W_dst, capped at 1. The compute curve
    and the co-run slowdowns are the SMs' own and are carried over (not measured on the target)."""
    k = s["mem_bandwidth_gbps"] / d["mem_bandwidth_gbps"]
    out = dict(share)
    out["bw_fraction"] = [round(min(1.0, v * k), 4) for v in share["bw_fraction"]]
    out["source"] = (f"carried over from {src_name} (same {s['sms']} SMs; bandwidth shares x "
                     f"{s['mem_bandwidth_gbps']}/{d['mem_bandwidth_gbps']}, capped at 1; not "
                     f"measured on this GPU): " + share.get("source", ""))
    return out


# ASSUMPTION (unmeasured): decode attention co-running with a prefill never holds more than
# 90 % of the SMs, so a derived beta stays finite (beta <= 10) on a GPU whose bandwidth per SM
# is far above the H200's; no derived GPU reaches it (H20, the highest, gets a share of 0.59)
SP_SHARE_CAP = 0.9


def _beta_for(beta_src: float, k: float) -> float:
    share = min(SP_SHARE_CAP, (1.0 - 1.0 / beta_src) * k)
    return round(1.0 / (1.0 - share), 3)


def rescale_sp_contention(c: dict, src_name: str, s: dict, d: dict) -> dict:
    """Conflux Parallelism's split-attention contention (α decode, β prefill) for another GPU,
    by the rule `rescale_sm_share` uses: co-running decode attention holds the SMs it needs
    to stream KV at the GPU's HBM rate, and an SM draws the same bandwidth on every GPU, so
    decode's SM share scales with bandwidth per SM, k = (W'/N') / (W/N). The prefill path
    keeps the rest: β = 1 / (1 − share), share = (1 − 1/β_measured) · k (at most 0.9). The
    decode path's slowdown α − 1 scales by the same k. Ranges (the measurement's
    leave-one-model-out spread) follow the same rule. Not measured on the target."""
    k = (d["mem_bandwidth_gbps"] / d["sms"]) / (s["mem_bandwidth_gbps"] / s["sms"])
    out = {"alpha": round(1.0 + (float(c["alpha"]) - 1.0) * k, 3),
           "beta": _beta_for(float(c["beta"]), k)}
    for key, f in (("alpha_range", lambda a: round(1.0 + (a - 1.0) * k, 3)),
                   ("beta_range", lambda b: _beta_for(b, k))):
        if key in c:
            out[key] = [f(float(v)) for v in c[key]]
    out["rule"] = (f"derived from {src_name}'s measured alpha {c['alpha']}, beta {c['beta']}: decode "
                   f"attention's SM share x {k:.3f} (bandwidth per SM {d['mem_bandwidth_gbps']}/"
                   f"{d['sms']} vs {s['mem_bandwidth_gbps']}/{s['sms']} GB/s), beta = 1/(1 - "
                   f"share); not measured on this GPU (simserve/hardware/rescale.py)")
    out["source"] = f"carried over from {src_name}: " + str(c.get("source", ""))
    return out


def rescale_gpu(src_name: str, dst_name: str) -> dict:
    src_p = load_profile(src_name, expect_kind="gpu")
    if src_p.provenance_type != "measured":
        raise ValueError(f"{src_name} is not a measured profile")
    s, d = ds.GPUS[src_name], ds.GPUS[dst_name]
    src = (s["bf16_tflops"] * 1e12, s["mem_bandwidth_gbps"] * 1e9)
    dst = (d["bf16_tflops"] * 1e12, d["mem_bandwidth_gbps"] * 1e9)
    roof = gpu_profile(dst_name)  # for tables the measured profile does not have
    prof = {k: roof[k] for k in ("schema", "name", "kind", "spec")}
    prof["provenance"] = {
        "type": "derived",
        "method": (f"measured {src_name} tables scaled point by point: compute-bound part by "
                   f"bf16 peak {d['bf16_tflops']}/{s['bf16_tflops']} TFLOPS, memory-bound part by "
                   f"bandwidth {d['mem_bandwidth_gbps']}/{s['mem_bandwidth_gbps']} GB/s, kernel "
                   f"floor kept (simserve/hardware/rescale.py)"),
        "from": src_name,
        "from_provenance": {k: src_p.provenance.get(k) for k in ("device", "measured", "command")},
        "generated_by": f"python -m simserve.hardware.rescale --from {src_name} --to {dst_name}",
        "date": _dt.date.today().isoformat(),
    }
    prof["overheads"] = dict(src_p.overheads, source=f"host costs as measured/assumed for {src_name}")
    if prof["overheads"].get("engines"):
        prof["overheads"]["engines"] = carry_engines(prof["overheads"]["engines"], src_name,
                                                     dst_name, src, dst)
    # Conflux Parallelism's contention α, β: the measured pair rescaled by bandwidth per SM
    contention = prof["overheads"].pop("sp_contention", None)
    if contention:
        prof["overheads"]["sp_contention"] = rescale_sp_contention(contention, src_name, s, d)
    share = prof["overheads"].pop("sm_share", None)
    if share and s["sms"] == d["sms"] and s["bf16_tflops"] == d["bf16_tflops"]:
        prof["overheads"]["sm_share"] = rescale_sm_share(share, src_name, s, d)
    if "in_situ" in prof["overheads"]:
        prof["overheads"]["in_situ"] = dict(
            prof["overheads"]["in_situ"],
            source=f"carried over from {src_name} (not validated on {dst_name}): "
                   + prof["overheads"]["in_situ"].get("source", ""))
    ops = {}
    for model, per_tp in src_p.raw_ops.items():
        ops[model] = {}
        for key, t in per_tp.items():
            if str(t.get("source", "")).startswith("derived"):
                ops[model][key] = roof["ops"][model][key]
            else:
                ops[model][key] = rescale_ops(t, model, int(key[2:]), src, dst, s, d)
    prof["ops"] = ops
    return prof


def _cpu_ceilings(src_p, src_cores: int):
    """The measured source's ceilings at `src_cores` threads: best dense FLOP rate per model
    (tokens >= 256), the best over models, and the host copy bandwidth (GB/s)."""
    from simserve.hardware.raw import read_raw  # measured ceilings live with the raw points
    raw_dir = REPO_ROOT / src_p.provenance["raw"]
    if not raw_dir.is_dir():
        raise ValueError(f"{src_p.name}: raw points {raw_dir} not found (they live in the source "
                         "repository, not in an installed package)")
    raw = read_raw(raw_dir)
    cpu = raw[(raw.part == "cpu") & (raw.threads == src_cores)]
    copy_gbps = float((cpu[cpu.op == "stream_copy"].bytes / cpu[cpu.op == "stream_copy"].median_us
                       / 1e3).max())
    dense = cpu[cpu.op.isin(["qkv", "o", "gate_up", "down", "lm_head"]) & (cpu.tokens >= 256)]
    # the measured efficiency carries over per model: each model's tables are scaled against
    # the best FLOP rate measured with its own shapes (noisy VM: one ceiling per shape set)
    flops_by_model = (dense.flops / dense.median_us * 1e6).groupby(dense.model).max().to_dict()
    return flops_by_model, max(flops_by_model.values()), copy_gbps


def _cpu_ops(src_p, src_cores: int, dst_cores: int, ceilings, dst) -> dict:
    flops_by_model, flops, copy_gbps = ceilings
    ops = {}
    for model, per in src_p.raw_ops.items():
        t = per.get(f"cores{src_cores}")
        if t is None:
            continue
        m = get_model(model)
        src = (flops_by_model.get(model, flops), copy_gbps * 1e9)
        out = copy.deepcopy(t)
        _scale_gemms(t, out, m, 1, src, dst)
        if "decode_attn" in t:
            out["decode_attn"] = _scale_decode_grid(t["decode_attn"], m, 1, src, dst)
        out["source"] = "derived from measured tables by ceiling ratios"
        ops[model] = {f"cores{dst_cores}": out}
    return ops


def _anchored_ceiling(dst_name: str, dst_cores: int, build, d: dict):
    """(compute ceiling in FLOP/s, the anchor it was fitted to) for the target's first
    `fit: true` anchor that applies at `dst_cores`; (None, None) if none applies."""
    from simserve.hardware import anchors as A
    for a in A.ANCHORS.get(dst_name, []):
        if a.get("fit") and int(a.get("cores", dst_cores)) == dst_cores:
            peak = dst_cores * d["amx_bf16_flop_per_cycle_per_core"] * 1e9
            return A.fit_ceiling(build, a, 0.01 * peak * d["base_ghz"],
                                 peak * d["turbo_ghz"]), a
    return None, None


def rescale_cpu(src_name: str, dst_name: str, src_cores: int, dst_cores: int) -> dict:
    """CPU tables measured at `src_cores` threads, scaled to `dst_cores` cores of another CPU.
    Source peaks are the measured ceilings (best dense FLOP rate, host copy bandwidth). Target:
    memory bandwidth datasheet × efficiency (datasheets.py); compute ceiling set so that the
    profile meets its published anchor (`anchors.py`, `fit: true`) where one applies at these
    cores, else datasheet × AMX efficiency."""
    from simserve.hardware import anchors as A
    from simserve.hardware.profile import HardwareProfile
    src_p = load_profile(src_name, expect_kind="cpu")
    if src_p.provenance_type != "measured":
        raise ValueError(f"{src_name} is not a measured profile")
    ceilings = _cpu_ceilings(src_p, src_cores)
    flops, copy_gbps = ceilings[1], ceilings[2]
    d = ds.CPUS[dst_name]
    eff = ds.CPU_EFFICIENCY
    nominal = dst_cores * d["base_ghz"] * 1e9 * d["amx_bf16_flop_per_cycle_per_core"]
    mem = min(d["dram_gbps_peak"] * eff["memory"], dst_cores * eff["per_core_gbps"]) * 1e9
    roof = derive_cpu(dst_name)

    def build(p):
        return HardwareProfile(name=dst_name, kind="cpu", path=Path(f"<{dst_name} at {p:.4g}>"),
                               provenance={"type": "derived"}, spec=roof["spec"],
                               raw_ops=_cpu_ops(src_p, src_cores, dst_cores, ceilings, (p, mem)))
    ceiling, fitted = _anchored_ceiling(dst_name, dst_cores, build, d)
    how = (f"compute ceiling {ceiling / 1e12:.2f} TFLOP/s set to meet anchor {fitted['id']} "
           f"({ceiling / nominal:.3f} of {dst_cores} cores x base clock x 1024 FLOP/cycle; "
           f"the AMX efficiency {eff['amx']} gave {eff['amx'] * nominal / 1e12:.2f})"
           if fitted else f"datasheet x AMX efficiency {eff['amx']}: "
                          f"{eff['amx'] * nominal / 1e12:.2f} TFLOP/s")
    dst = (ceiling or eff["amx"] * nominal, mem)
    prof = {k: roof[k] for k in ("schema", "name", "kind", "spec")}
    prof["provenance"] = {
        "type": "derived",
        "method": (f"measured {src_name} tables at {src_cores} threads (ceilings: up to "
                   f"{flops / 1e12:.2f} TFLOP/s dense, per model shapes, {copy_gbps:.1f} GB/s "
                   f"copy) scaled to {dst_cores} cores of {dst_name} ({how}; memory "
                   f"{dst[1] / 1e9:.0f} GB/s, datasheet x efficiency)"),
        "from": src_name,
        "generated_by": f"python -m simserve.hardware.rescale --cpu {src_name}:{src_cores} "
                        f"{dst_name}:{dst_cores}",
        "date": _dt.date.today().isoformat(),
        "anchors": [dict(a) for a in A.ANCHORS.get(dst_name, [])],
    }
    prof["overheads"] = roof["overheads"]
    prof["ops"] = _cpu_ops(src_p, src_cores, dst_cores, ceilings, dst)
    return prof


def rescale_link(src_name: str, dst_name: str) -> dict:
    """A host link scaled from a measured one by the ratio of theoretical per-direction rates;
    latencies kept."""
    from simserve.hardware.derive import link_profile
    src_p = load_profile(src_name, expect_kind="link")
    ratio = ds.LINKS[dst_name]["theoretical_gbps_per_dir"] / ds.LINKS[src_name]["theoretical_gbps_per_dir"]
    base = link_profile(dst_name)
    prof = {k: base[k] for k in ("schema", "name", "kind", "spec")}
    prof["provenance"] = {
        "type": "derived",
        "method": f"measured {src_name} bandwidths x {ratio:.3f} (theoretical per-direction rate "
                  f"{ds.LINKS[dst_name]['theoretical_gbps_per_dir']} / "
                  f"{ds.LINKS[src_name]['theoretical_gbps_per_dir']} GB/s); latencies kept",
        "from": src_name,
        "generated_by": f"python -m simserve.hardware.rescale --link {src_name} {dst_name}",
        "date": _dt.date.today().isoformat(),
    }
    prof["link"] = {k: (round(v * ratio, 2) if k.endswith("_gbps") else v)
                    for k, v in src_p.link.items()}
    tables = {}
    for key, t in src_p.tables.items():
        us = np.asarray(t["us"], dtype=np.float64)
        lat = float(us.min())
        tables[key] = {"bytes": t["bytes"], "us": _r(lat + (us - lat) / ratio)}
    prof["copy_tables"] = tables
    return prof


def derive_cpu(name: str) -> dict:
    from simserve.hardware.derive import cpu_profile
    return cpu_profile(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", default="h200-sxm")
    ap.add_argument("--to", nargs="+", default=["h100-sxm", "h20", "rtx4090"])
    ap.add_argument("--cpu", nargs="*", metavar="NAME:CORES",
                    help="CPU mode: SOURCE:THREADS then TARGET:CORES pairs, e.g. "
                         "xeon-emr:12 xeon-silver-4510:12")
    ap.add_argument("--link", nargs="*", metavar="NAME", help="link mode: SOURCE TARGET...")
    ap.add_argument("--out", help="default: simserve/data/hwprofiles in a source checkout, else "
                    "~/.config/simserve/hwprofiles")
    args = ap.parse_args(argv)
    args.out = args.out or str(profile_write_dir())
    if args.link:
        src, *targets = args.link
        for name in targets:
            print(write_profile(rescale_link(src, name), Path(args.out) / f"{name}.yaml"))
        return 0
    if args.cpu:
        (src, sc), *targets = [(a.split(":")[0], int(a.split(":")[1])) for a in args.cpu]
        merged: dict[str, dict] = {}
        for name, cores in targets:  # several core counts of one CPU go into one profile
            prof = rescale_cpu(src, name, sc, cores)
            if name in merged:
                for model, per in prof["ops"].items():
                    merged[name]["ops"].setdefault(model, {}).update(per)
                merged[name]["provenance"]["method"] += "; " + prof["provenance"]["method"]
            else:
                merged[name] = prof
        for name, prof in merged.items():
            print(write_profile(prof, Path(args.out) / f"{name}.yaml"))
        return 0
    for name in args.to:
        print(write_profile(rescale_gpu(args.src, name), Path(args.out) / f"{name}.yaml"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
