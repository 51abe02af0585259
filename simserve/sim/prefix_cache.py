"""Content hashes of KV blocks for prefix caching, and the cache statistics vLLM reports.

vLLM V1 (`vllm/v1/core/kv_cache_utils.py`) hashes every *full* block of a request's tokens,
chained: block j's hash covers block j-1's hash and block j's token ids, so equal hashes mean
equal prefixes. The last partial block is never hashed. A simulator has no token ids; it has
Mooncake's `hash_ids`, one per 512-token block (the last may be partial), equal exactly when
the prefixes up to and including that block are equal. With vLLM's 16-token blocks, block j of
a request lies in Mooncake block m = j * 16 // 512 at sub-index s = j mod 32, and its hash is

    chain[m] = mix(chain[m-1], hash_ids[m]),    key[j] = mix(chain[m], s)

so two requests that share their first k hash_ids share their first 32k KV-block hashes (and
no more: block 32k belongs to a different Mooncake block). Only blocks that lie wholly inside
the prompt take prompt keys. Every other block - one holding generated tokens, or any block
of a request without hash_ids (Azure, synthetic traces) - is private to the request: nobody
else can hit it, but the request itself can, after a preemption, as in vLLM (whose hashes
cover output tokens too). Private blocks need no hash: the pool keeps them as one run per
request, positions shared_count .. (see `PrefixCachingBlockPool`). `mix` is splitmix64 on
64-bit integers: deterministic across runs and processes (no Python string hashing).
"""
from __future__ import annotations

import numpy as np

from simserve.errors import ConfigError

_M64 = (1 << 64) - 1
_SALT_CHAIN = 0x243F6A8885A308D3
_SALT_SUB = 0x13198A2E03707344


def _mix(x: int) -> int:
    """splitmix64's finaliser on a Python int (mod 2^64)."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class BlockHasher:
    """The first n KV-block hashes of a request (prompt keys cached per request)."""

    def __init__(self, table, block_size: int):
        self.table, self.bs = table, int(block_size)
        self.hash_ids = getattr(table, "hash_ids", None)
        self.sub = 0
        if self.hash_ids is not None:
            m = int(table.hash_block_tokens)
            if m % self.bs:
                raise ConfigError(f"prefix caching: the trace's hash blocks of {m} tokens are "
                                  f"not a multiple of block_size {self.bs}")
            self.sub = m // self.bs
        self._prompt: dict[int, list[int]] = {}  # rid -> its prompt keys

    def _prompt_keys(self, rid: int) -> list[int]:
        keys = self._prompt.get(rid)
        if keys is None:
            keys = []
            if self.hash_ids is not None:
                hid = self.hash_ids[rid]
                full = min(int(self.table.prompt[rid]) // self.bs, len(hid) * self.sub)
                if full:
                    chain, c = [], _SALT_CHAIN
                    for x in hid[:-(-full // self.sub)]:
                        x = int(x)
                        c = _mix(c ^ _mix(x & _M64))
                        chain.append(c)
                    j = np.arange(full, dtype=np.uint64)
                    base = np.repeat(np.asarray(chain, dtype=np.uint64), self.sub)[:full]
                    sub = _mix_np((j % np.uint64(self.sub)) ^ np.uint64(_SALT_SUB))
                    keys = _mix_np(base ^ sub).tolist()
            self._prompt[rid] = keys
        return keys

    def shared_count(self, rid: int) -> int:
        """How many leading blocks take prompt keys (others can hit them); the blocks after
        them are private to the request (see `PrefixCachingBlockPool`'s private runs)."""
        return len(self._prompt_keys(rid))

    def hashes(self, rid: int, n: int) -> list[int]:
        """Hashes of the shared blocks 0 .. min(n, shared_count) - 1 of request `rid`."""
        return self._prompt_keys(rid)[:n]

    def forget(self, rid: int) -> None:
        self._prompt.pop(rid, None)


class PrefixCacheStats:
    """vLLM's `PrefixCacheStats` (vllm/v1/metrics/stats.py): per lookup of a request being
    scheduled from the waiting queue, `queries` += its tokens and `hits` += the tokens found;
    lookups of previously preempted requests are counted apart, so a victim re-finding its
    own blocks does not inflate the hit rate. (vLLM records every lookup attempt, also one
    whose allocation then fails; here only the lookup that admits the request counts.)"""

    __slots__ = ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
                 "preempted_hits")
    requests: int
    queries: int
    hits: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def summarize_prefix_cache(stats: list[dict]) -> dict:
    """Summary fields from the engines' stats (summed): `prefix_cache_hit_rate` = hits /
    queries of first lookups (vLLM's `vllm:prefix_cache_hits` / `_queries`),
    `prefix_cache_saved_tokens` = every prompt token served from the cache instead of being
    computed, re-lookups after a preemption included."""
    tot = {k: sum(s[k] for s in stats) for k in stats[0]}
    q = tot["queries"]
    return {"prefix_cache_hit_rate": tot["hits"] / q if q else 0.0,
            "prefix_cache_saved_tokens": int(tot["hits"] + tot["preempted_hits"])}
