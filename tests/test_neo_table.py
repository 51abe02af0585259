"""NEO's own predictor (`TablePerfPredictor` profiled on NEO's grid), its host path (SwiftLLM's
Python runtime) and its GPU-gating option."""
from __future__ import annotations

import numpy as np
import pytest
import simpy

from simserve.cost import GpuCostModel
from simserve.cost.cpu import CpuCostModel
from simserve.cost.swiftllm_host import SwiftLLMHost
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies import make_config
from simserve.policies.neo.predictor import Predictor, SubBatch
from simserve.policies.neo.table import Table1D, TablePredictor, grids, profile
from simserve.run import simulate_point
from simserve.sim.cluster import Cluster
from tests.helpers import workload
from tests.test_neo import LinearPredictor, _decide

HW = resolve_hardware(HardwareConfig(gpu="rtx4090", cpu="xeon-silver-4510", cpu_cores=12,
                                     pcie="pcie4-x16"))
MODEL = "llama-3.1-8b"
# NEO's A10 evaluation config: 16-token blocks, 20,480-token budget, 1,024 rows; its server
# sets max_blocks_per_seq to the budget in blocks (a 20,480-token longest sequence)
BS, T, B, LMAX = 16, 20480, 1024, 20480
GPU_TOKENS, CPU_TOKENS = 16 * 1650, 16 * 60000


def _oracle():
    m = get_model(MODEL)
    cl = Cluster.build(simpy.Environment(), HW.gpu, 1, HW.pcie, None)
    gpu = GpuCostModel(m, HW.gpu, 1, None, False, T)
    cpu = CpuCostModel(m, HW.cpu, 12)
    return Predictor(m, gpu, cpu, cl.gpus[0].h2d, cl.gpus[0].d2h, 1, 800.0)


@pytest.fixture(scope="module")
def tables():
    o = _oracle()
    return o, profile(o, BS, T, B, LMAX, GPU_TOKENS, CPU_TOKENS)


def test_grid_is_neos():
    # the lists `TablePerfPredictor.__init__` builds for this config (read off NEO's code)
    g = grids(BS, T, B, LMAX, GPU_TOKENS, CPU_TOKENS)
    assert g["lin"][:511] == list(range(1, 512))
    assert g["lin"][511:] == [512, 1024, 2048, 4096, 8192, 16384, 20480]
    assert g["pref"][:4] == [12, 16, 24, 32] and g["pref"][-3:] == [12288, 16384, 20480]
    assert g["gdec"][-1] == GPU_TOKENS and g["gdec"][-2] == 2 ** 14
    assert g["cdec_s"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    # per CPU batch size S: S·16 tokens, then powers of two, then min(S·Lmax, host tokens)
    assert g["cdec_n"][0] == [16] + [2 ** i for i in range(5, 15)] + [20480]
    assert g["cdec_n"][-1][0] == 1024 * 16 and g["cdec_n"][-1][-1] == CPU_TOKENS


def test_on_grid_points_are_the_profile_and_off_grid_points_are_interpolated(tables):
    oracle, table = tables
    gpu = oracle.gpu
    # on the grid: what the profile says there (in a forward: its in-situ factor)
    assert table.lin(300) == gpu.dense_layer_us(300) * gpu.in_situ(300)
    # off the grid (768 lies between 512 and 1024): NEO's linear interpolation, which is
    # not the cost model at 768
    y0 = gpu.dense_layer_us(512) * gpu.in_situ(512)
    y1 = gpu.dense_layer_us(1024) * gpu.in_situ(1024)
    assert table.lin(768) == pytest.approx(y0 + (y1 - y0) * 256 / 512, rel=1e-12)
    assert table.lin(768) != pytest.approx(gpu.dense_layer_us(768) * gpu.in_situ(768),
                                           rel=1e-4)
    assert table.lin(0) == 0.0
    # below the first prefill grid point (12): its value (NEO's clamp)
    assert table.pref(5) == table.pref(12)


def test_gpu_decode_table_ignores_the_batch_size(tables):
    oracle, table = tables
    assert table.gdec(1, 4096) == table.gdec(300, 4096)
    # the cost model does not: 300 short decodes cost more than one long one
    assert oracle.gdec(300, 4096) != pytest.approx(oracle.gdec(1, 4096), rel=1e-3)


def test_cpu_attention_is_bilinear_between_batch_sizes(tables):
    _, table = tables
    n = 3 * 4096
    a, b = table.cdec(2, n), table.cdec(4, n)
    assert table.cdec(3, n) == pytest.approx((a + b) / 2, rel=1e-12)
    assert table.cdec(0, n) == 0.0
    # the S = 1024 row starts at 16,384 tokens: below it the entry is extrapolated from the
    # S = 512 row (the parallelogram rule of `_profile_cdec`)
    rows, agg = table.cdec_rows, table.grid["cdec_agg"]
    j = agg.index(8192)
    assert rows[-1].ys[j] == pytest.approx(rows[-2].ys[j] + rows[-1].ys[j + 1]
                                           - rows[-2].ys[j + 1], rel=1e-12)


def test_decisions_read_the_table_not_the_cost_model(tables):
    oracle, table = tables
    assert isinstance(table, TablePredictor) and table.lnch_us == oracle.lnch_us == 800.0
    # every decision function differs from the oracle somewhere off the grid
    assert table.lin(3000) != oracle.lin(3000)
    assert table.cdec(5, 7000) != oracle.cdec(5, 7000)
    assert table.alone_us(np.array([1000]))[0] == table.cdec(1, 1000) + 800.0


def test_the_table_takes_its_launch_term_from_the_oracle():
    """One source for NEO's CPU launch term: the policy's `cpu_launch_ms` via the oracle."""
    oracle = _oracle()
    oracle.lnch_us = 123.0
    table = profile(oracle, BS, 2048, 64, 2048, GPU_TOKENS, CPU_TOKENS)
    assert table.lnch_us == 123.0
    assert table.alone_us(np.array([1000]))[0] == table.cdec(1, 1000) + 123.0


def _pressure():
    rng = np.random.default_rng(3)
    n = 120
    return workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(200, 2000, n),
                    rng.integers(50, 300, n))


def test_the_engine_calls_the_table(monkeypatch):
    calls = {"n": 0}
    real = TablePredictor.cdec

    def counting(self, n, ctx):
        calls["n"] += 1
        return real(self, n, ctx)

    monkeypatch.setattr(TablePredictor, "cdec", counting)
    w = _pressure()
    kw = {"num_gpu_blocks_override": 400, "num_cpu_blocks_override": 8000}
    t = simulate_point(w, MODEL, HW, "neo", **kw)
    assert calls["n"] > 0
    o = simulate_point(w, MODEL, HW, "neo", predictor="oracle", **kw)
    s = t.stats["neo"]
    assert s["num_pipeline_iterations"] > 0 and s["predictor_rounds"] > 0
    assert 0 < s["predictor_error_mean"] <= s["predictor_error_max"]
    # the decisions differ, so the token times do
    assert not np.array_equal(t.records.token_times_s, o.records.token_times_s)


def test_ungated_cpu_decodes_run_without_gpu_work_and_without_slack():
    # gated: no prefill, no GPU decode → the CPU queue gets no service
    assert _decide(LinearPredictor(), cpu=[100, 200]).mode == "none"
    cpu = np.array([100, 200, 50000], dtype=np.int64)
    from simserve.policies.neo.mode import decide
    d = decide(LinearPredictor(), [], [], 0, 0, np.arange(3) + 100, cpu, None, 100, 10**6,
               10**6, 128, gating=False)
    assert d.mode == "pipe" and sorted(d.cdec[0] + d.cdec[1]) == [100, 101, 102]
    # with a prefill whose T_lin cannot hide a 50,000-token decode, gated rejects it
    d = _decide(LinearPredictor(), pg=[100], cpu=[50000])
    assert d.mode == "gpu"


def test_ungated_runs_more_cpu_tokens_and_leaps_exactly():
    w = _pressure()
    kw = {"num_gpu_blocks_override": 400, "num_cpu_blocks_override": 8000, "gpu_gating": False}
    a = simulate_point(w, MODEL, HW, "neo", **kw)
    b = simulate_point(w, MODEL, HW, "neo", leap=False, **kw)
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)
    g = simulate_point(w, MODEL, HW, "neo", num_gpu_blocks_override=400,
                       num_cpu_blocks_override=8000)
    assert a.stats["neo"]["num_cpu_tokens"] > g.stats["neo"]["num_cpu_tokens"]


def test_pipelined_stage_charges_python_launch_on_the_cpu_thread():
    o = _oracle()
    b0 = SubBatch(n_pref=1, pref_tokens=64, pref_us=1.0)
    b1 = SubBatch(n_cdec=64, cdec_ctx=400_000)        # CPU-bound stages
    b0c = SubBatch(n_pref=1, pref_tokens=64, pref_us=1.0, n_cdec=64, cdec_ctx=400_000)
    base = o.pipeline_layer_us(b0c, b1)
    o.stage_us = 150.0
    # both stages are CPU-bound: each gets the stage's launch work added
    assert o.pipeline_layer_us(b0c, b1) == pytest.approx(base + 300.0, rel=1e-12)
    # a stage with no CPU attention still waits for its launches
    assert o.pipeline_layer_us(SubBatch(n_gdec=1, gdec_ctx=10), SubBatch(n_cdec=1,
                               cdec_ctx=10)) >= 300.0
    assert b0.tokens == 64


def test_swiftllm_host_adds_to_the_forward():
    h = SwiftLLMHost.from_profile(HW.gpu)
    call = HW.gpu.overheads["launch_us_per_kernel"]
    assert h.call_us == call and h.stage_us == 21 * call
    assert SwiftLLMHost.from_profile(HW.gpu, 800.0).stage_us == 800.0
    m = get_model(MODEL)
    with_host = GpuCostModel(m, HW.gpu, 1, None, False, 4096, host=h.engine_host())
    ideal = GpuCostModel(m, HW.gpu, 1, None, False, 4096,
                         host=h.engine_host().__class__("ideal"))
    eh = h.engine_host()
    # synchronous: host work + forward, per step, per sequence and per token
    want = ideal.decode_only_s(8, 8000) + (eh.step_us + 8 * eh.step_per_seq_us
                                           + 8 * eh.step_per_token_us) * 1e-6
    assert with_host.decode_only_s(8, 8000) == pytest.approx(want, rel=1e-12)


def test_stalled_scan_wrapper_prices_k_steps_as_its_single_steps():
    """A leap past a stalled CPU queue prices k steps with the wrapper's `decode_steps` (one
    call); each must be the wrapper's single step, bit for bit, in every form the model picks
    (one step at a time, the plain-float loop, numpy)."""
    from simserve.policies.neo.engine import _PlusConstant
    h = SwiftLLMHost.from_profile(HW.gpu)
    cost = GpuCostModel(get_model(MODEL), HW.gpu, 1, None, False, 4096, host=h.engine_host())
    w = _PlusConstant(cost, h.scan_us(37) * 1e-6)
    for B, s0, m0 in ((1, 700, 700), (8, 8000, 3000), (40, 90_000, 9000)):
        for k in (1, 2, 3, 20, 200):
            got = w.decode_steps(B, s0, m0, k)
            assert got == [float(w.decode_only_s(B, s0 + B * j, m0 + j)) for j in range(k)]


@pytest.mark.parametrize("field,value", [("predictor", "exact"), ("host", "vllm"),
                                         ("gpu_gating", "no"), ("stage_launch_us", -1)])
def test_bad_options_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        make_config("neo", {field: value})


def test_bilinear_fast_path_is_the_two_row_interpolation(tables):
    _, table = tables
    rows, cs = table.cdec_rows, table.cdec_s
    for n in (3, 5, 100, 700, 1000):
        i = next(k for k, s in enumerate(cs) if s >= n)
        for ctx in (1, 16, 999, 4096, 50_000, 333_333):
            a, b = rows[i - 1](ctx), rows[i](ctx)
            want = a + (b - a) * (n - cs[i - 1]) / (cs[i] - cs[i - 1])
            assert table.cdec(n, ctx) == want


def test_fast_cpu_attention_lookup_is_the_reference_to_the_last_bit(tables):
    """`cdec` (the precomputed closure) against `cdec_ref` (NEO's `get_cdec_T` step by step):
    on and between grid batch sizes and token points, at 0, past the last token point (both
    count it) and past max_batch_size (both refuse)."""
    _, table = tables
    xs, cs = table.cdec_xs, table.cdec_s
    rng = np.random.default_rng(1)
    ctxs = sorted({0, 1, *xs, *(x + 1 for x in xs), *(x - 1 for x in xs[1:]),
                   *rng.integers(1, xs[-1] * 2, 300).tolist()})
    ns = sorted({*cs, *(c + 1 for c in cs[:-1]), *(c - 1 for c in cs[1:]),
                 *rng.integers(1, cs[-1], 40).tolist()})
    fast = table.cdec_positive()
    before = table.beyond()
    past = 0
    for n in ns:
        for ctx in ctxs:
            want = table.cdec_ref(n, ctx)
            assert fast(n, ctx) == want and table.cdec(n, ctx) == want, (n, ctx)
            past += ctx > xs[-1]
    assert past and table.beyond() - before == 3 * past   # ref, fast and cdec each count
    with pytest.raises(ValueError, match="max_batch_size"):
        fast(cs[-1] + 1, 5)


def test_a_remembered_1d_lookup_is_the_lookup_and_past_the_grid_still_counts():
    t = Table1D([1, 4, 16], [10.0, 13.0, 40.0])
    for _ in range(2):
        assert t(2) == t.lookup(2) == 10.0 + 3.0 * 1 / 3
        assert t(0) == 0.0 and t(4) == 13.0
    assert t.beyond == 0
    t(20)
    t(20)
    assert t.beyond == 2 and t(20) == 40.0 + 27.0 * 4 / 12   # the last segment, extended


def test_leaps_past_a_stalled_cpu_queue_pay_its_scan_as_stepping_does(monkeypatch):
    from simserve.policies.neo import engine
    made = {"n": 0}
    real = engine._PlusConstant.__init__

    def counting(self, cost, extra_s):
        made["n"] += 1
        real(self, cost, extra_s)

    monkeypatch.setattr(engine._PlusConstant, "__init__", counting)
    w = _pressure()
    kw = {"num_gpu_blocks_override": 400, "num_cpu_blocks_override": 8000}
    a = simulate_point(w, MODEL, HW, "neo", **kw)
    assert made["n"] > 0          # some leaps ran with CPU requests waiting on the host
    b = simulate_point(w, MODEL, HW, "neo", leap=False, **kw)
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)


def test_stalled_rounds_count_gating_and_vanish_without_it():
    w = _pressure()
    kw = {"num_gpu_blocks_override": 400, "num_cpu_blocks_override": 8000}
    gated = simulate_point(w, MODEL, HW, "neo", **kw).stats["neo"]
    ungated = simulate_point(w, MODEL, HW, "neo", gpu_gating=False, **kw).stats["neo"]
    assert gated["num_cpu_stalled_rounds"] > 0
    assert ungated["num_cpu_stalled_rounds"] == 0


def test_prefill_to_cpu_staging_layer_takes_one_layer_of_the_gpu_pool():
    w = workload([0.0], [100], [2])
    a = simulate_point(w, MODEL, HW, "neo").stats["engines"][0]["num_gpu_blocks"]
    b = simulate_point(w, MODEL, HW, "neo", itm_layer=False).stats["engines"][0]["num_gpu_blocks"]
    assert a == b * 32 // 33            # Llama-3.1-8B: 32 layers + the staging layer
    g = simulate_point(w, MODEL, HW, "neo", use_cpu=False).stats["engines"][0]["num_gpu_blocks"]
    assert g == b                       # the GPU-only baseline stages nothing
