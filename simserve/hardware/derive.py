"""Build roofline-derived profiles from datasheet numbers (`provenance: derived`).

    python -m simserve.hardware.derive [--out DIR]

Every op time is max(FLOPs / (peak · η_compute), bytes / (bandwidth · η_memory)) plus a
kernel floor, evaluated on a token grid for every catalog model and TP degree, and written as
knot tables in the same schema measured profiles use, so the cost model has one code path.
"""
from __future__ import annotations

import argparse
import datetime as _dt
from pathlib import Path

import numpy as np
import yaml

from simserve.hardware import datasheets as ds
from simserve.hardware.profile import SCHEMA
from simserve.models import CATALOG, DTYPE_BYTES, ModelSpec

TOKEN_GRID = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
              3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
WORK_GRID = [float(v) for v in np.geomspace(100, 1e10, 41).round(0)]
GPU_TP = (1, 2, 4, 8)


def _roof(flops, nbytes, peak_flops, bw, floor_us):
    return np.maximum(flops / peak_flops, nbytes / bw) * 1e6 + floor_us


def model_ops(m: ModelSpec, tp: int, peak_flops: float, bw: float, eff: dict) -> dict:
    """Per-layer op tables of model m at TP degree tp on a device (µs)."""
    tok = np.asarray(TOKEN_GRID, dtype=np.float64)
    pf, bwm, floor = peak_flops * eff["gemm"], bw * eff["memory"], eff["kernel_floor_us"]
    out: dict = {"tokens": TOKEN_GRID}
    for g in m.gemms(tp):
        nbytes = g.weight_bytes + tok * (g.k + g.n) * DTYPE_BYTES
        out[f"{g.name}_us"] = _r(_roof(tok * 2.0 * g.k * g.n, nbytes, pf, bwm, floor))
    nh, nkv = m.heads_per_rank(tp)
    h, hd = m.hidden, m.head_dim
    # two RMSNorms with residual add (read x, residual; write both), RoPE on q and k,
    # SiLU-and-mul (read 2·ffn/t, write ffn/t), Qwen3 q/k norms: bytes per token
    per_tok = 2 * 4 * h + 2 * (nh + nkv) * hd + 3 * m.ffn // tp
    if m.qk_norm:
        per_tok += 2 * (nh + nkv) * hd
    n_kernels = 4 + (2 if m.qk_norm else 0)
    out["elementwise_us"] = _r(tok * per_tok * DTYPE_BYTES / bwm * 1e6 + n_kernels * floor)
    lm = m.lm_head(tp)
    out["lm_head_us"] = _r(_roof(tok * 2.0 * lm.k * lm.n,
                                 lm.weight_bytes + tok * (lm.k + lm.n) * 4, pf, bwm, floor))
    work = np.asarray(WORK_GRID)
    attn_flops = m.prefill_attn_flops_per_layer(work, tp)
    out["prefill_attn"] = {
        "work": WORK_GRID,
        "us": _r(attn_flops / (peak_flops * eff["prefill_attn"]) * 1e6 + 2 * floor),
        "per_request_us": 1.0,
    }
    kv_layer = m.kv_bytes_per_token_per_layer(tp)
    out["decode_attn"] = {
        "const_us": 2 * floor,
        "per_seq": 0.05,
        "per_context_token": float(f"{kv_layer / (bw * eff['decode_attn']) * 1e6:.6g}"),
    }
    return out


def _r(a) -> list[float]:
    return [float(f"{v:.6g}") for v in np.asarray(a, dtype=np.float64)]


def _header(name: str, kind: str, spec: dict, extra: str) -> dict:
    return {
        "schema": SCHEMA,
        "name": name,
        "kind": kind,
        "provenance": {
            "type": "derived",
            "method": "roofline from datasheet numbers; " + extra,
            "generated_by": f"python -m simserve.hardware.derive --only {name}",
            "date": _dt.date.today().isoformat(),
            "note": "v0 profile: replace with `simserve calibrate` output or a profile derived "
                    "from a measured one",
        },
        "spec": spec,
    }


def gpu_profile(name: str) -> dict:
    spec = dict(ds.GPUS[name])
    eff = ds.GPU_EFFICIENCY
    d = _header(name, "gpu", spec, "efficiencies below (reasons in simserve/hardware/datasheets.py)")
    d["provenance"]["efficiency"] = dict(eff)
    d["overheads"] = dict(ds.GPU_OVERHEADS)
    peak, bw = spec["bf16_tflops"] * 1e12, spec["mem_bandwidth_gbps"] * 1e9
    d["ops"] = {m.name: {f"tp{t}": model_ops(m, t, peak, bw, eff) for t in GPU_TP}
                for m in CATALOG.values()}
    return d


def cpu_profile(name: str) -> dict:
    spec = dict(ds.CPUS[name])
    eff = ds.CPU_EFFICIENCY
    d = _header(name, "cpu", spec, f"efficiencies below, tables at {spec['cores']} cores")
    d["provenance"]["efficiency"] = dict(eff)
    d["overheads"] = dict(ds.CPU_OVERHEADS)
    peak = spec["cores"] * spec["base_ghz"] * 1e9 * spec["amx_bf16_flop_per_cycle_per_core"]
    bw = spec["dram_gbps_peak"] * 1e9
    cpu_eff = {"gemm": eff["amx"], "memory": eff["memory"], "prefill_attn": eff["amx"],
               "decode_attn": eff["memory"], "kernel_floor_us": eff["kernel_floor_us"]}
    d["ops"] = {m.name: {"tp1": model_ops(m, 1, peak, bw, cpu_eff)} for m in CATALOG.values()}
    return d


def link_profile(name: str) -> dict:
    spec = dict(ds.LINKS[name])
    d = _header(name, "link", {k: v for k, v in spec.items() if k in ("vendor_name", "sources",
                                                                       "theoretical_gbps_per_dir")},
                "achieved rates as cited in spec.sources")
    d["link"] = {k: v for k, v in spec.items()
                 if k not in ("vendor_name", "sources", "theoretical_gbps_per_dir")}
    return d


def all_profiles() -> dict[str, dict]:
    out = {n: gpu_profile(n) for n in ds.GPUS}
    out.update({n: cpu_profile(n) for n in ds.CPUS})
    out.update({n: link_profile(n) for n in ds.LINKS})
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _flow_lists(dumper, data):
    flow = all(isinstance(v, (int, float)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _flow_lists)


def write_profile(d: dict, path: Path) -> Path:
    """Write a profile mapping as YAML, atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".yaml.tmp")
    with open(tmp, "w") as f:
        f.write(f"# {d['name']}: {d['provenance']['type']} profile, generated by "
                f"{d['provenance'].get('generated_by') or d['provenance'].get('fitted_by')}; "
                "do not edit by hand\n")
        yaml.dump(d, f, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    tmp.replace(path)
    return path


def write(out_dir: Path, only: list[str] | None = None) -> list[Path]:
    return [write_profile(d, out_dir / f"{name}.yaml") for name, d in all_profiles().items()
            if not only or name in only]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default: simserve/data/hwprofiles in a source "
                    "checkout, else ~/.config/simserve/hwprofiles")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    from simserve.paths import profile_write_dir
    for p in write(args.out or profile_write_dir(), args.only):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
