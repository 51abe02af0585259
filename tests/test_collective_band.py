"""The band around collectives over more ranks than were measured (hardware/collective_band.py)."""
from __future__ import annotations

import pytest

from simserve.errors import ConfigError
from simserve.hardware.collective_band import BAND, hardware_at, link_at
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig, resolve_hardware


def test_the_nvlink_profile_carries_the_published_band():
    nv = load_profile("nvlink4", "link")
    assert nv.link["multi_rank_band"]["allreduce_busbw_factor"] == BAND["allreduce_busbw_factor"]
    assert nv.link["measured_ranks"] == 2 and "allreduce_ranks2" in nv.tables


def test_edges_move_only_the_extrapolated_fit():
    nv = load_profile("nvlink4", "link")
    slow, fast = link_at(nv, "slow"), link_at(nv, "fast")
    ar, a2a = nv.link["allreduce_busbw_gbps"], nv.link["alltoall_busbw_gbps"]
    assert fast.link["allreduce_busbw_gbps"] == pytest.approx(ar * 1.82)
    assert fast.link["alltoall_busbw_gbps"] == pytest.approx(a2a * 1.45)
    assert slow.link["collective_latency_us"] == pytest.approx(3 * nv.link["collective_latency_us"])
    assert slow.tables is nv.tables and nv.link["allreduce_busbw_gbps"] == ar   # not mutated
    with pytest.raises(ConfigError, match="slow"):
        link_at(nv, "fastest")


def test_a_four_rank_all_to_all_is_cheaper_at_the_fast_edge():
    from simserve.cost.sp import SpCostModel
    from simserve.models import get_model
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
    t = {e: SpCostModel(get_model("qwen3-14b"), h.gpu, h.nvlink, 4).alltoall_us(64 << 20)
         for e, h in (("mid", hw), ("slow", hardware_at(hw, "slow")),
                      ("fast", hardware_at(hw, "fast")))}
    assert t["fast"] < t["mid"] < t["slow"]
