"""Prefix caching (vLLM V1 semantics) in the shared KV pool of vllm / sarathi / chunked."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.errors import ConfigError
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.sim.kv import KVOvercommitError, PrefixCachingBlockPool
from simserve.sim.prefix_cache import BlockHasher
from simserve.sim.requests import RequestTable
from simserve.run import simulate_point
from tests.traces import needs_trace
from tests.helpers import H100, assert_every_token_in_order, workload


def hashed(arrival, prompt, output, hash_ids):
    w = workload(arrival, prompt, output)
    return dataclasses.replace(w, hash_ids=tuple(np.asarray(h, dtype=np.int64)
                                                 for h in hash_ids))


def queue_total(pool) -> int:
    return sum(1 if v is None else v if type(v) is int else v[1] - v[0]
               for v in pool._q.values())


# -- the pool ---------------------------------------------------------------------------------
def test_pool_lru_evicts_the_oldest_freed_and_a_request_frees_tail_first():
    p = PrefixCachingBlockPool("t", 6)
    p.allocate(6)
    for h in (10, 11, 12):
        assert p.register(h)
    # request A held [10, 11, 12, anon, anon, anon]: frees the anon tail, then 12, 11, 10
    p.free(3)
    p.release([12, 11, 10])
    assert p.num_free == 6 and queue_total(p) == 6 and p.num_cached() == 3
    assert p.lookup([10, 11, 12]) == (3, 3)
    p.allocate(4)          # 3 anonymous blocks, then the LRU cached one: 12 (A's tail)
    assert p.num_evictions == 1 and p.lookup([10, 11, 12]) == (2, 2)
    assert 12 not in p.ref and 10 in p.ref
    p.touch([10, 11])      # a hit takes both out of the free queue
    assert p.num_free == 0 and p.ref[10] == 1
    with pytest.raises(KVOvercommitError):
        p.allocate(1)
    p.release([11, 10])
    assert p.num_free == 2 and queue_total(p) == 2


def test_pool_duplicate_registration_stays_anonymous():
    p = PrefixCachingBlockPool("t", 4)
    p.allocate(2)
    assert p.register(7) and not p.register(7)
    p.release([None, 7])
    assert p.num_free == 4 and p.ref == {7: 0} and queue_total(p) == 4


# -- block hashes from hash_ids -----------------------------------------------------------------
def test_hashes_share_exactly_the_blocks_of_shared_hash_ids():
    t = RequestTable(hashed([0, 0, 0], [1500, 1500, 1000], [5, 5, 5],
                            [[1, 2, 3], [1, 2, 9], [4, 2, 3]]))
    hs = BlockHasher(t, 16)
    a, b, c = (hs.hashes(r, 93) for r in range(3))
    assert a[:64] == b[:64] and a[64] != b[64]       # two shared 512-token blocks = 64 blocks
    assert not set(a) & set(c)                       # same later ids, other first: chained
    # only whole-prompt blocks take prompt keys (1500 tokens: 93 full blocks; 1000: 62); the
    # blocks after them, output tokens included, are private to the request
    assert [hs.shared_count(r) for r in range(3)] == [93, 93, 62]
    assert len(hs.hashes(0, 200)) == 93


def test_requests_without_hash_ids_share_nothing():
    t = RequestTable(workload([0, 0], [640, 640], [5, 5]))
    hs = BlockHasher(t, 16)
    assert hs.shared_count(0) == hs.shared_count(1) == 0 and hs.hashes(0, 40) == []
    t2 = RequestTable(hashed([0], [1500], [5], [[7, 8, 9]]))
    assert BlockHasher(t2, 16).hashes(0, 93) == BlockHasher(t2, 16).hashes(0, 93)


def test_private_runs_are_evicted_from_their_end_and_only_their_owner_hits_them():
    p = PrefixCachingBlockPool("t", 10)
    p.allocate(10)
    assert p.register(5)
    # request 3 held [shared 5 | private 1..6 | 3 anonymous]: freed tail first
    p.free(3)
    p.release_private(3, 1, 7)
    p.release([5])
    assert p.num_free == 10 and queue_total(p) == 10 and p.num_cached() == 7
    p.allocate(5)          # 3 anonymous, then private blocks 6 and 5
    assert p.private_cached(3) == (1, 4) and p.num_evictions == 2
    p.touch_private(3, 3)  # takes blocks 1..3 back; block 4 is unreachable now: anonymous
    assert p.private_cached(3) == (0, 0) and p.num_free == 2 and queue_total(p) == 2
    p.allocate(1)          # the former block 4 (anonymous): the shared block 5 survives
    assert p.ref == {5: 0} and p.num_evictions == 2


# -- the engine ----------------------------------------------------------------------------------
def test_second_request_skips_its_cached_prefix_and_recomputes_the_last_token():
    # request 1 arrives after request 0 finished and repeats its 1024-token prompt exactly
    w = hashed([0.0, 5.0], [1024, 1024], [4, 4], [[1, 2], [1, 2]])
    on = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=True)
    off = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=False)
    pc = on.stats["prefix_cache"][0]
    # a full hit still computes its last token: (1024 - 1) // 16 = 63 blocks = 1008 tokens
    assert pc["requests"] == 2 and pc["queries"] == 2048 and pc["hits"] == 1008
    assert on.stats["prefix_cache_summary"]["prefix_cache_hit_rate"] == pytest.approx(1008 / 2048)
    assert on.stats["prefill_tokens_computed"] == 1024 + 16
    assert off.stats["prefill_tokens_computed"] == 2048
    ttft = lambda r: r.records.first_token_s - r.records.arrival_s  # noqa: E731
    assert ttft(on)[0] == ttft(off)[0] and ttft(on)[1] < 0.5 * ttft(off)[1]
    assert "prefix_cache" not in off.stats


def test_concurrent_request_hits_blocks_of_a_prefill_still_running():
    # request 1 arrives while request 0 prefills in 512-token chunks: blocks are cached when
    # the chunk that fills them is scheduled (vLLM's cache_blocks), so 1 hits them
    w = hashed([0.0, 0.0001], [2048, 2048], [2, 2], [[5, 6, 7, 8], [5, 6, 7, 9]])
    res = simulate_point(w, "llama-3.1-8b", H100, "vllm", max_num_batched_tokens=512,
                         enable_prefix_caching=True)
    pc = res.stats["prefix_cache"][0]
    assert pc["hits"] > 0 and pc["hits"] % 16 == 0 and pc["hits"] <= 1536


def test_preempted_request_refinds_its_own_blocks_and_counts_apart():
    rng = np.random.default_rng(3)
    n = 12
    w = workload(np.sort(rng.uniform(0, 1, n)), rng.integers(500, 3000, n),
                 rng.integers(50, 300, n))
    kw = dict(num_gpu_blocks_override=400, max_num_batched_tokens=1024)
    on = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=True, **kw)
    off = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=False, **kw)
    pc = on.stats["prefix_cache"][0]
    assert off.stats["num_preemptions"] > 0 and pc["preempted_requests"] > 0
    assert pc["hits"] == 0 and pc["preempted_hits"] > 0   # no hash_ids: only self-reuse
    assert on.stats["prefix_cache_summary"]["prefix_cache_hit_rate"] == 0.0
    assert on.stats["prefill_tokens_computed"] < off.stats["prefill_tokens_computed"]
    assert_every_token_in_order(on.records, w)


def test_without_reuse_or_preemption_caching_changes_nothing():
    rng = np.random.default_rng(4)
    n = 30
    w = workload(np.sort(rng.uniform(0, 10, n)), rng.integers(10, 4000, n),
                 rng.integers(1, 60, n))
    on = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=True)
    off = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=False)
    assert on.stats["num_preemptions"] == 0
    assert np.array_equal(on.records.token_times_s, off.records.token_times_s)


def test_default_follows_the_vllm_version_and_sarathi_is_off():
    r = lambda v: ChunkedConfig(vllm_version=v).resolve(80, "h100-sxm")  # noqa: E731
    assert r("0.22.1")["enable_prefix_caching"] and r("0.8.0")["enable_prefix_caching"]
    assert not r("0.7.3")["enable_prefix_caching"]
    assert not ChunkedConfig(vllm_version="0.22.1", enable_prefix_caching=False).resolve(
        80, "h100-sxm")["enable_prefix_caching"]
    w = hashed([0.0, 5.0], [1024, 1024], [4, 4], [[1, 2], [1, 2]])
    for policy, on in (("vllm", True), ("chunked", True), ("sarathi", False)):
        res = simulate_point(w, "llama-3.1-8b", H100, policy, tp=1)
        assert res.stats["engines"][0]["enable_prefix_caching"] is on
        assert ("prefix_cache" in res.stats) is on
    with pytest.raises((ConfigError, ValueError), match="enable_prefix_caching"):
        simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching="yes")


@st.composite
def reuse_scenarios(draw):
    n = draw(st.integers(2, 20))
    pool_ids = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    # shared prefixes: request i's hash_ids start with a family's ids, then its own
    hids = [[100 * f + j if j < 3 else 10_000 + 100 * i + j for j in range(-(-p // 512))]
            for i, (f, p) in enumerate(zip(pool_ids, prompt))]
    arrival = np.cumsum(draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n)))
    need = max(-(-(p + o) // 16) for p, o in zip(prompt, output))
    w = hashed(arrival, prompt, output, hids)
    return w, need, draw(st.sampled_from(["vllm", "sarathi", "chunked"])), dict(
        num_gpu_blocks_override=draw(st.integers(need, 3 * need)),
        max_num_batched_tokens=draw(st.sampled_from([64, 512, 2048])),
        max_num_seqs=draw(st.sampled_from([2, 64])), enable_prefix_caching=True, tp=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reuse_scenarios())
def test_cached_runs_finish_within_the_pool_and_leap_exactly(sc):
    w, need, policy, params = sc
    if policy == "chunked":
        params = dict(params, scheduler="srpt")
    res = simulate_point(w, "llama-3.1-8b", H100, policy, **params)
    assert res.stats["peak_kv_blocks"][0] <= params["num_gpu_blocks_override"]
    assert res.stats["kv_blocks_in_use_at_end"] == [0]  # cached blocks are free blocks
    engine_pool_ok = res.stats["prefix_cache"][0]
    assert engine_pool_ok["hits"] <= engine_pool_ok["queries"]
    assert_every_token_in_order(res.records, w)
    stepped = simulate_point(w, "llama-3.1-8b", H100, policy, leap=False, **params)
    assert np.array_equal(res.records.token_times_s, stepped.records.token_times_s)
    again = simulate_point(w, "llama-3.1-8b", H100, policy, **params)
    assert np.array_equal(res.records.token_times_s, again.records.token_times_s)


def test_engine_frees_tail_first_so_an_eviction_keeps_the_shared_head():
    # hash blocks of 16 tokens; 9 KV blocks. Request 0 (64 tokens) caches blocks a0..a3 and
    # frees them tail first: free queue [5 never used, a3, a2, a1, a0]. Request 1 (96
    # unrelated tokens) takes 6 blocks: the 5 unused and a3. Request 2 extends 0's prompt:
    # it still finds a0..a2 (a head-first free would have evicted a0 and left nothing).
    w = dataclasses.replace(
        hashed([0.0, 1.0, 2.0], [64, 96, 128], [1, 1, 1],
               [[1, 2, 3, 4], [50, 51, 52, 53, 54, 55], [1, 2, 3, 4, 5, 6, 7, 8]]),
        hash_block_tokens=16)
    res = simulate_point(w, "llama-3.1-8b", H100, "vllm", enable_prefix_caching=True,
                         num_gpu_blocks_override=9)
    pc = res.stats["prefix_cache"][0]
    assert pc["hits"] == 48 and pc["evictions"] >= 1


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["shared", "private", "anon"]), st.integers(1, 4)),
                min_size=1, max_size=12), st.data())
def test_free_ahead_counts_the_blocks_allocate_takes_before_evicting_a_hit(entries, data):
    # A leap of a vLLM engine may allocate free_ahead(...) blocks while the waiting head's
    # cached hits survive (ChunkedScheduler.leap_bound): allocating that many must evict none of
    # them, and one more block must evict one (when any is in the free queue).
    import copy
    p = PrefixCachingBlockPool("t", 64)
    p.allocate(64)
    hashes, rids, nxt = [], [], 100
    for i, (kind, n) in enumerate(entries):
        if kind == "anon":
            p.free(n)
        elif kind == "shared":
            for _ in range(n):
                nxt += 1
                p.register(nxt)
                p.release([nxt])
                hashes.append(nxt)
        else:
            p.release_private(i, 0, n)
            rids.append(i)
    keys = data.draw(st.lists(st.sampled_from(hashes), unique=True) if hashes else st.just([]))
    rid = data.draw(st.sampled_from(rids)) if rids else -1
    n = p.free_ahead(keys, rid)

    def hits_intact(q):
        return all(k in q.ref for k in keys) and q.private_cached(rid) == p.private_cached(rid)
    q = copy.deepcopy(p)
    q.allocate(n)
    assert hits_intact(q)
    if n < p.num_free:
        q.allocate(1)
        assert not hits_intact(q)


@needs_trace("azure-conv")
def test_kv_bound_waiting_head_leaps_exactly_on_a_tight_pool():
    # DualPace Fig. 9a's vLLM baseline (RTX 4090: 24 GB, preemptions): the waiting head is
    # blocked by its new blocks plus its cached (preempted, private) hits in the free queue,
    # while decodes evict those hits; the engine leaps through it (ChunkedScheduler.leap_bound)
    # and must equal stepping.
    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.workload.build import build_workload
    hw = resolve_hardware(HardwareConfig(gpu="rtx4090", num_gpus=1))
    w = build_workload("azure-conv", num_requests=400, arrival="poisson", rate=5.0, seed=0)
    leapt = simulate_point(w, "llama-3.1-8b", hw, "vllm")
    stepped = simulate_point(w, "llama-3.1-8b", hw, "vllm", leap=False)
    assert leapt.records.num_preemptions.sum() > 0  # preempted requests re-find their blocks
    assert leapt.stats["prefix_cache_summary"]["prefix_cache_saved_tokens"] > 0
    assert np.array_equal(leapt.records.token_times_s, stepped.records.token_times_s)
    assert leapt.stats["num_iterations_stepped"] < stepped.stats["num_iterations"] / 4
