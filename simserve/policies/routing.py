"""Routers in front of data-parallel replicas: the `router` option of `vllm`, `sarathi`,
`chunked` and their variants (num_gpus / tp replicas), applied by `vllm_engine.chunked_replicas`
through `route`.

A router is a function `on_arrival(rid)` that picks one replica and calls its `enqueue`:

- `round_robin`: replicas in turn, whatever their load;
- `least_outstanding`: the fewest requests held (running + waiting), lowest index on ties
  (what `vllm` and `sarathi` do without a router option);
- `least_kv`: the lowest share of KV blocks in use, then the fewest requests;
- `prefix_affinity`: the replica that last served the longest prefix of this prompt, of at
  least `affinity_blocks` blocks (its Mooncake `hash_ids`, one per 512 prompt tokens), as the
  SGLang router's cache-aware policy and llm-d's prefix scorer do; a prompt with no such
  prefix goes where consistent hashing of its first `affinity_blocks` blocks puts it on a
  ring of replicas. A replica
  holding more than `affinity_load_factor` × the mean load (+1) is skipped for the next one
  on the ring (consistent hashing with bounded loads). Multi-turn sessions get session
  affinity from this: a later turn's prompt starts with the earlier turn's, so it matches
  the replica that holds it. Requests without `hash_ids` fall back to `least_outstanding`.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools

from simserve.errors import did_you_mean

ROUTERS = ("least_outstanding", "round_robin", "least_kv", "prefix_affinity")
DEFAULT_ROUTER = "least_outstanding"  # what `deploy`'s own router does for these replicas
RING_POINTS = 64  # virtual nodes per replica on the consistent-hashing ring


def check_router(name: str) -> None:
    if name not in ROUTERS:
        raise ValueError(f"router: expected one of {', '.join(ROUTERS)}, got {name!r}"
                         f"{did_you_mean(str(name), ROUTERS)}")


def check_router_options(router: str, affinity_blocks: int, affinity_load_factor: float) -> None:
    """The `router` option and its prefix_affinity parameters, as a config's `validate` checks
    them (a ValueError naming the field)."""
    check_router(router)
    if isinstance(affinity_blocks, bool) or not isinstance(affinity_blocks, int) \
            or affinity_blocks < 1:
        raise ValueError(f"affinity_blocks: expected a positive integer, got "
                         f"{affinity_blocks!r}")
    f = affinity_load_factor
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 1:
        raise ValueError(f"affinity_load_factor: expected a number >= 1, got {f!r}")


def _h(*parts) -> int:
    """A stable 64-bit hash (Python's `hash` of ints is stable too, but not across types)."""
    d = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little")


class PrefixAffinity:
    """Longest remembered prefix → its replica; else a bounded-load consistent-hash ring."""

    def __init__(self, targets: list, hash_ids, affinity_blocks: int, load_factor: float):
        self.targets, self.hash_ids = targets, hash_ids
        self.k, self.factor = affinity_blocks, load_factor
        ring = sorted((_h("replica", i, v), i) for i in range(len(targets))
                      for v in range(RING_POINTS))
        self.ring_keys = [k for k, _ in ring]
        self.ring_idx = [i for _, i in ring]
        self.owner: dict[int, int] = {}   # prefix chain hash -> replica that last served it
        self.num_matched = 0
        self.num_routed = 0

    def _cap(self) -> float:
        loads = [t.load() for t in self.targets]
        return self.factor * sum(loads) / len(loads) + 1

    def _ring_pick(self, key: int, cap: float) -> int:
        start = bisect.bisect(self.ring_keys, key)
        n = len(self.ring_keys)
        for j in range(n):
            i = self.ring_idx[(start + j) % n]
            if self.targets[i].load() <= cap:
                return i
        return self.ring_idx[start % n]

    def __call__(self, rid: int) -> None:
        ids = self.hash_ids[rid]
        self.num_routed += 1
        if ids is None or len(ids) == 0:
            min(self.targets, key=_load).enqueue(rid)
            return
        chains, c = [], 0
        for h in ids:
            c = _h(c, int(h))
            chains.append(c)
        cap = self._cap()
        pick = None
        for c in reversed(chains[self.k - 1:]):   # the longest prefix, of >= k blocks,
            # some replica served (a shorter one, e.g. a system prompt every request
            # shares, would pin every request to one replica)
            i = self.owner.get(c)
            if i is not None and self.targets[i].load() <= cap:
                pick = i
                self.num_matched += 1
                break
        if pick is None:
            pick = self._ring_pick(chains[min(self.k, len(chains)) - 1], cap)
        for c in chains:
            self.owner[c] = pick
        self.targets[pick].enqueue(rid)


def _load(t) -> int:
    return t.load()


def _kv_share(t) -> tuple:
    """Share of the replica's KV blocks in use, then its load (least_kv's key)."""
    share = getattr(t, "kv_share", None)
    if share is not None:
        return share()
    pool = t.kv_pools()[0]
    return (pool.num_used / max(pool.num_blocks, 1), t.load())


class _Sent:
    """A replica as a router sees it: its `load()` (and KV use) plus the requests (and their
    prompts' blocks) the router sent it at the current instant. A replica with an API-server
    front end counts a request only once the front end hands it on, so without this every
    arrival of a same-instant burst (a trace's equal timestamps) would see the same loads and
    go to the same replica. A replica whose `load()` counts its front end already
    (`counts_front_end`, the vLLM-family runtime) gets no such count."""

    __slots__ = ("at", "env", "lags", "num", "prompt", "replica", "tokens")

    def __init__(self, replica, env, prompt=None):
        self.replica, self.env, self.prompt = replica, env, prompt
        self.at, self.num, self.tokens = -1.0, 0, 0
        self.lags = not getattr(replica, "counts_front_end", False)

    def _now(self) -> bool:
        return self.env.now == self.at

    def load(self) -> int:
        return self.replica.load() + (self.num if self.lags and self._now() else 0)

    def kv_share(self) -> tuple:
        pool = self.replica.kv_pools()[0]
        sent = self.tokens / pool.block_size if self._now() else 0.0
        return ((pool.num_used + sent) / max(pool.num_blocks, 1), self.load())

    def enqueue(self, rid: int) -> None:
        if not self._now():
            self.at, self.num, self.tokens = self.env.now, 0, 0
        self.num += 1
        if self.prompt is not None:
            self.tokens += int(self.prompt[rid])
        self.replica.enqueue(rid)

    def kv_pools(self):
        return self.replica.kv_pools()


def make_router(name: str, targets: list, hash_ids=None, affinity_blocks: int = 2,
                load_factor: float = 1.25, env=None, prompt=None):
    """`on_arrival(rid)` for router `name` over `targets` (replicas: `load()`, `enqueue`,
    `kv_pools()`); `hash_ids[rid]`: the prompt's block hashes, or None for every request;
    `env`: the simulation's environment, to count same-instant sends (`_Sent`), and
    `prompt[rid]` their prompt tokens."""
    check_router(name)
    if len(targets) == 1:
        return targets[0].enqueue
    if env is not None:
        targets = [_Sent(t, env, prompt) for t in targets]
    if name == "round_robin":
        turn = itertools.cycle(targets)
        return lambda rid: next(turn).enqueue(rid)
    if name == "least_kv":
        return lambda rid: min(targets, key=_kv_share).enqueue(rid)
    if name == "prefix_affinity" and hash_ids is not None:
        return PrefixAffinity(targets, hash_ids, affinity_blocks, load_factor)
    return lambda rid: min(targets, key=_load).enqueue(rid)


def route(ctx, cfg, dep):
    """The deployment `dep` of replicas with arrivals sent by `cfg.router` (its
    `affinity_blocks`, `affinity_load_factor`). The default router keeps `deploy`'s own, which
    makes the same choices: these replicas' `load()` counts their front end."""
    if cfg.router != DEFAULT_ROUTER:
        dep.on_arrival = make_router(cfg.router, list(dep.engines),
                                     getattr(ctx.table, "hash_ids", None), cfg.affinity_blocks,
                                     cfg.affinity_load_factor, ctx.env, ctx.table.prompt)
    return dep
