"""Routers in front of replicas (simserve.policies.routing)."""
from __future__ import annotations

import warnings

import pytest

from simserve.policies.routing import PrefixAffinity, make_router
from tests.traces import needs_trace


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


@pytest.mark.parametrize("name", ["vllm", "sarathi", "chunked"])
def test_router_is_an_option_of_the_chunked_family(name):
    from simserve.errors import ConfigError
    from simserve.policies import make_config
    with pytest.raises(ConfigError, match="router: expected one of"):
        make_config(name, {"router": "random"})
    with pytest.raises(ConfigError, match="affinity_blocks"):
        make_config(name, {"router": "prefix_affinity", "affinity_blocks": 0})
    assert make_config(name, {"router": "least_kv"}).router == "least_kv"


def test_the_router_option_routes():
    """A router other than the default replaces the deployment's: round-robin over two
    replicas puts every other request on each (least-outstanding does not, under skew)."""
    from simserve.api import simulate
    a = simulate("vllm", num_gpus=2, num_requests=200, rate=6, seed=3).summary
    b = simulate("vllm", num_gpus=2, num_requests=200, rate=6, seed=3,
                 router="round_robin").summary
    assert a["mean_ttft_ms"] != b["mean_ttft_ms"]


@needs_trace("mooncake-conversation")
@pytest.mark.parametrize("old,new", [("vllm-routed", "vllm"), ("sarathi-routed", "sarathi")])
def test_deprecated_routed_names_are_the_option_with_one_warning(old, new):
    from simserve.api import simulate
    from simserve.policies import ALIASES, get_policy, policy_names
    assert ALIASES[old] == new and old not in policy_names()
    with pytest.warns(FutureWarning, match=f"policy '{old}' is deprecated: use policy '{new}'"):
        assert get_policy(old) == get_policy(new)
    kw = dict(num_gpus=2, trace="mooncake-conversation", num_requests=150, rate=6, seed=3,
              router="prefix_affinity")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what a user's run has: shown once, not per call
        a = simulate(old, **kw).requests.drop(columns="policy")
    assert len([w for w in caught if old in str(w.message)]) == 1
    b = simulate(new, **kw).requests.drop(columns="policy")
    assert a.equals(b)


def test_a_deprecated_name_warns_once_when_a_dependency_adds_a_filter():
    """A filter added mid-run (pandas adds some on import) resets the warnings registries:
    the deprecation is still shown once, not again at each later lookup of the name."""
    from simserve.policies import get_policy
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        get_policy("vllm-routed")
        warnings.filterwarnings("ignore", message="an unrelated dependency's warning")
        get_policy("vllm-routed")
    assert len([w for w in caught if "vllm-routed" in str(w.message)]) == 1


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
