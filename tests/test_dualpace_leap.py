"""Exact event leaping in `dualpace`: decode-only GPU rounds leapt, Dense Assists and
Prefill-to-CPU copies worked out in closed form (leap: true) give byte-identical per-token times,
residency, ownership log, KV peaks and PCIe/worker accounting to stepping every event (leap:
false); and no per-layer events happen while no assist is pending."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import assert_every_token_in_order, requests, workload
from simserve.policies.dualpace.state import MIGRATING
from tests.test_dualpace_engine import FAST, Sim

EXAMPLES = int(os.environ.get("DUALPACE_EXAMPLES", 40))


@st.composite
def scenarios(draw):
    busy = draw(st.booleans())     # many long requests: the CPU runs Fused-Assist batches
    w, prompt, output, need = draw(requests(40, 2500, 400, 0.15) if busy else
                                   requests(30, 2500, 200, 0.3))
    p, f = draw(st.sampled_from([(0, 0), (2, 1)] if busy else
                                [(32, 16), (0, 0), (2, 1), (64, 8)]))
    params = dict(
        FAST, assist_p=p, assist_f=f,
        cpu_batch_limit=draw(st.sampled_from([4, 64, 256])),
        num_gpu_blocks_override=draw(st.integers(max(need, 20), 4 * need + 200)),
        num_cpu_blocks_override=draw(st.integers(2 * need + 50, 20 * need + 2000)),
        chunked_prefill=draw(st.booleans()),
        boundary_poll_us=draw(st.sampled_from([0.0, 3.5])))
    return w, params


def _kv_ok(s: Sim) -> None:
    """KV accounting at every event time: pools match the per-request blocks and stay within
    capacity; a request holds blocks in both tiers only while it migrates."""
    st, t = s.st, s.table
    assert int(t.blocks.sum()) == st.gpu_pool.num_used <= st.gpu_pool.num_blocks
    assert int(st.host_blocks.sum()) == st.host_pool.num_used <= st.host_pool.num_blocks
    both = (t.blocks > 0) & (st.host_blocks > 0)
    assert np.all(st.owner[both] == MIGRATING)


def _accounting(s: Sim) -> dict:
    g, wk, ch = s.gpu, s.gpu.worker, s.cluster.gpus[0]
    return dict(
        counts=g.counts, cpu_batches=s.cpu.num_batches, routes=s.dep.stats["dualpace_routes"],
        assists=wk.num_assists, assist_busy=wk.assist_busy_s, main_busy=wk.main_busy_s,
        p2c=g.p2c_copy_bytes, gpu_peak=s.st.gpu_pool.peak_used,
        host_peak=s.st.host_pool.peak_used, cpu_busy=s.cpu.busy_s,
        pcie=[(c.num_transfers, c.bytes_moved, c.busy_s) for c in (ch.h2d, ch.d2h)],
        iterations=s.ctx.recorder.num_iterations)


def _log(s: Sim) -> list:
    return [(t0, t1, e, ids.tolist()) for t0, t1, e, ids in s.st.log]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_leaping_matches_stepping_exactly(sc):
    w, params = sc
    a = Sim(w, dict(params, leap=True), check=_kv_ok)
    b = Sim(w, dict(params, leap=False), check=_kv_ok)
    assert a.table.num_finished == b.table.num_finished == w.num_requests
    assert np.array_equal(a.table.token_times, b.table.token_times)
    assert np.array_equal(a.table.token_on_cpu, b.table.token_on_cpu)
    assert _log(a) == _log(b)
    assert _accounting(a) == _accounting(b)
    assert_every_token_in_order(a.table.records(), w)
    assert a.ctx.recorder.num_steps_scheduled <= b.ctx.recorder.num_steps_scheduled


def _loaded(n=60, seed=7, rate=6.0):
    rng = np.random.default_rng(seed)
    return workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(200, 2500, n),
                    rng.integers(20, 300, n))


def test_leaping_serves_most_assists_in_closed_form_with_few_events():
    w = _loaded()
    params = dict(FAST, assist_p=0, assist_f=0, num_gpu_blocks_override=600,
                  num_cpu_blocks_override=20_000)
    a, b = Sim(w, dict(params, leap=True)), Sim(w, dict(params, leap=False))
    assert np.array_equal(a.table.token_times, b.table.token_times)
    assert a.gpu.counts["prefill_to_cpu"] > 0 and a.gpu.worker.num_assists > 1000
    assert a.gpu.worker.num_closed_form > 0.9 * a.gpu.worker.num_assists
    # every closed form was taken: assists in leapt rounds and right after one, assists
    # during Prefill-to-CPU copies, and copies handed back to events
    lc = a.gpu.leap_counts
    assert lc["rounds"] > lc["leaps"] > 50 and lc["assists"] > 1000
    assert lc["assists_after"] > 10 and lc["copy_assists"] > 500 and lc["copy_interrupts"] >= 1
    assert b.gpu.worker.num_closed_form == 0
    assert a.ctx.recorder.num_steps_scheduled < 0.8 * b.ctx.recorder.num_steps_scheduled
    assert a.num_events < b.num_events / 5


def test_no_per_layer_events_while_no_assist_is_pending():
    # every prompt goes Prefill-to-CPU (HBM smaller than any prompt) and the CPU batches run
    # Full-CPU (C <= F: no assist ever): 32 layer copies per GPU batch, no assist pending
    prompts = [300, 900, 1500, 640, 1200, 800]
    w = workload([0.0, 0.01, 0.5, 0.52, 1.0, 1.3], prompts, [2] * 6)
    params = dict(FAST, cpu_batch_limit=8, assist_p=16, assist_f=8, num_gpu_blocks_override=16)
    events = {}
    for leap in (True, False):
        s = Sim(w, dict(params, leap=leap))
        assert s.gpu.worker.num_assists == 0 and s.gpu.counts["prefill_to_cpu"] == 6
        batches = {e: sum(1 for *_, x, _ in s.st.log if x == e) for e in ("gpu", "cpu")}
        assert s.cluster.gpus[0].d2h.num_transfers == 32 * batches["gpu"]   # a copy per layer
        events[leap] = s.num_events
    # stepping: a wait per layer and a request, a timeout and a release per copy; leaping: a
    # handful of events per batch, however many layers
    assert events[False] > 4 * 32 * batches["gpu"]
    assert events[True] < 10 * (batches["gpu"] + batches["cpu"])


def test_chained_assists_match_one_assist_per_event(monkeypatch):
    # a Fused-Assist batch's next assists served at once during a main batch
    # (`GpuWorker.serve_chain`, `serve_at` through Prefill-to-CPU copies) give the same run
    # as asking for each one when it is due
    w = _loaded()
    params = dict(FAST, assist_p=0, assist_f=0, num_gpu_blocks_override=600,
                  num_cpu_blocks_override=20_000)
    a = Sim(w, dict(params, leap=True))
    assert a.gpu.worker.num_chained > 100
    from simserve.policies.dualpace.gpu_worker import GpuWorker
    monkeypatch.setattr(GpuWorker, "serve_at", lambda self, *args: None)
    monkeypatch.setattr(GpuWorker, "serve_chain", lambda self, run, at_s, *args: (0, at_s))
    b = Sim(w, dict(params, leap=True))
    assert b.gpu.worker.num_chained == 0
    assert np.array_equal(a.table.token_times, b.table.token_times)
    assert np.array_equal(a.table.token_on_cpu, b.table.token_on_cpu)
    assert _log(a) == _log(b)
    assert _accounting(a) == _accounting(b)
    assert a.gpu.worker.num_closed_form == b.gpu.worker.num_closed_form
    assert a.num_events < b.num_events
