"""The `loongserve` policy: elastic SP prefill, temporal isolation, FCFS vs SRPT, KV safety."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.errors import ConfigError
from simserve.run import simulate_point
from tests.helpers import assert_run_complete, requests, workload
from tests.sp_hand import HW4, QWEN14, lone_prefill_s


def _sim(w, num_gpus=4, model="qwen3-14b", **kw):
    return simulate_point(w, model, dataclasses.replace(HW4, num_gpus=num_gpus), "loongserve",
                          **kw)


def test_lone_prompt_prefills_at_sp4_then_decodes_on_one_instance():
    w = workload([0.25], [8192], [3])
    res = _sim(w)
    t1 = 0.25 + lone_prefill_s(8192, 4)   # all four instances idle: SP4
    one_gpu = GpuCostModel(QWEN14, HW4.gpu, 1)
    t2 = t1 + float(one_gpu.decode_only_s(1, 8193))
    t3 = t2 + float(one_gpu.decode_only_s(1, 8194))
    assert res.records.token_times(0) == pytest.approx([t1, t2, t3], rel=1e-12)


def test_max_sp_caps_the_prefill_degree():
    w = workload([0.0], [8192], [1])
    assert _sim(w, max_sp=2).records.first_token_s[0] == pytest.approx(
        lone_prefill_s(8192, 2, with_comm=False,
                       comm_us_per_layer=_measured_comm_s(8192, 2) / QWEN14.num_layers * 1e6),
        rel=1e-9)


def _measured_comm_s(prompt: int, ranks: int) -> float:
    from simserve.hardware.profile import link_curve
    table = link_curve(HW4.nvlink, f"alltoall_ranks{ranks}")
    shard = prompt // ranks
    hd = QWEN14.head_dim * 2
    per_layer = float(table(shard * (QWEN14.num_heads + 2 * QWEN14.num_kv_heads) * hd)) + \
        float(table(shard * QWEN14.num_heads * hd))
    return QWEN14.num_layers * per_layer * 1e-6


def test_pinned_prefill_degree_lends_decode_instances():
    """prefill_sp=4 with one decode running: the prompt still prefills over all four instances
    (the decode's instance is lent, so that decode pauses)."""
    w = workload([0.0, 0.3], [256, 8192], [200, 1])
    res = _sim(w, prefill_sp=4)
    tt = res.records.token_times(0)
    t_pre = lone_prefill_s(8192, 4)
    ft = res.records.first_token_s[1]
    # the prefill ends at ft and lasted exactly the SP4 time (no decode rides along)
    before = tt[tt < ft]
    assert ft - before[-1] == pytest.approx(t_pre, rel=1e-9)
    with pytest.raises(ConfigError, match="prefill_sp"):
        _sim(w, prefill_sp=3)


def test_decodes_pause_while_a_prefill_runs_on_their_instance():
    """Temporal isolation on one GPU: a running decode's token gap holds the whole 16K prefill
    that arrives meanwhile (chunked prefill or Conflux would co-batch it)."""
    w = workload([0.0, 0.05], [512, 16384], [40, 1])
    res = _sim(w, num_gpus=1)
    tt = res.records.token_times(0)
    pre = lone_prefill_s(16384, 1)
    assert np.diff(tt).max() >= pre


@pytest.mark.parametrize("scheduler, first", [("fcfs", 0), ("srpt", 1)])
def test_fcfs_serves_arrival_order_and_srpt_the_shortest(scheduler, first):
    # a prefill batch holds one prompt at a time (batch_max_tokens), both wait from t=0
    w = workload([0.0, 0.0], [12000, 2000], [1, 1])
    res = _sim(w, scheduler=scheduler, batch_max_tokens=12000)
    ft = res.records.first_token_s
    assert int(np.argmin(ft)) == first


@st.composite
def scenarios(draw):
    w, prompt, output, need = draw(requests(14, 6000, 100, 0.3))
    blocks = draw(st.integers(need + 70, need * 3 + 70))
    return (w,
            dict(num_gpu_blocks_override=blocks, scheduler=draw(st.sampled_from(["fcfs", "srpt"])),
                 tbt_ms=draw(st.sampled_from([None, 100.0]))))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_and_kv_stays_within_each_instance(sc):
    w, params = sc
    res = _sim(w, model="llama-3.1-8b", **params)
    assert len(res.stats["kv_blocks_in_use_at_end"]) == 4  # one pool per rank / instance
    assert_run_complete(res, w, params["num_gpu_blocks_override"])


def test_bad_config_names_the_field():
    w = workload([0.0], [100], [2])
    with pytest.raises(ConfigError, match="scheduler"):
        _sim(w, scheduler="slo")
    with pytest.raises(ConfigError, match="max_sp"):
        _sim(w, max_sp=0)
