"""The KV bookkeeping of a vLLM-family engine: a paged pool, each request's blocks in the request
table, and (when on) vLLM V1's automatic prefix caching (its `KVCacheManager` over a
`PrefixCachingBlockPool`).

With prefix caching, a request taken from the waiting queue (new, or preempted and back) first
claims the longest cached prefix of its full blocks (never its last token: at most
(num_tokens - 1) // block_size blocks, as `get_computed_blocks`), starts its prefill after it
and pays only for the new blocks plus the cached ones it pulls out of the free queue. Prompt
blocks are hashed when a chunk that fills them is scheduled (`cache_blocks`); blocks filled by
decodes are hashed when the request frees them (only the request itself can ever hit those,
and only after that). Freed blocks keep their hashes until LRU eviction reuses them.

A request's blocks: [shared (prompt keys, hashed; `_reg`) | private (its own content, cached
as one run when freed) | anonymous tail (the partial block, blocks not full)].
"""
from __future__ import annotations

import numpy as np

from simserve.sim.kv import BlockPool, PrefixCachingBlockPool
from simserve.sim.prefix_cache import BlockHasher, PrefixCacheStats


class KvBook:
    """One engine's KV blocks. `pool` is the paged pool; `views` are memoryviews of the request
    table's (computed, blocks, num_tokens, generated, output) arrays (never reallocated); `pc`
    the prefix-cache statistics, None when caching is off."""

    def __init__(self, table, name: str, num_blocks: int, block_size: int, caching: bool):
        self.table = table
        self.views = (memoryview(table.computed), memoryview(table.blocks),
                      memoryview(table.num_tokens), memoryview(table.generated),
                      memoryview(table.output))
        self.pc: PrefixCacheStats | None = None
        if caching:
            self.pool: BlockPool = PrefixCachingBlockPool(name, num_blocks, block_size)
            self.pc = PrefixCacheStats()
            self._hasher = BlockHasher(table, block_size)
            self._reg: dict[int, list] = {}  # rid -> hashes of its leading blocks (None: anon)
            self._look: tuple | None = None  # memo of the last lookup
        else:
            self.pool = BlockPool(name, num_blocks, block_size)

    # -- every pool ---------------------------------------------------------------------
    def blocks_needed(self, rid: int, tokens: int) -> int:
        """New blocks `rid` needs to hold `tokens` tokens of KV."""
        return max(0, -(-tokens // self.pool.block_size) - self.views[1][rid])

    def grow(self, rid: int, nb: int) -> None:
        self.pool.allocate(nb)
        self.views[1][rid] += nb

    def drop(self, rid: int) -> None:
        """Free all of `rid`'s KV (a preemption by recompute): no blocks, nothing computed."""
        t = self.table
        if self.pc is not None:
            self.release(rid)
        else:
            self.pool.free(int(t.blocks[rid]))
        t.blocks[rid] = 0
        t.computed[rid] = 0

    def free_finished(self, dl: list) -> None:
        """Free the KV of the finished requests `dl`."""
        bv = self.views[1]
        if self.pc is not None:
            forget = self._hasher.forget
            release = self.release_unshared if self._hasher.hash_ids is None else self.release
            for r in dl:
                release(r)
                forget(r)
        else:
            self.pool.free(sum([bv[r] for r in dl]))
        for r in dl:
            bv[r] = 0

    def plan(self, r: int, left: int, admission_blocks, s) -> tuple[int, int, int, tuple | None]:
        """Admitting waiting request `r` with at most `left` tokens this step: (its first
        chunk, the blocks `admission_blocks(s, r, chunk)` reserves, the cached blocks it
        pulls out of the free queue, its cached prefix or None). With prefix caching the
        chunk starts after the cached prefix, and the reservation sees r as if it held it."""
        comp, blocks, ntok, _, _ = self.views
        if self.pc is None:
            k = min(ntok[r] - comp[r], left)
            return k, admission_blocks(s, r, k), 0, None
        hashes, h, p, e = self.lookup(r)
        hit = (h + p) * self.pool.block_size
        k = min(ntok[r] - hit, left)
        comp[r], blocks[r] = hit, h + p
        nb = admission_blocks(s, r, k)
        comp[r] = blocks[r] = 0
        return k, nb, e, (hashes, h, p)

    def admit(self, r: int, k: int, nb: int, claim: tuple | None) -> None:
        """Give admitted request `r` its cached prefix (`claim`, from `plan`) and `nb` new
        blocks for its first chunk of `k` tokens."""
        if claim is None:
            self.grow(r, nb)
            return
        hashes, h, p = claim
        self.claim_prefix(r, hashes, h, p)
        self.grow(r, nb)
        self.cache_upto(r, (h + p) * self.pool.block_size + k)

    # -- prefix caching -----------------------------------------------------------------
    def lookup(self, r: int) -> tuple[list, int, int, int]:
        """(r's shared hashes, shared blocks hit, private blocks hit, hit blocks now in the
        free queue)."""
        pool = self.pool
        n = self.views[2][r]
        key = (r, pool.epoch, n)
        if self._look is not None and self._look[0] == key:
            return self._look[1]
        # a full hit still recomputes the last token: at most (num_tokens - 1) // bs blocks
        most = (n - 1) // pool.block_size
        sc = self._hasher.shared_count(r)
        hashes = self._hasher.hashes(r, most)
        h, e = pool.lookup(hashes)
        p = 0
        if h == sc:  # the whole shared part hit: the private run, if cached, follows it
            lo, cnt = pool.private_cached(r)
            if cnt and lo == sc:
                p = min(cnt, most - h)
        out = (hashes, h, p, e + p)
        self._look = (key, out)
        return out

    def claim_prefix(self, r: int, hashes: list, h: int, p: int) -> None:
        """r (computed 0, no blocks) takes its h + p cached blocks and starts after them."""
        t, pool = self.table, self.pool
        pool.touch(hashes[:h])
        if p:
            pool.touch_private(r, p)
        else:
            pool.drop_private(r)  # unreachable behind a miss: as good as uncached
        self._reg[r] = hashes[:h]
        comp, blocks, ntok, _, _ = self.views
        blocks[r] = h + p
        comp[r] = (h + p) * pool.block_size
        self.pc.record(ntok[r], comp[r], bool(t.preemptions[r] > 0))

    def cache_upto(self, r: int, tokens: int) -> None:
        """Hash r's shared blocks that are full once `tokens` tokens have KV (vLLM
        `cache_blocks`); its private blocks are cached when it frees them (only r can hit
        them, and only after that)."""
        if self._hasher.hash_ids is None:
            return  # no request has shared blocks (`release` pops `_reg` with a default)
        reg = self._reg.setdefault(r, [])
        full = min(tokens // self.pool.block_size, self._hasher.shared_count(r))
        if full > len(reg):
            pool = self.pool
            for x in self._hasher.hashes(r, full)[len(reg):]:
                reg.append(x if pool.register(x) else None)

    def scheduled(self, ids, n) -> None:
        """A batch was scheduled (ids, tokens each): cache the shared blocks its prefill
        chunks fill. Nothing without prefix caching."""
        if self.pc is None or not len(ids) or self._hasher.hash_ids is None:
            return
        t = self.table
        ids, n = np.asarray(ids, dtype=np.int64), np.asarray(n, dtype=np.int64)
        pre = (n > 1) | (t.generated[ids] == 0)
        for r, k in zip(ids[pre].tolist(), n[pre].tolist()):
            self.cache_upto(r, int(t.computed[r]) + k)

    def release(self, r: int) -> None:
        """Free r's blocks tail first: the anonymous tail, its private run, then its shared
        blocks in reverse."""
        if self._hasher.hash_ids is None:
            self.release_unshared(r)
            return
        pool = self.pool
        cv, bv = self.views[:2]
        c = cv[r]
        self.cache_upto(r, c)
        reg = self._reg.pop(r, [])
        sc = self._hasher.shared_count(r)
        full = c // pool.block_size
        npriv = full - sc if len(reg) == sc and full > sc else 0
        pool.free(bv[r] - len(reg) - npriv)
        if npriv:
            pool.release_private(r, sc, full)
        else:
            pool.drop_private(r)
        pool.release(reversed(reg))

    def release_unshared(self, r: int) -> None:
        """`release` when the trace has no hash_ids: no request has shared blocks
        (shared_count 0, `_reg` empty), so r's full blocks are all its private run, the
        rest its anonymous tail (tests/test_vllm_commit_fastpaths.py ties it to `release`)."""
        cv, bv = self.views[:2]
        self._reg.pop(r, None)
        full = cv[r] // self.pool.block_size
        self.pool.release_unshared(r, bv[r] - full, full)

    def free_ahead(self, r: int, need: int, free: int) -> int:
        """Allocations that evict none of waiting head `r`'s shared cached hits (and, when
        it could be admitted with `free` blocks, none of its private run)."""
        hashes, h, _, _ = self.lookup(r)
        return self.pool.free_ahead(hashes[:h], r if need <= free else None)

    def stats(self) -> dict | None:
        if self.pc is None:
            return None
        return dict(self.pc.as_dict(), evictions=self.pool.num_evictions,
                    cached_blocks_at_end=self.pool.num_cached())
