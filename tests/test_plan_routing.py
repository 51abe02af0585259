"""Routers in front of replicas (simserve.policies.routing)."""
from __future__ import annotations

import pytest

from simserve.policies.routing import PrefixAffinity, make_router


class FakeReplica:
    def __init__(self):
        self.got = []

    def load(self):
        return len(self.got)

    def enqueue(self, rid):
        self.got.append(rid)


def test_round_robin_cycles_whatever_the_load():
    ts = [FakeReplica() for _ in range(3)]
    r = make_router("round_robin", ts)
    for i in range(7):
        r(i)
    assert [t.got for t in ts] == [[0, 3, 6], [1, 4], [2, 5]]


def test_least_outstanding_picks_the_emptiest_lowest_index():
    ts = [FakeReplica() for _ in range(3)]
    ts[0].got = [9, 9]
    r = make_router("least_outstanding", ts)
    r(1)
    r(2)
    assert ts[1].got == [1] and ts[2].got == [2]


def test_prefix_affinity_follows_the_longest_shared_prefix():
    ts = [FakeReplica() for _ in range(4)]
    # sessions a and b: each later turn extends its session's earlier prompt
    ids = {0: [1, 2, 3], 1: [7, 8], 2: [1, 2, 3, 4, 5], 3: [7, 8, 9], 4: [1, 2, 3, 4, 5, 6]}
    r = make_router("prefix_affinity", ts, hash_ids=ids, affinity_blocks=2, load_factor=10)
    assert isinstance(r, PrefixAffinity)
    for rid in range(5):
        r(rid)
    where = {rid: i for i, t in enumerate(ts) for rid in t.got}
    assert where[0] == where[2] == where[4]
    assert where[1] == where[3]
    assert r.num_matched == 3


def test_prefix_affinity_bounded_load_spills():
    ts = [FakeReplica() for _ in range(2)]
    ids = {i: [5, 6] for i in range(10)}
    r = make_router("prefix_affinity", ts, hash_ids=ids, affinity_blocks=2, load_factor=1.0)
    for rid in range(10):
        r(rid)
    assert min(len(t.got) for t in ts) >= 3   # one hot prefix does not pin every request


def test_routed_policy_validates_the_router():
    from simserve.errors import ConfigError
    from simserve.policies import make_config
    with pytest.raises(ConfigError, match="router"):
        make_config("vllm-routed", {"router": "random"})
    assert make_config("vllm-routed", {"router": "least_kv"}).router == "least_kv"


def test_routed_vllm_with_default_router_matches_vllm():
    from simserve.api import simulate
    a = simulate("vllm", num_gpus=2, num_requests=200, rate=6, seed=3).summary
    b = simulate("vllm-routed", num_gpus=2, num_requests=200, rate=6, seed=3).summary
    for k in ("mean_ttft_ms", "p99_itl_ms", "output_throughput"):
        assert a[k] == b[k]


def test_same_instant_burst_is_spread_even_when_loads_lag():
    class Lagging(FakeReplica):   # counts a request only later (an API-server front end)
        def load(self):
            return 0

    class Env:
        now = 0.0

    env = Env()
    ts = [Lagging() for _ in range(4)]
    r = make_router("least_outstanding", ts, env=env)
    for rid in range(8):
        r(rid)
    assert [len(t.got) for t in ts] == [2, 2, 2, 2]
    env.now = 1.0        # a later instant: the burst no longer counts
    r(8)
    assert len(ts[0].got) == 3


def test_least_kv_counts_the_prompts_of_a_same_instant_burst():
    class Pool:
        num_used, num_blocks, block_size = 0, 100, 16

    class Lagging(FakeReplica):
        def load(self):
            return 0

        def kv_pools(self):
            return (Pool(),)

    class Env:
        now = 0.0

    ts = [Lagging() for _ in range(3)]
    prompt = [800, 16, 16, 16]   # a long prompt first: the next three avoid its replica
    r = make_router("least_kv", ts, env=Env(), prompt=prompt)
    for rid in range(4):
        r(rid)
    assert ts[0].got == [0] and sorted(ts[1].got + ts[2].got) == [1, 2, 3]
