"""Exact event leaping in `loongserve`: decode-only stretches leapt (no prompt pending, or prompts
waiting out `max_wait_tokens`), and the decode steps that run beside a prefill priced in one go,
give byte-identical per-token times, preemptions and KV peaks to the reference stepping path
(every decode step one by one, priced with `SpCostModel.decode_only_s`, as before leaping)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simserve.policies.loongserve.engine as loong
from simserve.cost.sp import SpCostModel
from simserve.cost.loong import LoongCostModel
from simserve.policies.loongserve.steps import StepTimes
from simserve.run import simulate_point
from tests.helpers import assert_run_complete, requests
from tests.sp_hand import HW4, QWEN14

EXAMPLES = int(os.environ.get("LOONGSERVE_EXAMPLES", 30))


def _reference_decode(self, nd, dctx):
    """The stepping decode iteration as it was: `decode_only_s` of this one step."""
    return float(self.cost.decode_only_s(nd, np.asarray(dctx)[None, :],
                                         np.asarray(self._rank_max())[None, :])[0])


def _reference_steps_within(self, nd, dctx, span):
    """The decode steps beside a prefill as they were: one Python step at a time."""
    t, bs = self.ctx.table, self.cfg.block_size
    keep = [r for r in range(self.R) if nd[r] > 0]
    dmax = self._rank_max()
    if not keep:
        return np.zeros(0), None
    sub_nd = [nd[r] for r in keep]
    per = [np.asarray(self.decodes[r], dtype=np.int64) for r in keep]
    ids = np.concatenate(per)
    left = int((t.output[ids] - t.generated[ids]).min())

    def extra(a, s):
        return np.maximum(0, -(-(t.computed[a] + s) // bs) - t.blocks[a])

    out, now, j = [], 0.0, 0
    while now < span and j < left:
        if j > 0 and any(int(extra(a, j + 1).sum()) > self.pools[r].num_free
                         for r, a in zip(keep, per)):
            break
        d = np.asarray([dctx[r] + nd[r] * j for r in keep])[None, :]
        m = np.asarray([dmax[r] + j for r in keep])[None, :]
        now += float(self.cost.decode_only_s(sub_nd, d, m)[0])
        out.append(now)
        j += 1
    for r, a in zip(keep, per):
        nb = extra(a, len(out))
        self.pools[r].allocate(int(nb.sum()))
        t.blocks[a] += nb
    return np.asarray(out, dtype=np.float64), ids


def _run(w, reference: bool, **params):
    mp = pytest.MonkeyPatch()
    try:
        if reference:
            mp.setattr(loong, "LEAP", False)
            mp.setattr(loong.LoongEngine, "_decode_steps_within", _reference_steps_within)
            real = SpCostModel.decode_steps_s

            def steps_s(cost, n_d, c0, m0, lo, n):  # the stepping decode iteration's call
                assert lo == 0 and n == 1
                return np.asarray([float(cost.decode_only_s(
                    n_d, np.asarray(c0)[None, :], np.asarray(m0)[None, :])[0])])
            mp.setattr(SpCostModel, "decode_steps_s", steps_s)
            mp.setattr(StepTimes, "steps_s",  # the engine's cached pricing, bypassed
                       lambda st, n_d, c0, m0, lo, n: steps_s(st.cost, n_d, c0, m0, lo, n))
        res = simulate_point(w, "llama-3.1-8b", dataclasses.replace(HW4, num_gpus=4),
                             "loongserve", **params)
    finally:
        mp.undo()
    if reference:
        assert real is SpCostModel.decode_steps_s
    return res


@st.composite
def scenarios(draw):
    w, prompt, output, need = draw(requests(20, 6000, 300, 0.2))
    blocks = draw(st.integers(need + 70, need * 3 + 70))
    return (w, dict(num_gpu_blocks_override=blocks,
                    scheduler=draw(st.sampled_from(["fcfs", "srpt"])),
                    max_wait_tokens=draw(st.sampled_from([1, 3, 10, 40])),
                    tbt_ms=draw(st.sampled_from([None, 100.0])),
                    prefill_sp=draw(st.sampled_from([None, 2, 4]))))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_leaping_matches_stepping_exactly(sc):
    w, params = sc
    a = _run(w, False, **params)
    b = _run(w, True, **params)
    assert_run_complete(a, w, params["num_gpu_blocks_override"])
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s, equal_nan=True)
    assert np.array_equal(a.records.first_token_s, b.records.first_token_s)
    assert np.array_equal(a.records.finish_s, b.records.finish_s)
    assert np.array_equal(a.records.num_preemptions, b.records.num_preemptions)
    for key in ("sim_end_s", "num_iterations", "peak_kv_blocks", "loongserve"):
        assert a.stats[key] == b.stats[key], key
    assert b.stats["num_iterations_stepped"] == b.stats["num_iterations"]
    assert a.stats["num_iterations_stepped"] <= b.stats["num_iterations_stepped"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=4, max_size=4),
       st.lists(st.integers(1, 20000), min_size=4, max_size=4),
       st.integers(0, 600), st.integers(1, 5))
def test_decode_steps_s_gives_decode_only_s_floats(nd, lens, lo, n):
    cost = SpCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1)
    c0 = [b * m for b, m in zip(nd, lens)]           # Σ context of b decodes, longest m
    m0 = [m if b else 0 for b, m in zip(nd, lens)]
    got = cost.decode_steps_s(nd, c0, m0, lo, n)
    want = [float(cost.decode_only_s(nd, np.asarray([[c + b * j for c, b in zip(c0, nd)]]),
                                     np.asarray([[m + j if b else 0 for m, b in zip(m0, nd)]]))[0])
            for j in range(lo, lo + n)]
    assert got.tolist() == want


def test_low_load_point_is_mostly_leapt():
    rng = np.random.default_rng(3)
    from tests.helpers import workload
    n = 40
    w = workload(np.cumsum(rng.exponential(1.0, n)), rng.integers(100, 3000, n),
                 rng.integers(50, 400, n))
    a = _run(w, False)
    b = _run(w, True)
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)
    assert a.stats["num_iterations_stepped"] * 5 < b.stats["num_iterations_stepped"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=4, max_size=4),
       st.lists(st.integers(1, 20000), min_size=4, max_size=4),
       st.lists(st.tuples(st.integers(0, 700), st.integers(1, 300)), min_size=1, max_size=6))
def test_step_times_are_decode_steps_s_floats(nd, lens, asks):
    """`StepTimes` (whole step times cached per layout, lines started, extended and shared by
    layouts that differ only in idle ranks) gives `decode_steps_s`'s floats."""
    cost = SpCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1)
    times = StepTimes(cost)
    c0 = [b * m for b, m in zip(nd, lens)]
    m0 = [m if b else 0 for b, m in zip(nd, lens)]
    for lo, n in asks:
        want = cost.decode_steps_s(nd, c0, m0, lo, n)
        assert times.steps_s(nd, c0, m0, lo, n).tobytes() == want.tobytes()
        busy = [r for r in range(4) if nd[r]]
        if busy:  # the busy ranks alone (the others lent to a prefill): the same line
            sub = [nd[r] for r in busy], [c0[r] for r in busy], [m0[r] for r in busy]
            assert times.steps_s(*sub, lo, n).tobytes() == want.tobytes()


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([1, 2, 4]),
       st.lists(st.lists(st.tuples(st.integers(0, 30000), st.integers(0, 30000)), min_size=1,
                         max_size=6), min_size=1, max_size=3))
def test_loong_cost_model_prices_are_sp_cost_model_ones(k, batches):
    """`LoongCostModel`'s prefill-only iterations (with its tabulated all-to-alls, grown as
    larger shards come) give `iteration_s`'s floats for batches with no decodes."""
    cost = SpCostModel(QWEN14, HW4.gpu, HW4.nvlink, k, 1)
    loong = LoongCostModel(QWEN14, HW4.gpu, HW4.nvlink, k, 1)
    for batch in batches:
        chunks, ctxs = [m for m, _ in batch], [c for _, c in batch]
        n = sum(chunks)
        n_p = [n // k + (1 if r < n % k else 0) for r in range(k)]
        want = cost.iteration_s(n_p, [0] * k, [0] * k, np.array(chunks, dtype=np.int64),
                                np.array(ctxs, dtype=np.int64), len(chunks))
        assert loong.prefill_s(chunks, ctxs) == want
        assert loong.comm_us(n_p[0]) == cost.comm_us(n_p[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=4, max_size=4),
       st.lists(st.integers(1, 20000), min_size=4, max_size=4),
       st.integers(0, 600), st.integers(1, 300))
def test_loong_cost_model_decode_lines_are_sp_cost_model_ones(nd, lens, lo, n):
    """`LoongCostModel.decode_steps_s` (its one-busy-rank path, else `SpCostModel`'s) gives
    `SpCostModel.decode_steps_s`'s floats, for a line started and then extended."""
    cost = SpCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1)
    loong = LoongCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1)
    c0 = [b * m for b, m in zip(nd, lens)]
    m0 = [m if b else 0 for b, m in zip(nd, lens)]
    for lo_, n_ in ((lo, n), (lo + n, 3 * n)):  # a line started, then extended
        want = cost.decode_steps_s(nd, c0, m0, lo_, n_)
        assert loong.decode_steps_s(nd, c0, m0, lo_, n_).tobytes() == want.tobytes()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(1, 600), st.integers(1, 20000), st.integers(0, 19999),
       st.integers(0, 600), st.integers(1, 300), st.booleans())
def test_one_busy_rank_steps_are_sp_cost_model_ones(r, b, longest, short, lo, n, graphs):
    """With one busy rank, `LoongCostModel.decode_steps_s` (its GPU model's steps) gives
    `SpCostModel.decode_steps_s`'s floats, equal contexts or not."""
    cost = SpCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1, cuda_graphs=graphs)
    loong = LoongCostModel(QWEN14, HW4.gpu, HW4.nvlink, 4, 1, cuda_graphs=graphs)
    nd, c0, m0 = [0] * 4, [0] * 4, [0] * 4
    nd[r], m0[r] = b, longest
    c0[r] = max(b, b * longest - min(short, longest - 1) * (b - 1))  # the others shorter
    want = cost.decode_steps_s(nd, c0, m0, lo, n)
    assert loong.decode_steps_s(nd, c0, m0, lo, n).tobytes() == want.tobytes()
