"""R sequence-parallel ranks (TP groups) with their own KV pools, shared by the engines that
prefill with SP and decode rank-locally (`conflux`, `loongserve`); subclasses give `_iteration`.

What lives here: per-rank KV pools; prompts' head-sharded KV (`shard` blocks on every rank);
decode growth with recompute preemption (newest first on a rank that cannot grow); the move of a
finished prompt's KV to its decode rank over NVLink, started when its last chunk's iteration
starts (layer-by-layer pipelining overlaps it with that chunk, ConfluxServe §7), the request
joining its rank's decodes at the first iteration that starts after the transfer ends; token
emission and finishing; and exact event leaping: with no prefill pending and no KV in flight
the ranks repeat a decode-only step, and `_leap` does k of them at once (`sp_leap`), identical
to stepping.
"""
from __future__ import annotations

import numpy as np

from simserve.errors import ConfigError
from simserve.policies.base import EngineBase
from simserve.policies.sp_leap import flat_decodes, leap_ranks, per_rank
from simserve.sim.context import SimContext
from simserve.sim.kv import BlockPool
from simserve.sim.clock import at


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def shard_blocks(tokens: int, block_size: int, ranks: int) -> int:
    """Blocks one rank holds for a head-sharded prefill KV of `tokens` tokens (1/R of the heads)."""
    return -(-blocks_for(tokens, block_size) // ranks)


def instance_layout(num_gpus: int, instances: int, tp: int, kind: str) -> int:
    """Logical ranks per instance; ConfigError naming the field when the GPUs do not split."""
    if num_gpus % instances:
        raise ConfigError(f"policy {kind}: instances: {instances} does not divide "
                          f"hardware.num_gpus={num_gpus}")
    per = num_gpus // instances
    if per % tp:
        raise ConfigError(f"policy {kind}: tp: {tp} does not divide the {per} GPUs of an instance")
    return per // tp


class SpRanksEngine(EngineBase):
    """R logical ranks, one KV pool each (`kv_pools()`). Their counters stay in the shared
    `counts` dict the policy reports (ConfluxServe's instances share one), not `counters()`."""

    def __init__(self, ctx: SimContext, cfg, index: int, gpus: list[int], cost, est,
                 num_blocks: int):
        self.ctx, self.cfg, self.index, self.cost, self.est = ctx, cfg, index, cost, est
        self.R = cost.R
        tp = cfg.tp
        self.rank_gpus = [gpus[r * tp:(r + 1) * tp] for r in range(self.R)]
        bs = cfg.block_size
        self.pools = [BlockPool(f"xp{index}.rank{r}.kv", num_blocks, bs) for r in range(self.R)]
        n = ctx.table.n
        self.rank_of = np.full(n, -1, dtype=np.int64)
        self.shard = np.zeros(n, dtype=np.int64)     # shard blocks held on every rank
        self.pending: list[int] = []                 # prompts not fully prefilled, arrival order
        self.decodes: list[list[int]] = [[] for _ in range(self.R)]
        self.moving: list[tuple] = []                # (transfer event, rid, rank)
        self.clock = 0.0
        self._wake = None
        self.counts = {"num_kv_transfers": 0, "num_decode_preemptions": 0}

    def kv_pools(self) -> list[BlockPool]:
        return self.pools

    # -- router interface -------------------------------------------------------------------
    def queued_work(self) -> float:
        """Remaining prefill tokens queued here per logical rank (§5: normalised queued work)."""
        t = self.ctx.table
        ids = np.asarray(self.pending, dtype=np.int64)
        return float((t.num_tokens[ids] - t.computed[ids]).sum()) / self.R

    def enqueue(self, rid: int) -> None:
        self.pending.append(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- the engine process -------------------------------------------------------------------
    def _iteration(self):
        """(duration, apply) of the next iteration, or None when nothing can run yet."""
        raise NotImplementedError

    def run(self):
        env = self.ctx.env
        while True:
            self._land()
            busy = self.pending or any(self.decodes)
            if not busy and not self.moving:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                self.clock = max(self.clock, env.now)
                continue
            if self.cfg.leap and self._leap_ok() and self._leap():
                yield at(env, max(self.clock, env.now))  # exactly the clock (timeouts can miss an ulp)
                continue
            step = self._iteration()
            if step is None:  # nothing runnable until KV in flight lands
                if not self.moving and self._drop_partial():
                    continue
                if not self.moving:
                    raise RuntimeError(f"xp{self.index}: {len(self.pending)} prefills pending and "
                                       "nothing schedulable; KV pools too small?")
                yield env.any_of([ev for ev, _, _ in self.moving])
                self.clock = max(self.clock, env.now)
                continue
            dt, apply = step
            if self.ctx.recorder.trace is not None:
                self.trace_ranks(self.clock, self.clock + dt, 1)
            self.clock += dt
            self.ctx.recorder.num_iterations += 1
            self.ctx.recorder.num_steps_scheduled += 1
            yield at(env, max(self.clock, env.now))  # exactly the clock (timeouts can miss an ulp)
            apply()

    def trace_ranks(self, start: float, end: float, steps: int) -> None:
        """One trace event per rank for an iteration (or a leap of `steps`) of the instance:
        the rank's decodes, the prompt tokens it prefills (`last_prefill_per_rank`, set by the
        engine's `_iteration`; none in a leap) and its KV blocks in use."""
        pre = getattr(self, "last_prefill_per_rank", None) if steps == 1 else None
        for r in range(self.R):
            p = int(pre[r]) if pre is not None else 0
            nd = len(self.decodes[r])
            name = ("mixed" if p and nd else "prefill" if p else "decode" if steps == 1
                    else f"decode x{steps}")
            self.ctx.recorder.trace.iteration(
                f"instance {self.index} rank {r} (GPU {','.join(map(str, self.rank_gpus[r]))})",
                start, end, name, steps=steps, counted=r == 0, prefill_tokens=p, decodes=nd,
                kv_blocks_used=self.pools[r].num_used, pending_prefills=len(self.pending))
        self.last_prefill_per_rank = None

    def _drop_partial(self) -> bool:
        """Deadlock breaker, when nothing runs: partial prompts' shards keep the prompt at the
        head of the order from being placed. Recompute the newest partial prompt later (its
        shards are freed). A lone pending prompt in otherwise empty pools always fits
        (`check_fits`), so there is nothing to break then."""
        t = self.ctx.table
        part = [r for r in self.pending if self.shard[r] > 0]
        if not part or len(self.pending) < 2:
            return False
        rid = part[-1]
        self._free_shard(rid)
        t.computed[rid] = 0
        t.preemptions[rid] += 1
        self.counts["num_prefill_restarts"] = self.counts.get("num_prefill_restarts", 0) + 1
        return True

    def _land(self) -> None:
        """Requests whose KV transfer finished join their rank's decodes; shards are freed."""
        if not self.moving:
            return
        keep = []
        for ev, rid, g in self.moving:
            if ev.processed:  # the decode rank keeps its shard blocks (now in t.blocks)
                self._free_shard(rid, keep=g)
                self.decodes[g].append(rid)
            else:
                keep.append((ev, rid, g))
        self.moving = keep

    def _free_shard(self, rid: int, keep: int = -1) -> None:
        s = int(self.shard[rid])
        if s:
            for r, p in enumerate(self.pools):
                if r != keep:
                    p.free(s)
            self.shard[rid] = 0

    # -- one iteration --------------------------------------------------------------------------
    def _grow_decodes(self) -> None:
        """Reserve each decode's next KV slot on its rank; preempt newest decodes that do not fit."""
        t, bs = self.ctx.table, self.cfg.block_size
        flat, starts, _ = flat_decodes(self.decodes)
        if len(flat):                            # all ranks at once when every rank fits
            nb = np.maximum(0, -(-(t.computed[flat] + 1) // bs) - t.blocks[flat])
            need = per_rank(np.add, nb, starts, self.decodes)
            if all(x <= p.num_free for x, p in zip(need, self.pools)):
                for x, p in zip(need, self.pools):
                    p.allocate(x)
                t.blocks[flat] += nb
                return
        for r, ids in enumerate(self.decodes):
            while ids:
                a = np.asarray(ids, dtype=np.int64)
                nb = np.maximum(0, -(-(t.computed[a] + 1) // bs) - t.blocks[a])
                if int(nb.sum()) <= self.pools[r].num_free:
                    self.pools[r].allocate(int(nb.sum()))
                    t.blocks[a] += nb
                    break
                self._preempt(ids.pop(), r)

    def _preempt(self, rid: int, r: int) -> None:
        t = self.ctx.table
        self.pools[r].free(int(t.blocks[rid]))
        t.blocks[rid] = 0
        t.computed[rid] = 0
        t.preemptions[rid] += 1
        self.rank_of[rid] = -1
        self.counts["num_decode_preemptions"] += 1
        self.pending.insert(0, rid)

    def _rank_max(self) -> list[int]:
        """Each rank's longest decode context (tokens in KV plus the new one; 0 if none)."""
        flat, starts, _ = flat_decodes(self.decodes)
        if not len(flat):
            return [0] * self.R
        return [m + 1 if n else 0 for m, n in zip(
            per_rank(np.maximum, self.ctx.table.computed[flat], starts, self.decodes),
            (len(ids) for ids in self.decodes))]

    def _rank_states(self) -> tuple[list[int], list[int]]:
        """Decodes and their Σ context (tokens in KV plus the new one) per rank."""
        flat, starts, lens = flat_decodes(self.decodes)
        if not len(flat):
            return lens, [0] * self.R
        return lens, per_rank(np.add, self.ctx.table.computed[flat] + 1, starts, self.decodes)

    def _start_transfer(self, rid: int, g: int, tokens: int) -> None:
        """Every other rank's GPU j sends its head shard to GPU j of the decode rank (§4)."""
        cl = self.ctx.cluster
        nbytes = self.cost.shard_transfer_bytes(tokens)
        procs = [cl.nvlink_channel(src, dst).start(nbytes)
                 for r in range(self.R) if r != g
                 for src, dst in zip(self.rank_gpus[r], self.rank_gpus[g])]
        ev = self.ctx.env.all_of(procs) if procs else self.ctx.env.timeout(0)
        self.moving.append((ev, rid, g))
        self.counts["num_kv_transfers"] += 1

    def _apply(self, dec_ids: np.ndarray, chunks, finishing) -> None:
        t = self.ctx.table
        t.computed[dec_ids] += 1
        for ch in chunks:
            t.computed[ch.req_id] += ch.tokens
        fin_ids = np.asarray([ch.req_id for ch in finishing], dtype=np.int64)
        done = t.emit(np.concatenate((dec_ids, fin_ids)), self.clock)
        if finishing:
            gone = set(fin_ids.tolist())
            self.pending = [r for r in self.pending if r not in gone]
        if len(done):
            self._finish(done)
        self._sample()

    def _finish(self, done: np.ndarray) -> None:
        t = self.ctx.table
        gone = set(done.tolist())
        for rid in done.tolist():
            g = int(self.rank_of[rid])
            if g >= 0:
                self.pools[g].free(int(t.blocks[rid]))
                t.blocks[rid] = 0
                self.rank_of[rid] = -1
            self._free_shard(rid)  # a prompt that ended at its first token
        for r in range(self.R):
            if any(i in gone for i in self.decodes[r]):
                self.decodes[r] = [i for i in self.decodes[r] if i not in gone]

    def _sample(self) -> None:
        self.ctx.recorder.sample(self.clock, self.index, sum(map(len, self.decodes)),
                                 len(self.pending), sum(p.num_used for p in self.pools),
                                 self.ctx.table.num_emitted)

    # -- event leaping over decode-only steps ---------------------------------------------------
    def _leap_ok(self) -> bool:
        """Whether the next iterations are decode-only steps `_leap` may take."""
        return not self.pending and not self.moving

    def _leap(self) -> int:
        return leap_ranks(self)


def check_fits(ctx: SimContext, num_blocks: int, block_size: int, kind: str, kv_gib: float,
               headroom: float = 0.0) -> None:
    """Every request's whole KV must fit one rank's pool below the placement headroom."""
    t = ctx.table
    if t.n:
        need = int((t.prompt + t.output).max())
        capacity_tokens = int(num_blocks * (1.0 - headroom)) * block_size
        if need > capacity_tokens:
            num = int(((t.prompt + t.output) > capacity_tokens).sum())
            raise ConfigError(
                f"policy {kind}: {num} request(s) need up to {need} tokens of KV but one logical "
                f"rank holds {capacity_tokens} after the placement headroom "
                f"({kv_gib:.2f} GiB per GPU); cap the workload's context, raise "
                "gpu_memory_utilization or the base TP degree")
