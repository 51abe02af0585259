"""The uncertainty band of GPU collectives over more ranks than were measured.

NCCL was measured on two GPUs (`nvlink4`: tables at 2 ranks, a fitted latency + bus
bandwidth). Rank counts without a table extrapolate the fit; `BAND` bounds that from
published nccl-tests figures on 8-GPU NVLink 4 machines (sources below), and is stored in the
link profile as `link.multi_rank_band`. `hardware_at(hw, "slow" | "fast")` returns the
hardware with the GPU-GPU link at either edge of the band, for sensitivity runs of any policy:
only what is extrapolated moves (measured 2-rank tables are used as they are).
"""
from __future__ import annotations

import dataclasses

from simserve.errors import ConfigError

BAND = {
    # NVLS all-reduce peak busbw ~480 GB/s on 8 H100 (NCCL maintainer, NVIDIA/nccl-tests#212,
    # 2024-05-06), 475 GB/s measured on 8 H200 (#272, 2024-11-27): / the 2-rank fit 264.2 GB/s
    "allreduce_busbw_factor": [1.0, 1.82],
    # ~370 GB/s effective NVLink busbw for non-all-reduce collectives (#212): / 254.4 GB/s
    "alltoall_busbw_factor": [1.0, 1.45],
    # ring all-reduce steps 2(R-1): 3x the 2-rank count at 4 ranks (an upper edge, derived);
    # 8 ranks would be 7x, so the latency edge covers rank counts up to 4 only
    "latency_factor": [1.0, 3.0],
    "source": "nccl-tests on 8-GPU NVLink 4 (NVIDIA/nccl-tests#212, #272) over the 2-rank "
              "fit; latency: ring step count at 4 ranks (8 ranks would be 7x: not covered); "
              "applies to rank counts without a measured table",
}
EDGES = ("slow", "fast")
_KEYS = {"allreduce_busbw_gbps": "allreduce_busbw_factor",
         "alltoall_busbw_gbps": "alltoall_busbw_factor",
         "collective_latency_us": "latency_factor", "alltoall_latency_us": "latency_factor"}


def band(link) -> dict:
    """The link profile's band (`link.multi_rank_band`), else the published default."""
    return (link.link.get("multi_rank_band") if link is not None else None) or BAND


def link_at(link, edge: str):
    """A copy of the link profile at one edge of its band: "slow" (lowest bus bandwidths,
    highest latency) or "fast"."""
    if edge not in EDGES:
        raise ConfigError(f"collective band edge: expected one of {EDGES}, got {edge!r}")
    b = band(link)
    out = dict(link.link)
    for key, fkey in _KEYS.items():
        if key in out:
            lo, hi = b[fkey]
            slow = hi if key.endswith("_us") else lo
            fast = lo if key.endswith("_us") else hi
            out[key] = float(out[key]) * (slow if edge == "slow" else fast)
    return dataclasses.replace(link, link=out, _ops_cache={})


def hardware_at(hw, edge: str):
    """The hardware with its GPU-GPU link at one edge of the band (unchanged without one)."""
    if hw.nvlink is None:
        return hw
    return dataclasses.replace(hw, nvlink=link_at(hw.nvlink, edge))
