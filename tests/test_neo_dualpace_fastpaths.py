"""NEO's and DualPace's fast paths give the slow paths' floats bit for bit: the grid scalar
closure, the per-length table of lone CPU decode times, CPU stages priced per batch size, the
decode steps DualPace prices a few at a time, and NEO's closed-form PCIe round (the
leaping-vs-stepping hypothesis tests also cover it; here it is checked on its own)."""
from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.cost import GpuCostModel
from simserve.cost.cpu import CpuCostModel
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies.neo.pcie import arrives_at, round_times
from simserve.policies.neo.predictor import Predictor
from simserve.run import simulate_point
from simserve.sim.clock import at
from simserve.sim.cluster import Channel, Cluster
from tests.helpers import workload

HW = resolve_hardware(HardwareConfig(gpu="rtx4090", cpu="xeon-silver-4510", cpu_cores=12,
                                     pcie="pcie4-x16"))
MODEL = get_model("llama-3.1-8b")


def _cpu():
    return CpuCostModel(MODEL, HW.cpu, 12)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.25, 4096), st.floats(0.0, 1e6))
def test_grid_scalar_fn_is_grid_scalar(x, y):
    grid = _cpu().ops.decode_attn.grid
    f = grid.scalar_fn()
    assert f(x, y) == grid.scalar(x, y)
    assert f(int(x) or 1, y) == grid.scalar(int(x) or 1, y)
    n = int(x) or 1
    assert grid.scalar_fn(per_x=True, div=3)(n, y * n) == grid.scalar(n, y * n / n) / 3


def test_grid_scalar_fn_on_every_knot_and_between():
    grid = _cpu().ops.decode_attn.grid
    f = grid.scalar_fn()
    xs = np.concatenate((grid.xs, grid.xs * 1.5, [0.5, 2 * grid.xs[-1]]))
    ys = np.concatenate((grid.ys, grid.ys * 1.3, [0.0, 1.0, 3 * grid.ys[-1]]))
    for x in xs.tolist():
        for y in ys.tolist():
            assert f(x, y) == grid.scalar(x, y), (x, y)


def _predictor():
    env = simpy.Environment()
    cl = Cluster.build(env, HW.gpu, 1, HW.pcie, None)
    gpu = GpuCostModel(MODEL, HW.gpu, 1, None, True, 4096)
    return Predictor(MODEL, gpu, _cpu(), cl.gpus[0].h2d, cl.gpus[0].d2h, 1, 800.0), cl


def test_lone_cpu_decode_table_is_the_vectorised_call():
    pred, _ = _predictor()
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 64, 300):
        lens = rng.integers(1, 20_000, n)
        want = pred.cdec_each(lens) + pred.lnch_us
        assert np.array_equal(pred.alone_us(lens), want)
    long = np.array([50_000, 3, 120_000])            # beyond the table: it grows
    assert np.array_equal(pred.alone_us(long), pred.cdec_each(long) + pred.lnch_us)


def test_cpu_decode_scalar_is_the_grid_scalar():
    pred, _ = _predictor()
    grid = pred.cpu.ops.decode_attn.grid
    for n, ctx in [(1, 100), (3, 5000), (40, 123_457), (700, 10**7)]:
        assert pred.cdec_positive()(n, ctx) == grid.scalar(n, ctx / n) / pred.cpu.tp
        assert pred.cdec(n, ctx) == pred.cdec_positive()(n, ctx)


@pytest.mark.parametrize("b", [1, 2, 16, 33, 256])
def test_cpu_stage_fn_is_stage_us(b):
    cpu = _cpu()
    fn = cpu.stage_fn(b)
    for ctx in (b, 1000 * b + 7, 4096 * b):
        assert fn(ctx) == cpu.stage_us(b, ctx)


def test_dualpace_decode_steps_are_the_cost_model_s():
    from simserve.policies.dualpace.gpu_engine import GpuEngine
    cost = GpuCostModel(MODEL, HW.gpu, 1, None, True, 4096)
    eng = GpuEngine.__new__(GpuEngine)
    eng.cost, eng._dc = cost, None
    rng = np.random.default_rng(5)
    B, S, m = 8, 8 * 700, 900
    for _ in range(300):
        if rng.random() < 0.1:           # the batch changes
            B = int(rng.integers(1, 64))
            S, m = B * int(rng.integers(100, 3000)), int(rng.integers(3000, 5000))
        assert eng._decode_s(B, S, m) == cost.decode_only_s(B, S, m)
        S, m = S + B, m + 1


class _Ch:
    """A PCIe channel's timing (`Channel.duration_s`)."""

    def __init__(self, lat, bps):
        self.lat, self.bps = lat, bps

    def duration_s(self, nbytes):
        return self.lat + nbytes / self.bps


def _events(now, start, dur, head, layer, L, out_b, in_b, cp_b, d2h, h2d):
    """The same round on SimPy channels (`NeoEngine._round_events`' process structure)."""
    env = simpy.Environment(initial_time=now)
    chans = {}
    for c in d2h + h2d:
        chans[id(c)] = Channel(env, "c", 1.0, 0.0)
        chans[id(c)].duration_s = c.duration_s
    out = {}

    def swaps():
        ev = [chans[id(c)].start(out_b) for c in d2h if out_b] + \
             [chans[id(c)].start(in_b) for c in h2d if in_b]
        yield env.all_of(ev)
        return env.now

    def copies():
        for j in range(L):
            due = start + head + (j + 1) * layer
            if due > env.now:
                yield at(env, due)
            yield env.all_of([chans[id(c)].start(cp_b) for c in d2h])

    def engine():
        sw = env.process(swaps()) if out_b or in_b else None
        cp = env.process(copies()) if cp_b else None
        end = start + dur
        yield at(env, max(end, env.now))
        if sw is not None:
            done = yield sw
            end = max(end, done + dur - head)
        if cp is not None:
            yield cp
            end = max(end, env.now)
        if end > env.now:
            yield at(env, end)
        out["end"], out["wake"] = end, env.now

    env.process(engine())
    env.run()
    return out["end"], out["wake"], {k: (c.num_transfers, c.busy_s, c.bytes_moved)
                                     for k, c in chans.items()}


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 100), st.floats(1e-4, 0.5), st.floats(0, 0.9), st.integers(1, 4),
       st.sampled_from([0, 1 << 10, 1 << 24, 1 << 28]), st.sampled_from([0, 1 << 20, 1 << 27]),
       st.sampled_from([0, 1 << 12, 1 << 22]), st.integers(1, 2), st.floats(0, 1e-4))
def test_neo_closed_form_round_matches_the_events(now, dur, head_frac, L, out_b, in_b, cp_b,
                                                  ranks, lat):
    head = dur * head_frac
    layer = (dur - head) / L
    d2h = [_Ch(lat, 25e9 + 1e9 * i) for i in range(ranks)]
    h2d = [_Ch(lat, 24e9) for _ in range(ranks)]
    end, wake, books = round_times(now, now, dur, head, layer, L, out_b, in_b, cp_b, d2h, h2d)
    e_end, e_wake, stats = _events(now, now, dur, head, layer, L, out_b, in_b, cp_b, d2h, h2d)
    assert (end, wake) == (e_end, e_wake)
    for c in d2h + h2d:
        mine = [(nb, d) for ch, nb, d, _ in books if ch is c]
        n, busy, moved = stats[id(c)]
        acc = 0.0
        for _, d in mine:
            acc += d
        assert (len(mine), acc, sum(int(nb) for nb, _ in mine)) == (n, busy, moved)


def test_arrival_at_the_wake_time_is_found():
    arr = [0.0, 0.5, 1.25, 2.0]
    assert arrives_at(arr, 0, 1.25) and not arrives_at(arr, 0, 1.2500000001)
    assert not arrives_at(arr, 3, 1.25) and not arrives_at(arr, 0, 3.0)


def test_neo_round_closed_form_on_and_off_agree_on_channels():
    # leap: true works the round's PCIe out in closed form, leap: false runs the processes:
    # the channels carry and count the same transfers
    rng = np.random.default_rng(2)
    n = 30
    w = workload(np.cumsum(rng.exponential(0.05, n)), rng.integers(200, 800, n),
                 rng.integers(100, 300, n))
    p = dict(num_gpu_blocks_override=300, num_cpu_blocks_override=5000)
    from tests.test_neo import _run_engine
    a, ga = _run_engine(w, leap=True, **p)
    b, gb = _run_engine(w, leap=False, **p)
    assert a.num_swap_out > 0 and a.num_p2c > 0
    for x, y in ((ga.d2h, gb.d2h), (ga.h2d, gb.h2d)):
        assert (x.num_transfers, x.bytes_moved, x.busy_s) == \
            (y.num_transfers, y.bytes_moved, y.busy_s)
    ra = simulate_point(w, "llama-3.1-8b", HW, "neo", leap=True, **p)
    rb = simulate_point(w, "llama-3.1-8b", HW, "neo", leap=False, **p)
    assert np.array_equal(ra.records.token_times_s, rb.records.token_times_s)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e4), st.floats(0, 1e-2), st.floats(0, 1e-3), st.floats(0, 1e-2),
       st.integers(1, 128))
def test_fresh_main_run_ends_are_the_main_run_s(start, pre, layer, post, N):
    from simserve.policies.dualpace.gpu_worker import MainRun
    r = MainRun(start, pre, layer, post, N)
    assert MainRun.fresh_ends(start, pre, layer, post, N) == (r.end, r.expected_end())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=60), st.data())
def test_neo_decision_without_growth_flags_when_the_host_covers_every_candidate(lens, data):
    # with host_free >= the queue's length no candidate can be barred for a host block, so
    # the round passes no growth flags (None): the decision must be the same as with them
    from simserve.policies.neo.mode import decide
    from tests.test_neo import LinearPredictor
    pred = LinearPredictor(a=data.draw(st.floats(0, 50)), b=data.draw(st.floats(0.5, 20)),
                           lnch=data.draw(st.floats(0, 30)))
    cpu = np.asarray(lens, dtype=np.int64)
    grow = np.asarray(data.draw(st.lists(st.integers(0, 1), min_size=len(lens),
                                         max_size=len(lens))), dtype=np.int64)
    pg = data.draw(st.lists(st.integers(1, 2000), max_size=3))
    pc = data.draw(st.lists(st.integers(1, 2000), max_size=3))
    rows = data.draw(st.integers(0, 80))
    free = len(lens) + data.draw(st.integers(0, 5))
    ids = np.arange(len(lens)) + 100
    a = decide(pred, pg, pc, 3, 900, ids, cpu, grow, rows, 10**6, free, 128, 400)
    b = decide(pred, pg, pc, 3, 900, ids, cpu, None, rows, 10**6, free, 128, 400)
    assert (a.mode, a.num_pref_gpu, a.num_pref_cpu, a.cdec, a.b0, a.b1, a.g) == \
        (b.mode, b.num_pref_gpu, b.num_pref_cpu, b.cdec, b.b0, b.b1, b.g)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e-2)), max_size=40),
       st.sampled_from([0.0, 8192.0, 12345.0]), st.sampled_from([0.0, 4096.0, 777.0]))
def test_dualpace_count_many_is_count_per_assist(spans, h2d_bytes, d2h_bytes):
    # a leap counts its assists at once (GpuWorker.count_many): the channels' and the
    # worker's sums and counters come out as counting each one (GpuWorker.count)
    from simserve.policies.dualpace.gpu_worker import GpuWorker
    ws = []
    for _ in range(2):
        env = simpy.Environment()
        h, d = Channel(env, "h2d", 25.0, 3.0), Channel(env, "d2h", 25.0, 3.0)
        h.busy_s, d.busy_s = 0.1, 0.2          # sums already running
        w = GpuWorker(env, h, d, 3e-4, staged=True)
        w.assist_busy_s = 0.3
        ws.append(w)
    dh = ws[0].h2d.duration_s(h2d_bytes) if h2d_bytes else None
    dd = ws[0].d2h.duration_s(d2h_bytes) if d2h_bytes else None
    svs = [(1, t0, t0 + dt, dh, dd) for t0, dt in spans]
    for sv in svs:
        ws[0].count(sv, h2d_bytes, d2h_bytes)
    ws[1].count_many(svs, h2d_bytes, d2h_bytes)
    got = [(w.num_assists, w.num_closed_form, w.assist_busy_s,
            [(c.num_transfers, c.bytes_moved, c.busy_s) for c in (w.h2d, w.d2h)]) for w in ws]
    assert got[0] == got[1]
