"""DualPace KV safety envelope (Eq. 2-4) and FIFO prefill placement (App. A.1 step 5)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.policies.dualpace.envelope import (admit_prefills, fits, growth_blocks,
                                                 migration_blocks, migration_blocks_of,
                                                 migration_tail_len)


def test_growth_counts_only_remaining_growth():
    # b = current, b̂ = finish peak: max(5-3,0) + max(4-4,0) + max(2-6,0) = 2
    assert growth_blocks([3, 4, 6], [5, 4, 2]) == 2
    assert growth_blocks([], []) == 0


def test_migration_scans_from_the_eviction_tail():
    q = [4, 3, 5, 2]                      # tail (evicted first) is the last entry: 2
    assert migration_blocks(q, 14) == 0   # Σ b̂ = 14 fits
    assert migration_blocks(q, 13) == 2   # move 2 -> 12 ≤ 13
    assert migration_blocks(q, 12) == 2
    assert migration_blocks(q, 11) == 7   # move 2, 5 -> 7 ≤ 11
    assert migration_blocks(q, 6) == 10   # move 2, 5, 3 -> 4 ≤ 6
    assert migration_blocks(q, 3) == 14   # nothing fits: everything is reserved
    assert migration_blocks([], 0) == 0


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(0, 600))
def test_migration_from_a_kept_sum_is_the_scan(q, cap):
    # the round planner and prefill placement keep Σ b̂ instead of summing Q_G each time
    assert migration_blocks_of(q, sum(q), cap) == migration_blocks(q, cap)


def test_fits_is_eq2():
    assert fits(10, 2, 3, 5, 20)
    assert not fits(10, 2, 3, 6, 20)


def test_hand_case_gpu_then_cpu_then_stop():
    # HBM: 10 blocks free, Q_G peaks [6] with capacity 12. Host: 20 used of 40, growth 4.
    r = admit_prefills([4, 5, 2, 9, 1], [6, 8, 3, 10, 2], gpu_queue_peaks=[6], gpu_free=10,
                       gpu_capacity=12, cpu_used=20, cpu_planned=0, cpu_growth=4,
                       cpu_capacity=40)
    # c0: 4 ≤ 10 free; Q_G [6,6] = 12 fits HBM -> migration 0 -> GPU (free 6)
    # c1: 5 ≤ 6; Q_G [6,6,8] = 20 > 12 -> move 8 -> migration 8; 20+0+4+8 = 32 ≤ 40 -> GPU (free 1)
    # c2: 2 > 1 free -> CPU: planned 2; 20+2+4+8 = 34 ≤ 40
    # c3: CPU forced (order); 20+11+4+8 = 43 > 40 -> fits neither, stop (c4 never considered)
    assert r.dest == ["gpu", "gpu", "cpu"]
    assert r.gpu_queue_peaks == [6, 6, 8] and r.gpu_free == 1
    assert (r.planned, r.growth, r.migration, r.stop) == (2, 4, 8, "fits_neither")


def test_later_small_prompt_does_not_jump_back_to_gpu():
    r = admit_prefills([8, 1], [9, 2], gpu_queue_peaks=[], gpu_free=5, gpu_capacity=100,
                       cpu_used=0, cpu_planned=0, cpu_growth=0, cpu_capacity=100)
    assert r.dest == ["cpu", "cpu"] and r.gpu_free == 5


def test_gpu_placement_blocked_by_migration_reserve():
    # persistent KV fits HBM, but its b̂ pushes Q_G over HBM and the reserve over the host
    r = admit_prefills([2], [10], gpu_queue_peaks=[8], gpu_free=4, gpu_capacity=10,
                       cpu_used=5, cpu_planned=0, cpu_growth=0, cpu_capacity=12)
    # GPU: migration 10 -> 5+10 = 15 > 12; CPU: 5+2 = 7 ≤ 12 -> CPU
    assert r.dest == ["cpu"] and r.migration == 0
    r2 = admit_prefills([2], [10], gpu_queue_peaks=[8], gpu_free=4, gpu_capacity=10,
                        cpu_used=5, cpu_planned=0, cpu_growth=0, cpu_capacity=12,
                        reserve_cpu_growth=True)
    # with the finish peak reserved the CPU needs 5+2+8 = 15 > 12: fits neither
    assert r2.dest == [] and r2.stop == "fits_neither"


def test_limits():
    kw = dict(gpu_queue_peaks=[], gpu_free=100, gpu_capacity=100, cpu_used=0, cpu_planned=0,
              cpu_growth=0, cpu_capacity=100)
    assert admit_prefills([1] * 5, [2] * 5, max_rows=3, **kw).dest == ["gpu"] * 3
    r = admit_prefills([1] * 3, [2] * 3, prompt_tokens=[2000, 10, 10], max_tokens=1024, **kw)
    assert r.dest == ["gpu"] and r.stop == "tokens"     # the first prompt always goes
    kw["gpu_free"] = 0
    assert admit_prefills([1] * 3, [2] * 3, max_cpu_admits=2, **kw).stop == "cpu_limit"


blocks = st.integers(min_value=1, max_value=30)


@st.composite
def rounds(draw):
    n_q = draw(st.integers(0, 8))
    q = draw(st.lists(blocks, min_size=n_q, max_size=n_q))
    n = draw(st.integers(0, 12))
    prompt = draw(st.lists(blocks, min_size=n, max_size=n))
    peak = [p + draw(st.integers(0, 20)) for p in prompt]
    return dict(prompt_blocks=prompt, peak_blocks=peak, gpu_queue_peaks=q,
                gpu_free=draw(st.integers(0, 80)), gpu_capacity=draw(st.integers(0, 150)),
                cpu_used=draw(st.integers(0, 100)), cpu_planned=draw(st.integers(0, 20)),
                cpu_growth=draw(st.integers(0, 40)), cpu_capacity=draw(st.integers(0, 250)),
                reserve_cpu_growth=draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_admission_invariants(kw):
    r = admit_prefills(**kw)
    n = r.num_admitted
    # the returned state is consistent with the equations
    assert r.migration == migration_blocks(r.gpu_queue_peaks, kw["gpu_capacity"])
    assert r.gpu_queue_peaks[:len(kw["gpu_queue_peaks"])] == kw["gpu_queue_peaks"]
    gpu = [i for i, d in enumerate(r.dest) if d == "gpu"]
    cpu = [i for i, d in enumerate(r.dest) if d == "cpu"]
    assert r.gpu_queue_peaks[len(kw["gpu_queue_peaks"]):] == [kw["peak_blocks"][i] for i in gpu]
    assert r.planned == kw["cpu_planned"] + sum(kw["prompt_blocks"][i] for i in cpu)
    assert r.gpu_free == kw["gpu_free"] - sum(kw["prompt_blocks"][i] for i in gpu) >= 0
    # order preservation: no GPU placement after the first CPU one
    assert r.dest == sorted(r.dest, key=lambda d: d == "cpu")
    # admitted prefills never violate Eq. 2 (if anything was admitted)
    if n:
        assert fits(kw["cpu_used"], r.planned, r.growth, r.migration, kw["cpu_capacity"])
    # stopping early means the next candidate fits neither destination
    if r.stop == "fits_neither":
        assert n < len(kw["prompt_blocks"])
        blk, peak = kw["prompt_blocks"][n], kw["peak_blocks"][n]
        extra = peak - blk if kw["reserve_cpu_growth"] else 0
        assert not fits(kw["cpu_used"], r.planned + blk, r.growth + extra, r.migration,
                        kw["cpu_capacity"])
        if not cpu:
            assert blk > r.gpu_free or not fits(
                kw["cpu_used"], r.planned, r.growth,
                migration_blocks(r.gpu_queue_peaks + [peak], kw["gpu_capacity"]),
                kw["cpu_capacity"])
    else:
        assert n == len(kw["prompt_blocks"])


@settings(max_examples=300, deadline=None)
@given(st.lists(blocks, max_size=15), st.integers(0, 300))
def test_migration_is_the_minimal_tail_prefix(q, cap):
    k = migration_tail_len(q, cap)
    rest = q[:len(q) - k]
    assert migration_blocks(q, cap) == sum(q[len(q) - k:])
    assert sum(rest) <= cap or k == len(q)          # the rest fits (or nothing is left)
    if k:                                            # one fewer moved would not fit
        assert sum(q[:len(q) - k + 1]) > cap
