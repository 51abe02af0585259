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
