"""The decode pool of `distserve` and the KV hand-off from the prefill pool.

Hand-off (FCFS over prefilled requests, head-of-line blocking): the head is admitted by the
decode instance with the most free blocks that can hold its whole lifetime (prompt + output
tokens: Toolagent outputs are tiny next to prompts, and the reservation spares the decode pool
vLLM's recompute preemption, which a disaggregated decode instance could not do locally);
then its KV moves over NVLink, one shard per (prefill rank, decode rank) pair, each a transfer
on that pair's `Channel`, so concurrent hand-offs contend. When every shard has arrived the
prefill blocks are freed and the first token is delivered (vLLM's disaggregated decode
instance returns it), so an isolated request's TTFT = prefill time + transfer time.

Decode: continuous batching; a request whose KV arrived joins at the next step boundary.
Between joins and finishes the steps are leapt exactly: the engine sleeps until the first
finish or a wake-up, then applies the steps that completed (the one in progress runs out).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from simserve.policies.base import EngineBase
from simserve.policies.distserve.prefill import make_pool
from simserve.policies.signal import Signal, sleep_until
from simserve.sim.leap import decode_ends

LEAP_CAP = 8192


class DecodeInstance(EngineBase):
    def __init__(self, ctx, cfg, index: int, gpus: list[int]):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        self.pool, self.cost, self.kv_summary = make_pool(
            ctx, cfg, f"decode{index}.gpu_kv", len(gpus), cfg.max_num_seqs, cfg.max_num_seqs,
            cfg.decode_blocks_override)
        self.running: list[int] = []
        self.ready: list[int] = []
        self.num_reserved = 0  # admitted, KV in flight or resident
        self.reserved = {}
        self.signal = Signal(ctx.env)
        self.freed = None  # set by the hand-off: called when blocks are freed

    def need_blocks(self, rid: int) -> int:
        t = self.ctx.table
        return self.pool.blocks_for(int(t.prompt[rid] + t.output[rid]))

    def reserve(self, rid: int) -> None:
        nb = self.need_blocks(rid)
        self.pool.allocate(nb)
        self.reserved[rid] = nb
        self.num_reserved += 1

    def release(self, ids) -> None:
        self.pool.free(sum(self.reserved.pop(int(r)) for r in ids))
        self.num_reserved -= len(ids)
        self.freed()

    def join(self, rid: int) -> None:
        self.ready.append(rid)
        self.signal.fire()

    def run(self):
        env, t, rec = self.ctx.env, self.ctx.table, self.ctx.recorder
        clock = 0.0
        while True:
            if self.ready:
                room = self.cfg.max_num_seqs - len(self.running)
                self.running += self.ready[:room]
                del self.ready[:room]
            if not self.running:
                yield self.signal.wait()
                clock = env.now
                continue
            ids = np.asarray(self.running, dtype=np.int64)
            k = int((t.output[ids] - t.generated[ids]).min()) if self.cfg.leap else 1
            k = min(k, LEAP_CAP)
            ends = decode_ends(self.cost, clock, t.computed[ids], k)
            woken = yield from sleep_until(env, float(ends[-1]), self.signal.wait())
            kd = k
            if woken and env.now < ends[-1]:  # finish the step in progress, then let it join
                j = int(np.searchsorted(ends, env.now, "right"))
                kd = j if (j > 0 and ends[j - 1] == env.now) else j + 1
                yield from sleep_until(env, float(ends[kd - 1]))
            if kd > 1:
                t.emit_many(ids, ends[:kd - 1])
            if rec.trace is not None:
                rec.trace.iteration(
                    f"decode instance {self.index} (GPU {','.join(map(str, self.gpus))})",
                    clock, float(ends[kd - 1]), "decode" if kd == 1 else f"decode x{kd}",
                    steps=kd, prefill_tokens=0, decodes=len(ids),
                    kv_blocks_used=self.pool.num_used)
            clock = float(ends[kd - 1])
            done = t.emit(ids, clock)
            t.computed[ids] += kd
            rec.num_iterations += kd
            rec.num_steps_scheduled += 1
            if len(done):
                gone = set(done.tolist())
                self.running = [r for r in self.running if r not in gone]
                self.release(done)
            rec.sample(clock, self.index, len(self.running), len(self.ready), self.pool.num_used,
                       t.num_emitted)


class Handoff:
    """Moves prefilled requests into decode instances, FCFS, over NVLink channels (or the
    inter-node link between two pools)."""

    def __init__(self, ctx, decoders: list[DecodeInstance], links=None):
        # links: the channels between the pools (`pools.NicLinks`); None: the cluster's NVLink
        self.ctx, self.decoders = ctx, decoders
        self.links = links if links is not None else ctx.cluster
        self.queue: deque[tuple[int, object]] = deque()
        self.signal = Signal(ctx.env)
        for d in decoders:
            d.freed = self.signal.fire
        self.num_transfers = 0

    def submit(self, rid: int, prefill) -> None:
        self.queue.append((rid, prefill))
        self.signal.fire()

    def run(self):
        while True:
            while self.queue:
                rid, pre = self.queue[0]
                fits = [d for d in self.decoders if d.pool.can_allocate(d.need_blocks(rid))]
                if not fits:
                    break
                dec = max(fits, key=lambda d: (d.pool.num_free, -d.index))
                dec.reserve(rid)
                self.queue.popleft()
                self.ctx.env.process(self._move(rid, pre, dec))
            yield self.signal.wait()

    def shards(self, rid: int, pre, dec) -> list[tuple[int, int, float]]:
        """(source GPU, destination GPU, bytes) of each shard of the prompt's KV."""
        m = self.ctx.model
        n = max(len(pre.gpus), len(dec.gpus))
        nbytes = float(self.ctx.table.prompt[rid]) * m.kv_bytes_per_token / n
        return [(pre.gpus[j % len(pre.gpus)], dec.gpus[j % len(dec.gpus)], nbytes)
                for j in range(n)]

    def _move(self, rid: int, pre, dec):
        env, cl, t = self.ctx.env, self.links, self.ctx.table
        shards = self.shards(rid, pre, dec)
        yield env.all_of([cl.nvlink_channel(a, b).start(nb) for a, b, nb in shards])
        self.num_transfers += 1
        if cl is not self.ctx.cluster:
            cl.stats["num_handoffs"] += 1
            cl.stats["bytes_moved"] += int(sum(nb for _a, _b, nb in shards))
        pre.release(rid)
        done = t.emit(np.asarray([rid], dtype=np.int64), env.now)
        if len(done):
            dec.release(done)
        else:
            dec.join(rid)
