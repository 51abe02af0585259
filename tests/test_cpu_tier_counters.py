"""Mechanism counters of the CPU-tier policies (issue 13 §1): every DualPace / NEO engine
reports `counters()`, run.py sums them into stats["counters"], and each point's summary.json
carries them. The CPU-token counts are checked against the request table's own record of
which tokens a CPU engine emitted (`token_on_cpu`), so a counter that stops counting fails."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simserve.models import get_model
from simserve.policies.base import EngineBase
from simserve.run import collect_counters, simulate_point
from simserve.runner.config import load_experiment
from simserve.runner.point import make_workload, run_experiment_config

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "dualpace" / "smoke-llama8b-rtx4090.yaml"


def _smoke(tmp_path, policies: str, rate: float = 3.0):
    cfg = load_experiment(SMOKE, [f"policies={policies}", f"workload.rates=[{rate}]"])
    out = tmp_path / "run"
    results = run_experiment_config(cfg, out=out, progress=False)
    return results, json.loads((out / "summary.json").read_text())


def test_dualpace_counters_reach_summary_json(tmp_path):
    # 300 requests at 3 req/s on an RTX 4090: the 24 GB HBM pool fills, so DualPace sends
    # prompts to the CPU tier and decodes there (the smoke experiment's regime)
    results, recs = _smoke(tmp_path, "[{name: dualpace}]")
    (rec,) = recs
    c = rec["counters"]
    assert c == json.loads(json.dumps(results[0].stats["counters"]))
    assert c["num_cpu_tokens"] > 0 and c["num_cpu_batches"] > 0 and c["num_prefill_to_cpu"] > 0
    assert c["num_prefill_to_gpu"] + c["num_prefill_to_cpu"] == rec["num_requests"]
    assert c["num_full_cpu_batches"] + c["num_split_final_batches"] + \
        c["num_fused_assist_batches"] == c["num_cpu_batches"]
    assert 0 < c["cpu_token_share"] < 1


def _smoke_counters(policy: str):
    """(workload, counters, tokens the request table marks as decoded on the CPU) of the
    smoke experiment's point at 3 req/s under `policy`."""
    cfg = load_experiment(SMOKE, [f"policies=[{{name: {policy}}}]", "workload.rates=[3.0]"])
    wl = make_workload(cfg, 3.0, 0)
    p = cfg.policies[0]
    res = simulate_point(wl, cfg.model, cfg.hardware, p.name, p.config)
    return wl, res.stats["counters"], int(np.count_nonzero(res.records.token_on_cpu)), cfg


def test_dualpace_cpu_token_counter_equals_the_tokens_the_table_marks_on_cpu():
    wl, c, marked, cfg = _smoke_counters("dualpace")
    assert marked > 0 and c["num_cpu_tokens"] == marked
    assert c["cpu_token_share"] == marked / int(wl.output_tokens.sum())
    # Dense Assist calls: one per Split-Final batch, one per layer of a Fused-Assist batch
    layers = get_model(cfg.model).num_layers
    assert c["num_dense_assist_calls"] == (c["num_split_final_batches"]
                                           + layers * c["num_fused_assist_batches"])


def test_vllm_points_carry_no_counters(tmp_path):
    _, recs = _smoke(tmp_path, "[{name: vllm, enable_prefix_caching: false}]")
    assert "counters" not in recs[0]


def test_collect_counters_sums_per_key_through_the_contract():
    class E(EngineBase):
        def __init__(self, **c):
            self.c = c

        def counters(self):
            return self.c

    class NoCounters(EngineBase):  # the contract's default: no counters
        pass

    got = collect_counters([E(num_cpu_tokens=3, num_swap_out=1), E(num_cpu_tokens=2),
                            NoCounters()], num_output_tokens=20)
    assert got == {"num_cpu_tokens": 5, "num_swap_out": 1, "cpu_token_share": 0.25}
    assert collect_counters([NoCounters()], 10) == {}
    with pytest.raises(AttributeError):  # an engine outside the contract is not probed
        collect_counters([object()], 10)


def test_neo_counters_match_the_tokens_the_table_marks_on_cpu():
    # the smoke workload on NEO: its HBM fills too, so it offloads prompts and decodes some
    # tokens with CPU attention
    wl, c, marked, _ = _smoke_counters("neo")
    assert marked > 0 and c["num_cpu_tokens"] == marked
    assert c["num_cpu_batches"] > 0 and c["num_prefill_to_cpu"] > 0
    assert c["num_prefill_to_gpu"] + c["num_prefill_to_cpu"] == wl.num_requests


def test_pool_sizes_and_peaks_in_the_counters_are_the_run_stats():
    cfg = load_experiment(SMOKE, ["policies=[{name: dualpace}, {name: neo}]",
                                  "workload.rates=[3.0]"])
    wl = make_workload(cfg, 3.0, 0)
    for p in cfg.policies:
        res = simulate_point(wl, cfg.model, cfg.hardware, p.name, p.config)
        c, st = res.stats["counters"], res.stats
        assert c["num_gpu_blocks"] == st["kv_capacity_blocks"][0]
        assert c["gpu_kv_peak_blocks"] == st["peak_kv_blocks"][0] == c["num_gpu_blocks"]
        if p.name == "dualpace":      # run.py lists the host pool as the CPU engine's
            assert c["host_kv_peak_blocks"] == st["peak_kv_blocks"][1] > 0


def test_points_with_different_counters_stay_one_curve():
    from simserve.capacity import group_records
    recs = [{"policy": "dualpace", "request_rate": r, "mean_ttft_ms": 1.0,
             "counters": {"num_cpu_tokens": n}} for r, n in ((1.0, 0), (2.0, 7))]
    (g, members), = group_records(recs)
    assert g == {"policy": "dualpace"} and len(members) == 2
