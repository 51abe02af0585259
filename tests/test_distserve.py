"""`distserve`: completion, KV bounds in both pools, the KV hand-off's timing, SRPT order."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.run import simulate_point
from tests.helpers import assert_every_token_in_order, requests, workload

H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
MODEL = "llama-3.1-8b"


@st.composite
def scenarios(draw):
    w, prompt, output, need = draw(requests(25, 3000, 150, 0.3))
    p_need = max(-(-p // 16) for p in prompt)
    d_need = need
    params = dict(prefill_blocks_override=draw(st.integers(p_need, 3 * p_need)),
                  decode_blocks_override=draw(st.integers(d_need, 3 * d_need)),
                  prefill_max_tokens=draw(st.sampled_from([512, 4096, 8192])),
                  max_num_seqs=draw(st.sampled_from([2, 64])),
                  scheduler=draw(st.sampled_from(["fcfs", "srpt"])),
                  prefill_tp=draw(st.sampled_from([1, 2])))
    return w, params


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_and_neither_pool_overflows(sc):
    w, params = sc
    res = simulate_point(w, MODEL, H100X4, "distserve", **params)
    caps = res.stats["kv_capacity_blocks"]
    assert all(p <= c for p, c in zip(res.stats["peak_kv_blocks"], caps))
    assert caps[-1] == params["decode_blocks_override"]
    assert all(u == 0 for u in res.stats["kv_blocks_in_use_at_end"])
    rec = res.records
    assert res.stats["num_finished"] == w.num_requests
    assert_every_token_in_order(rec, w)
    # leaping over decode steps changes nothing
    b = simulate_point(w, MODEL, H100X4, "distserve", leap=False, **params)
    assert np.array_equal(rec.token_times_s, b.records.token_times_s)


def _kv_shard_bytes(prompt: int, tp: int) -> float:
    # Llama-3.1-8B: 32 layers, 8 KV heads of 128 dims, bf16, K and V: per rank of a TP group
    return prompt * 2 * 32 * (8 // tp) * 128 * 2


def test_isolated_ttft_is_prefill_plus_kv_transfer():
    p = 5000
    res = simulate_point(workload([0.0], [p], [3]), MODEL, H100X4, "distserve")
    cost = GpuCostModel(get_model(MODEL), H100X4.gpu, 2, H100X4.nvlink)
    prefill = cost.prefill_only_s(p)
    # nvlink4.yaml: p2p 386.9 GB/s, 13.597 us per transfer; TP2 -> TP2: two shards in parallel
    transfer = 13.597e-6 + _kv_shard_bytes(p, 2) / 386.9e9
    tt = res.records.token_times(0)
    assert tt[0] == pytest.approx(prefill + transfer, rel=1e-9)
    assert transfer > 0.8e-3  # 328 MB per shard at 387 GB/s
    # then decode steps on the decode pool (context = prompt + tokens so far)
    assert tt[1] - tt[0] == pytest.approx(cost.decode_only_s(1, p + 1), rel=1e-9)
    assert tt[2] - tt[1] == pytest.approx(cost.decode_only_s(1, p + 2), rel=1e-9)


def test_concurrent_hand_offs_contend_on_the_link():
    p = 3000
    res = simulate_point(workload([0.0, 0.0], [p, p], [1, 1]), MODEL, H100X4, "distserve")
    transfer = 13.597e-6 + _kv_shard_bytes(p, 2) / 386.9e9
    first = np.sort(res.records.first_token_s)
    # one batch prefills both; their shards then queue on the same two NVLink channels
    assert first[1] - first[0] == pytest.approx(transfer, rel=1e-9)


@pytest.mark.parametrize("scheduler,order", [("fcfs", [0, 1, 2]), ("srpt", [0, 2, 1])])
def test_prefill_queue_order(scheduler, order):
    # request 0 occupies the prefill pool; 1 (long) and 2 (short) queue behind it
    w = workload([0.0, 0.01, 0.02], [6000, 5000, 200], [1, 1, 1])
    res = simulate_point(w, MODEL, H100X4, "distserve", scheduler=scheduler,
                         prefill_max_tokens=512)
    assert list(np.argsort(res.records.first_token_s)) == order


def test_bad_configs_name_the_field():
    w = workload([0.0], [10], [2])
    with pytest.raises(ConfigError, match="scheduler"):
        simulate_point(w, MODEL, H100X4, "distserve", scheduler="lifo")
    with pytest.raises(ConfigError, match="prefill_tp"):
        simulate_point(w, MODEL, H100X4, "distserve", prefill_tp=4)
    odd = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=3))
    with pytest.raises(ConfigError, match="num_gpus"):
        simulate_point(w, MODEL, odd, "distserve")
