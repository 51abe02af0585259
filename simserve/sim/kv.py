"""Paged KV block pools with check-then-commit allocation (nano-vllm's block manager idea).

A pool only counts blocks: which request holds how many is the owner's bookkeeping
(`RequestTable.blocks` for the GPU pool). Over-commit is a bug, so it raises.
"""
from __future__ import annotations

from typing import Any


class KVOvercommitError(RuntimeError):
    pass


class BlockPool:
    __slots__ = ("name", "num_blocks", "block_size", "num_free", "peak_used")

    def __init__(self, name: str, num_blocks: int, block_size: int = 16):
        if num_blocks < 1:
            raise ValueError(f"{name}: KV pool must hold at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"{name}: block size must be positive")
        self.name = name
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.num_free = int(num_blocks)
        self.peak_used = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> None:
        if n < 0 or n > self.num_free:
            raise KVOvercommitError(f"{self.name}: allocate {n} blocks with {self.num_free} free")
        self.num_free -= n
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used

    def free(self, n: int) -> None:
        if n < 0 or self.num_free + n > self.num_blocks:
            raise KVOvercommitError(f"{self.name}: free {n} blocks with {self.num_free} free "
                                    f"of {self.num_blocks}")
        self.num_free += n


class PrefixCachingBlockPool(BlockPool):
    """A `BlockPool` with vLLM V1's automatic prefix cache (`vllm/v1/core/block_pool.py`).

    Blocks are counted as before, but a full block can carry a content hash. Hashed blocks are
    shared and reference-counted; one whose count drops to 0 stays cached and joins the *free
    queue* (`num_free` counts it). The free queue is LRU: `allocate` takes blocks from its head
    and evicts the hash of each cached block it takes; freed blocks go to its tail. A request
    frees its blocks tail first, so the private end of a prompt is evicted before its shared
    head (vLLM's `free_blocks(reversed(req_blocks))`).

    The queue holds three kinds of entries, in LRU order:
      - an anonymous run (value: a count): blocks without a hash (partial blocks, blocks never
        registered); only their number matters;
      - a shared cached block (key: its hash, value None), which any request can hit;
      - a private run (value [lo, hi, rid]): blocks lo..hi-1 of request rid whose content is
        its own (generated tokens; every block of a trace without hash_ids). Only rid can hit
        them, right after its shared prefix, so they need no hashes: the run is freed tail
        first as one entry and evicted from block hi-1 down, one count at a time.
    A hash registered while another block already holds it stays anonymous (vLLM keeps such
    duplicates cached too; here they cannot serve a hit after the first copy is evicted).
    """

    __slots__ = ("_q", "_run", "ref", "priv", "epoch", "num_evictions")

    def __init__(self, name: str, num_blocks: int, block_size: int = 16):
        super().__init__(name, num_blocks, block_size)
        from collections import OrderedDict
        # (run,) -> anonymous run size, a cached hash -> None, ("p", run) -> [lo, hi, rid]
        self._q: OrderedDict[Any, Any] = OrderedDict({(0,): int(num_blocks)})
        self._run = 1
        self.ref: dict[int, int] = {}  # cached hash -> requests holding its block
        self.priv: dict[int, tuple] = {}  # rid -> key of its private run in the queue
        self.epoch = 0  # bumped whenever what a lookup could find changes
        self.num_evictions = 0

    # -- anonymous blocks (what the counting pool's callers use) ---------------------------
    def allocate(self, n: int) -> None:
        n = int(n)
        if n < 0 or n > self.num_free:
            raise KVOvercommitError(f"{self.name}: allocate {n} blocks with {self.num_free} free")
        self.num_free -= n  # `BlockPool.allocate`, inline (a super() call costs ~0.3 us)
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used
        q = self._q
        while n:
            k = next(iter(q))
            v = q[k]
            if v is None:  # a shared cached block at the head: reused, its hash evicted
                del q[k]
                del self.ref[k]
                self.num_evictions += 1
                self.epoch += 1
                n -= 1
            elif type(v) is int:
                if v > n:
                    q[k] = v - n
                    return
                del q[k]
                n -= v
            else:  # a private run: its last blocks go first
                m = min(n, v[1] - v[0])
                v[1] -= m
                n -= m
                self.num_evictions += m
                self.epoch += 1
                if v[1] == v[0]:
                    del q[k]
                    del self.priv[v[2]]

    def free(self, n: int) -> None:
        super().free(n)
        if n:
            self._append_anon(n)

    def _append_anon(self, n: int) -> None:
        n = int(n)
        q = self._q
        if q:
            last = next(reversed(q))
            if type(q[last]) is int:
                q[last] += n
                return
        q[(self._run,)] = n
        self._run += 1

    # -- shared (hashed) blocks ---------------------------------------------------------------
    def num_cached(self) -> int:
        return len(self.ref) + sum(self._q[k][1] - self._q[k][0] for k in self.priv.values())

    def lookup(self, hashes) -> tuple[int, int]:
        """Longest cached prefix of `hashes`: (blocks hit, how many of them are unreferenced,
        i.e. would leave the free queue when touched)."""
        ref = self.ref
        h = e = 0
        for x in hashes:
            r = ref.get(x)
            if r is None:
                break
            h += 1
            e += r == 0
        return h, e

    def touch(self, hashes) -> None:
        """A request takes the cached blocks `hashes` (a lookup's hit prefix)."""
        ref, q = self.ref, self._q
        for x in hashes:
            r = ref[x]
            if r == 0:
                del q[x]
                self.num_free -= 1
                self.epoch += 1
            ref[x] = r + 1
        self._note_peak()

    def _note_peak(self) -> None:
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used

    def register(self, h: int) -> bool:
        """An anonymous block the caller holds is now full with content `h`: cache it (False,
        and it stays anonymous, if another block already holds `h`)."""
        if h in self.ref:
            return False
        self.ref[h] = 1
        self.epoch += 1
        return True

    def release(self, hashes_tail_first) -> None:
        """A request drops its hashed blocks (None: a block left anonymous), tail first."""
        ref, q = self.ref, self._q
        for x in hashes_tail_first:
            if x is None:
                super().free(1)
                self._append_anon(1)
                continue
            r = ref[x] - 1
            ref[x] = r
            if r == 0:
                if self.num_free + 1 > self.num_blocks:
                    raise KVOvercommitError(f"{self.name}: release past capacity")
                self.num_free += 1
                q[x] = None
                self.epoch += 1

    def free_ahead(self, hashes, rid: int) -> int:
        """Blocks `allocate` can take before it evicts one of the cached blocks `hashes` or
        rid's private run (all free blocks if neither is in the free queue)."""
        keys, pk, n = set(hashes), self.priv.get(rid), 0
        for k, v in self._q.items():
            if v is None:
                if k in keys:
                    return n
                n += 1
            elif type(v) is int:
                n += v
            elif k == pk:
                return n
            else:
                n += v[1] - v[0]
        return n

    # -- private runs ---------------------------------------------------------------------------
    def private_cached(self, rid: int) -> tuple[int, int]:
        """(first block, number of blocks) of rid's cached private run; (0, 0) if none."""
        k = self.priv.get(rid)
        if k is None:
            return 0, 0
        v = self._q[k]
        return v[0], v[1] - v[0]

    def release_private(self, rid: int, lo: int, hi: int) -> None:
        """rid frees its private blocks lo..hi-1 (after its anonymous tail, before its shared
        blocks); they stay cached for rid alone."""
        self.drop_private(rid)
        n = hi - lo
        if n <= 0:
            return
        BlockPool.free(self, n)
        key = ("p", self._run)
        self._run += 1
        self._q[key] = [lo, hi, rid]
        self.priv[rid] = key
        self.epoch += 1

    def release_unshared(self, rid: int, anon: int, n: int) -> None:
        """rid, which holds no shared blocks, frees them all: `free(anon)` (its anonymous
        tail), then `release_private(rid, 0, n)` (its n full blocks), in one call (a finish
        of a trace without hash_ids; tests/test_vllm_commit_fastpaths.py ties the two)."""
        free = self.num_free + anon
        if anon < 0 or free > self.num_blocks:
            raise KVOvercommitError(f"{self.name}: free {anon} blocks with {self.num_free} free "
                                    f"of {self.num_blocks}")
        self.num_free = free
        q = self._q
        if anon:  # `_append_anon`
            last = next(reversed(q)) if q else None
            if last is not None and type(q[last]) is int:
                q[last] += anon
            else:
                q[(self._run,)] = anon
                self._run += 1
        key = self.priv.pop(rid, None)  # `drop_private`
        if key is not None:
            v = q[key]
            q[key] = v[1] - v[0]
            self.epoch += 1
        if n > 0:
            if free + n > self.num_blocks:
                raise KVOvercommitError(f"{self.name}: free {n} blocks with {free} free "
                                        f"of {self.num_blocks}")
            self.num_free = free + n
            key = ("p", self._run)
            self._run += 1
            q[key] = [0, n, rid]
            self.priv[rid] = key
            self.epoch += 1

    def touch_private(self, rid: int, m: int) -> None:
        """rid takes back the first m blocks of its private run; the rest of the run can no
        longer be hit (a gap precedes it) and becomes anonymous where it stands."""
        key = self.priv.pop(rid)
        v = self._q[key]
        if m > v[1] - v[0]:
            raise KVOvercommitError(f"{self.name}: touch {m} of {v[1] - v[0]} private blocks")
        self.num_free -= m
        left = v[1] - v[0] - m
        if left:
            self._q[key] = left
        else:
            del self._q[key]
        self.epoch += 1
        self._note_peak()

    def drop_private(self, rid: int) -> None:
        """rid's private run (if any) can no longer be hit: anonymous where it stands."""
        key = self.priv.pop(rid, None)
        if key is not None:
            v = self._q[key]
            self._q[key] = v[1] - v[0]
            self.epoch += 1
