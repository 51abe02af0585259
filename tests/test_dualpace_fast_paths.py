"""DualPace's fast paths against the slow paths they replace: the same integers (the GPU
engine's round planning and leaps read the KV of a few dozen decodes as Python ints instead
of numpy arrays; where an equivalence is not plain arithmetic it is checked here)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.dualpace.gpu_leap import steps_that_fit
from simserve.policies.dualpace.state import SharedState
from simserve.sim.leap import largest_k
from tests.test_dualpace_engine import FAST, Sim
from tests.test_dualpace_leap import _loaded, scenarios


def _largest_k(kmax, cl, hl, bs, free):
    c, held = np.asarray(cl, dtype=np.int64), np.asarray(hl, dtype=np.int64)
    H = int(held.sum())
    return largest_k(kmax, lambda k: int(np.maximum(held, -(-(c + k) // bs)).sum()) - H <= free)


@st.composite
def _batches(draw):
    bs = draw(st.sampled_from([1, 2, 16, 32]))
    n = draw(st.integers(1, 40))
    cl = draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    # blocks held: ceil(c / bs) as the engine keeps them, sometimes more (the general path)
    extra = draw(st.lists(st.sampled_from([0, 0, 0, 1, 3]), min_size=n, max_size=n))
    hl = [-(-c // bs) + e for c, e in zip(cl, extra)]
    return bs, cl, hl, draw(st.integers(0, 4096)), draw(st.integers(0, 3 * n + 50))


@settings(max_examples=400, deadline=None)
@given(_batches())
def test_steps_that_fit_is_largest_k_of_the_kv_that_fits(b):
    bs, cl, hl, kmax, free = b
    assert steps_that_fit(kmax, cl, hl, bs, free) == _largest_k(kmax, cl, hl, bs, free)


def test_steps_that_fit_when_nothing_fits_and_when_everything_fits():
    # c = 32 on 2 blocks of 16: the next token needs a block
    assert steps_that_fit(10, [32, 32], [2, 2], 16, 0) == _largest_k(10, [32, 32], [2, 2], 16, 0) == 0
    assert steps_that_fit(10, [32, 32], [2, 2], 16, 2) == 10
    assert steps_that_fit(40, [32, 33], [2, 3], 16, 2) == _largest_k(40, [32, 33], [2, 3], 16, 2)



def _checked_growth(reads: dict):
    """`SharedState.running_growth` that asserts, at every read, that the kept value is Eq. 3
    over the CPU batch worked out afresh (counting reads, and those the kept value served)."""
    kept = SharedState.running_growth

    def checked(self):
        hit = self._growth is not None and self._growth[0] is self.cpu_running
        v = kept(self)
        assert v == self.host_growth(self.cpu_running)
        reads["all"] += 1
        reads["kept"] += hit
        return v
    return checked


@settings(max_examples=25, deadline=None)
@given(scenarios())
def test_kept_host_growth_is_eq3_over_the_cpu_batch_at_every_read(sc):
    w, params = sc
    reads = {"kept": 0, "all": 0}
    kept = SharedState.running_growth
    SharedState.running_growth = _checked_growth(reads)
    try:
        for leap in (True, False):
            Sim(w, dict(params, leap=leap))
    finally:
        SharedState.running_growth = kept


def test_kept_host_growth_is_read_often_and_stays_eq3(monkeypatch):
    reads = {"kept": 0, "all": 0}
    monkeypatch.setattr(SharedState, "running_growth", _checked_growth(reads))
    Sim(_loaded(n=150, rate=6.0), dict(FAST, cpu_batch_limit=256, num_gpu_blocks_override=2000,
                                       num_cpu_blocks_override=40_000))
    assert reads["kept"] > 10 and reads["all"] > reads["kept"]
