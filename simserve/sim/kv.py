"""Paged KV block pools with check-then-commit allocation (nano-vllm's block manager idea).

A pool only counts blocks: which request holds how many is the owner's bookkeeping
(`RequestTable.blocks` for the GPU pool). Over-commit is a bug, so it raises.
"""
from __future__ import annotations


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
    frees its blocks tail first (`release`), so the private end of a prompt is evicted before
    its shared head (vLLM's `free_blocks(reversed(req_blocks))`).

    Blocks without a hash (partial blocks, blocks not yet registered) are anonymous: only their
    number matters, so runs of them sit in the queue as counts. A hash registered while another
    block already holds it stays anonymous (vLLM keeps such duplicates cached too; a small
    difference: here they cannot serve a hit after the first copy is evicted).
    """

    __slots__ = ("_q", "_run", "ref", "epoch", "num_evictions")

    def __init__(self, name: str, num_blocks: int, block_size: int = 16):
        super().__init__(name, num_blocks, block_size)
        from collections import OrderedDict
        self._q = OrderedDict({(0,): int(num_blocks)})  # (n,): an anonymous run; int: a hash
        self._run = 1
        self.ref: dict[int, int] = {}  # cached hash -> requests holding its block
        self.epoch = 0  # bumped whenever what a lookup could find changes
        self.num_evictions = 0

    # -- anonymous blocks (what the counting pool's callers use) ---------------------------
    def allocate(self, n: int) -> None:
        super().allocate(n)
        q = self._q
        while n:
            k = next(iter(q))
            if type(k) is tuple:
                v = q[k]
                if v > n:
                    q[k] = v - n
                    return
                del q[k]
                n -= v
            else:  # a cached block at the head: reuse it, its hash is evicted
                del q[k]
                del self.ref[k]
                self.num_evictions += 1
                self.epoch += 1
                n -= 1

    def free(self, n: int) -> None:
        super().free(n)
        if n:
            self._append_anon(n)

    def _append_anon(self, n: int) -> None:
        q = self._q
        if q:
            last = next(reversed(q))
            if type(last) is tuple:
                q[last] += n
                return
        q[(self._run,)] = n
        self._run += 1

    # -- hashed blocks ------------------------------------------------------------------------
    def num_cached(self) -> int:
        return len(self.ref)

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
