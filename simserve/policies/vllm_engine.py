"""Chunked-prefill engines on one GPU (or one TP group): `vllm` (V1 scheduler) and `sarathi`.

vLLM V1 (policies.md §2): running requests first, in admission order, each given the tokens
that catch it up (1 for a decode, the rest of a prompt for a partial prefill) within the token
budget; a request whose blocks do not fit preempts the newest running request (recompute: all
its KV freed, back to the front of the waiting queue); then, only if nothing was preempted,
waiting requests FCFS while the budget, `max_num_seqs` and the KV pool allow (head-of-line
blocking). KV is allocated incrementally, block by block.

Sarathi-Serve (§3): decodes first (a decode that cannot grow preempts the tail of the running
list), then partial prefills, then new prompts FCFS, each admitted only if the KV of its whole
prompt can be reserved at once.

With `enable_prefix_caching` (vLLM V1's default) the pool is a `PrefixCachingBlockPool`: a
request taken from the waiting queue (new, or preempted and back) first claims the longest
cached prefix of its full blocks (never its last token: at most (num_tokens - 1) // block_size
blocks, as `get_computed_blocks`), starts its prefill after it and pays only for the new
blocks plus the cached ones it pulls out of the free queue. Prompt blocks are hashed when a
chunk that fills them is scheduled (`cache_blocks`); blocks filled by decodes are hashed when
the request frees them (only the request itself can ever hit those, and only after that).
Freed blocks keep their hashes until LRU eviction reuses them.

Between interesting events (a request reaching this engine, a request finishing, a KV
shortfall) a decode-only engine repeats one step with contexts one longer; `_leap` advances k
such steps at once with results identical to stepping (tests check this), which is where the
speed comes from. Arrivals routed to other replicas do not stop a leap: it stays pending until
its end and is cut only by this engine's own arrivals (docs/architecture.md, Event leaping). A batch
is small (about ten requests at moderate load), so the leap and, up to 48 requests, the
schedule work on plain ints: numpy's per-call cost exceeds the arithmetic there.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections import deque

import numpy as np
import simpy

from simserve.cost import BatchShape, GpuCostModel
from simserve.cost.host import client_host, engine_host
from simserve.errors import ConfigError
from simserve.policies.base import EngineBase, cost_model, kv_blocks
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.vllm_leap import PendingLeap, Segments, new_blocks, new_blocks_upto
from simserve.sim.context import SimContext
from simserve.sim.clock import at
from simserve.sim.kv import BlockPool, PrefixCachingBlockPool
from simserve.sim.leap import largest_k, leap_ends
from simserve.sim.prefix_cache import BlockHasher, PrefixCacheStats

LEAP_CAP = 8192  # at most this many decode steps per leap (bounds the temporary arrays)
SMALL_BATCH = 48  # up to this many requests, schedule and shape batches on plain ints
INF = float("inf")


# -- the per-request loops over the request table (memoryviews of its int64 arrays; C arrays
# when compiled, vllm_engine.pxd) ---------------------------------------------------------
def _classify(comp, ntok, gen, il: list, nl: list):
    """`_shape`'s loop: a batch's requests (ids `il`, tokens `nl`) as prefill chunks (their
    tokens, cached context) and decodes (context after the step); which sample a token, and
    how many do."""
    pre_n, pre_c, dctx, sample = [], [], [], []
    num_sample = 0
    for i in range(len(il)):
        r = il[i]
        k = nl[i]
        x = comp[r]
        tok = ntok[r]
        if k == 1 and x == tok - 1 and gen[r] > 0:
            dctx.append(x + 1)
        else:
            pre_n.append(k)
            pre_c.append(x)
        s = x + k == tok
        sample.append(s)
        num_sample += s
    return pre_n, pre_c, dctx, sample, num_sample


def _advance(comp, il: list, nl: list, sample: list) -> list:
    """`_apply`'s loop: each request's computed tokens grow by its tokens; returns the ids
    that sample a token."""
    out = []
    for i in range(len(il)):
        r = il[i]
        comp[r] += nl[i]
        if sample[i]:
            out.append(r)
    return out


def _decoding(comp, blocks, ntok, gen, running: list, bs: int):
    """`_leap_state`'s loop: (contexts, outputs so far, tokens their held KV blocks still fit)
    of a running batch that is all decoding (every request has sampled and has its last
    token's KV to compute), else None."""
    c, g, room = [], [], []
    for i in range(len(running)):
        r = running[i]
        x = comp[r]
        y = gen[r]
        if y == 0 or ntok[r] != x + 1:
            return None
        c.append(x)
        g.append(y)
        room.append(blocks[r] * bs - x)
    return c, g, room


def _advance_steps(cv, bv, il: list, c: list, room: list, steps: list, k: int, bs: int,
                   short: list) -> int:
    """`_commit_leap`'s loop: request il[i] (context c[i], room[i] tokens left in its held
    blocks) decodes steps[i] steps; its context and blocks grow. Appends to `short` the
    steps of those with fewer than k; returns the new blocks taken (`new_blocks_upto`)."""
    nb = 0
    for i in range(len(il)):
        r = il[i]
        x = c[i]
        a = room[i]
        s = steps[i]
        if s < k:
            short.append(s)
        cv[r] = x + s
        if a < s:  # it needs new blocks: `new_blocks`' term
            nb -= (a - s) // bs
            bv[r] = -(-(x + s) // bs)
    return nb


def _appended(ids, n, new_ids: list, new_n: list):
    """The batch (ids, tokens: arrays, or lists for a small batch) with the requests
    admitted this step appended."""
    if not new_ids:
        return ids, n
    if type(ids) is list:
        return ids + new_ids, n + new_n
    return (np.concatenate((ids, np.asarray(new_ids, dtype=np.int64))),
            np.concatenate((n, np.asarray(new_n, dtype=np.int64))))


class ChunkedEngine(EngineBase):
    """One engine over a TP group. Subclasses implement `_schedule_running` and
    `_admission_blocks`; parameters are in `vllm_engine_config.py`, replicas in `replicas.py`;
    the members the runner reads are `policies/base.py`'s `Replica`."""

    kind = "vllm"
    prefix_caching_default: bool | None = None  # None: vLLM's default for `vllm_version`

    def __init__(self, ctx: SimContext, cfg: ChunkedConfig, index: int, gpus: list[int]):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        hw = ctx.hardware
        r = cfg.resolve(float(hw.gpu.spec["memory_gib"]), hw.gpu.name)
        self.budget = r["max_num_batched_tokens"]
        self.max_seqs = r["max_num_seqs"]
        blocks, kv = kv_blocks(ctx, f"policy {self.kind}", cfg.tp, r["gpu_memory_utilization"],
                               cfg.block_size, self.budget, self.max_seqs,
                               cfg.num_gpu_blocks_override, "use a larger TP degree or GPU",
                               activation_reserve_gib=cfg.activation_reserve_gib,
                               cuda_graphs=cfg.cuda_graphs, graphs_counted=r["graphs_counted"])
        pc = cfg.enable_prefix_caching
        if pc is None:
            pc = (r["enable_prefix_caching"] if self.prefix_caching_default is None
                  else self.prefix_caching_default)
        r["enable_prefix_caching"] = pc
        self.pc = None  # prefix caching state, when on
        if pc:
            self.pool = PrefixCachingBlockPool(f"engine{index}.gpu_kv", blocks, cfg.block_size)
            self.pc = PrefixCacheStats()
            self._hasher = BlockHasher(ctx.table, cfg.block_size)
            self._reg: dict[int, list] = {}  # rid -> hashes of its leading blocks (None: anon)
            self._look: tuple | None = None  # memo of the last lookup
        else:
            self.pool = BlockPool(f"engine{index}.gpu_kv", blocks, cfg.block_size)
        self.prefill_tokens = 0  # prompt (and recomputed) tokens computed, prefix hits excluded
        self.kv_summary = dict(kv.summary(), num_gpu_blocks=blocks, **r)
        try:
            host = engine_host(hw.gpu, cfg.engine, cfg.vllm_version)
            if host is not None and cfg.async_scheduling is not None and not host.ideal:
                host = dataclasses.replace(host, async_scheduling=cfg.async_scheduling)
            host = client_host(host, cfg.api_server, cfg.detokenize, cfg.offline)
        except ValueError as exc:
            raise ConfigError(f"policy {self.kind}: {exc}") from None
        self.cost = cost_model(ctx, lambda: GpuCostModel(
            ctx.model, hw.gpu, cfg.tp, hw.nvlink, cfg.cuda_graphs,
            table_tokens=max(self.budget, self.max_seqs), mixed_attention=cfg.mixed_attention,
            graph_max_tokens=cfg.graph_max_tokens, host=host), f"policy {self.kind}")
        # the API-server front end (admission and token delivery contend for one CPU)
        self.frontend = host.make_frontend() if host is not None else None
        # Under async scheduling vLLM schedules step m while step m-1 runs on the GPU (its
        # batch queue holds two steps), so a request reaching the engine core after step
        # m-1 started waits for step m+1: `_cutoff` is the latest engine arrival a step may
        # admit (vllm/v1/engine/core.py `step_with_batch_queue`).
        self._async = host is not None and not host.ideal and host.async_scheduling
        self._reached: dict[int, float] = {}  # rid -> when it reached the engine (async only)
        self._cutoff = float("inf")
        self._prev_start = self._prev_end = -1.0
        self._admitting: deque[float] = deque()  # admission completions not yet reached
        self._in_frontend: deque[int] = deque()  # requests whose admission work is not done
        t = ctx.table  # its int arrays are never reallocated: per-element views
        self._views = (memoryview(t.computed), memoryview(t.blocks), memoryview(t.num_tokens),
                       memoryview(t.generated), memoryview(t.output))
        self.running: list[int] = []
        self.waiting: deque[int] = deque()
        self.clock = 0.0
        self._wake = None
        self.num_preemptions = 0
        self._step_hint = 0.0  # a recent decode step's duration (sizes a leap's pricing)
        self._pending: PendingLeap | None = None  # a leap priced but not yet committed
        self._proc = None  # this engine's SimPy process (a cut leap interrupts its wait)
        # arrivals that came to this engine / went elsewhere while a leap waited for them:
        # once most go elsewhere, leaps are priced to their own bounds at once (`_price`)
        self._arrivals_here = self._arrivals_elsewhere = 0

    # -- queue interface used by the router ---------------------------------------------
    def load(self) -> int:
        """Requests held now: a pending leap's finishes count from their step's end."""
        n = len(self.running) + len(self.waiting)
        p = self._pending
        if p is not None and len(p.starts) > 1:
            n -= p.finished_before(self.ctx.env.now)
        return n

    def enqueue(self, rid: int) -> None:
        now, fe = self.ctx.env.now, self.frontend
        if self._pending is not None and self._pending.open:
            self._arrivals_here += 1
        if fe is None:
            if self._pending is not None:  # the engine sees it at the end of the step in flight
                self._bound_leap(now)
            self._arrive(rid)
            return
        if self._pending is not None:  # output work ending before it precedes its admission
            self._deliver_before(now)
        fe.admit(now, int(self.ctx.table.prompt[rid]))
        self._in_frontend.append(rid)
        if self._pending is not None:
            self._bound_leap(self._own_next_s())
        if len(self._in_frontend) == 1:  # the front end was idle: its head starts now
            at(self.ctx.env, fe.head_done).callbacks.append(self._front_end_done)

    def _front_end_done(self, _ev) -> None:
        """The front end finished the head's admission work (at its `head_done`, fixed when
        it became the head): the engine sees it `in_delay_s` later; the next one starts."""
        env, fe, q = self.ctx.env, self.frontend, self._in_frontend
        now = env.now
        if self._pending is not None:  # output work ending before the pop precedes it
            self._deliver_before(now)
        fe.pop(now)
        rid = q.popleft()
        t = now + fe.in_delay_s
        if t > now:
            self._admitting.append(t)
            at(env, t).callbacks.append(lambda _ev, rid=rid: self._admitted(rid))
        else:
            self._arrive(rid)
        if q:
            at(env, fe.head_done).callbacks.append(self._front_end_done)

    def _admitted(self, rid: int) -> None:
        """`rid` reaches the engine core, `in_delay_s` after its admission work ended."""
        self._admitting.popleft()  # a constant delay keeps completions in order
        self._arrive(rid)

    def _arrive(self, rid: int) -> None:
        self.waiting.append(rid)
        if self._async:
            self._reached[rid] = self.ctx.env.now
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _own_next_s(self) -> float:
        """The next time a request this engine already took can reach its waiting queue."""
        nxt = self._admitting[0] if self._admitting else INF
        if self._in_frontend:
            nxt = min(nxt, self.frontend.head_done + self.frontend.in_delay_s)
        return nxt

    def _delivered(self, t: float, n: int) -> float:
        """When the client receives the `n` tokens this engine sampled at `t`."""
        return self.frontend.deliver(t, n) if self.frontend is not None else t

    # -- KV helpers -----------------------------------------------------------------------
    def _blocks_needed(self, rid: int, tokens: int) -> int:
        return max(0, -(-tokens // self.pool.block_size) - self._views[1][rid])

    def _grow(self, rid: int, nb: int) -> None:
        self.pool.allocate(nb)
        self._views[1][rid] += nb

    def _preempt(self, rid: int) -> None:
        t = self.ctx.table
        if self.pc is not None:
            self._release(rid)
        else:
            self.pool.free(int(t.blocks[rid]))
        t.blocks[rid] = 0
        t.computed[rid] = 0
        t.preemptions[rid] += 1
        self.num_preemptions += 1
        self.waiting.appendleft(rid)

    # -- the engine process ---------------------------------------------------------------
    def run(self):
        env, rec = self.ctx.env, self.ctx.recorder
        self._proc = env.active_process
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                self.clock = max(self.clock, env.now)
                continue
            if self.cfg.leap and self._leap():
                yield from self._await_leap()
                continue
            if self._async:  # back to back: this step was scheduled when the last began
                self._cutoff = self._prev_start if self._prev_end == self.clock else self.clock
            ids, n = self._schedule()
            if len(ids) == 0 and self._cutoff < self.clock:
                # nothing else was schedulable, so the engine core blocked on the last step
                # and scheduled this one when it ended
                self._cutoff = self.clock
                ids, n = self._schedule()
            if len(ids) == 0:
                raise RuntimeError(f"engine {self.index}: nothing schedulable with "
                                   f"{len(self.waiting)} waiting; KV pool too small?")
            shape, sample = self._shape(ids, n)
            start = self._prev_start = self.clock
            self.clock += self.cost.step_s(shape)
            self._prev_end = self.clock
            rec.num_iterations += 1
            rec.num_steps_scheduled += 1
            if rec.trace is not None:
                rec.trace.iteration(
                    f"engine {self.index}", start, self.clock,
                    "mixed" if len(shape.prefill_chunks) and shape.num_decodes else
                    "prefill" if len(shape.prefill_chunks) else "decode",
                    prefill_tokens=shape.num_tokens - shape.num_decodes,
                    prefill_chunks=shape.prefill_chunks, decodes=shape.num_decodes,
                    kv_blocks_used=self.pool.num_used, waiting=len(self.waiting))
            yield at(env, max(self.clock, env.now))
            self._apply(ids, n, sample)

    def _schedule(self):
        """This step's batch: request ids and the tokens each computes, as int arrays or,
        for a small batch, lists of ints (`_shape` and `_apply` take both)."""
        ids, n, preempted = self._schedule_running()
        if self.pc is not None and len(ids):
            self._cache_scheduled(ids, n)
        if not preempted:
            ids, n = self._admit(ids, n)
        return ids, n

    def _shape(self, ids, n) -> tuple[BatchShape, list | np.ndarray]:
        t = self.ctx.table
        if type(ids) is list or len(ids) <= SMALL_BATCH:  # plain ints beat numpy's
            comp, _, ntok, gen, _ = self._views  # per-call cost here
            nl = n if type(n) is list else n.tolist()
            pre_n, pre_c, dctx, sample, num_sample = _classify(
                comp, ntok, gen, ids if type(ids) is list else ids.tolist(), nl)
            shape = BatchShape(
                num_tokens=sum(nl), prefill_chunks=pre_n, prefill_ctx=pre_c,
                num_decodes=len(dctx), decode_ctx_sum=sum(dctx), num_sample_rows=num_sample,
                decode_ctx=dctx, decode_ctx_max=max(dctx) if dctx else None)
            self.prefill_tokens += shape.num_tokens - shape.num_decodes
            return shape, sample
        c = t.computed[ids]
        ntok = t.num_tokens[ids]
        dec = (n == 1) & (c == ntok - 1) & (t.generated[ids] > 0)
        pre = ~dec
        sample = (c + n) == ntok
        shape = BatchShape(
            num_tokens=int(n.sum()), prefill_chunks=n[pre], prefill_ctx=c[pre],
            num_decodes=int(dec.sum()), decode_ctx_sum=int((c[dec] + 1).sum()),
            num_sample_rows=int(sample.sum()), decode_ctx=c[dec] + 1)
        self.prefill_tokens += shape.num_tokens - shape.num_decodes
        return shape, sample

    def _apply(self, ids, n, sample) -> None:
        t = self.ctx.table
        if type(sample) is list:  # `_shape`'s small batch
            out = _advance(self._views[0], ids if type(ids) is list else ids.tolist(),
                           n if type(n) is list else n.tolist(), sample)  # (`emit` takes a list)
        else:
            t.computed[ids] += n
            out = ids[sample]
        done = t.emit(out, self._delivered(self.clock, len(out)))
        if len(done):
            self._finish(done)
        self._sample()

    def _finish(self, done) -> None:
        """Free the KV of the running requests `done` (an id array or list) and drop them."""
        dl = done if type(done) is list else done.tolist()
        bv = self._views[1]
        if self.pc is not None:
            forget = self._hasher.forget
            release = self._release_unshared if self._hasher.hash_ids is None else self._release
            for r in dl:
                release(r)
                forget(r)
        else:
            self.pool.free(sum([bv[r] for r in dl]))
        for r in dl:
            bv[r] = 0
        if len(dl) == 1:  # the common case: one finish (ids are distinct, all running)
            self.running.remove(dl[0])
        else:
            gone = set(dl)
            self.running = [r for r in self.running if r not in gone]

    def _sample(self) -> None:
        t = self.ctx.table
        self.ctx.recorder.sample(self.clock, self.index, len(self.running), len(self.waiting),
                                 self.pool.num_used, t.num_emitted)

    # -- event leaping --------------------------------------------------------------------
    def _leap_state(self):
        """(ids, computed, generated, room, most steps, most new blocks) of a running batch
        that may leap, else None; room = tokens each request's held KV blocks still fit.
        The batch must be all decoding, and a waiting head must stay blocked for the whole
        leap: free blocks only shrink while decoding, and with prefix caching the leap stops
        before an allocation could evict one of the head's cached hits (the only way its
        admission could get cheaper). Under async scheduling a head the next step will not
        see (it reached the engine after the step was scheduled) allows one step."""
        running = self.running
        if not running or len(running) > self.budget:
            return None
        waiting = self.waiting
        need = None  # the free blocks the head's admission needs (`_head_blocks`)
        if waiting:
            need = self._head_blocks(len(running))
            if need is not None and need <= self.pool.num_free - len(running) and \
                    self._head_seen():
                return None  # admissible even if every decode takes a new block: no leap
        bs = self.pool.block_size
        comp, blocks, ntok, gen, _ = self._views  # plain ints: numpy calls cost more
        batch = _decoding(comp, blocks, ntok, gen, running, bs)
        if batch is None:
            return None  # a prefill (or recompute) is in flight
        c, g, room = batch
        ids = np.array(running, dtype=np.int64)
        free = self.pool.num_free
        most, cap = LEAP_CAP, free
        if waiting:  # (the batch's blocks and the head's lookup are unchanged since `need`)
            if need is not None and need <= free - new_blocks(room, 1, bs):
                if self._head_seen():
                    return None
                most = 1  # the next step decodes only
            elif self.pc is not None and need is not None:
                # Allocations evict from the free queue's head. Evicting a shared hit can
                # break the head's hit prefix and leave cached blocks behind it unused,
                # making admission cheaper: stop before that. Evicting a block of its private
                # run loses one hit, which costs a new block or frees a cached one, never
                # more than the block the allocation took: harmless while the head is blocked
                # even with no allocation (need > free), as free blocks only shrink.
                r = waiting[0]
                hashes, h, _, _ = self._lookup(r)
                cap = self.pool.free_ahead(hashes[:h], r if need <= free else None)
        return ids, c, g, room, most, cap

    def _head_seen(self) -> bool:
        """Will the next step see the head of the queue? Under async scheduling only if it
        reached the engine by the step's cutoff (as `run` sets it)."""
        if not self._async:
            return True
        cutoff = self._prev_start if self._prev_end == self.clock else self.clock
        return self._reached.get(self.waiting[0], -1.0) <= cutoff

    def _leap(self) -> int:
        """Price the decode-only batch's next k >= 1 steps at once (0: it cannot leap) and
        keep them pending (`PendingLeap`); they are committed when the engine wakes at their
        end (`_await_leap`). The same state and token times as k single steps.

        A leap stops at the first step ending at or after the next time one of this
        engine's own requests reaches its queue (`_bound_leap` moves that earlier when a new
        one arrives; under async scheduling one step later, the step already scheduled when
        it arrived: `_go_past`) and where KV runs out. While nobody waits it runs on through
        finishes (segments of `vllm_leap`; the router sees a finish from its time, `load`),
        else it stops at the first. It is priced up to the next arrival anywhere and extended past
        it when the router sends that arrival elsewhere, so replicas do not stop for each
        other's arrivals. With vLLM's front end, the output work of the steps that ended
        before a front-end event (an admission submitted or completed) is submitted just
        before it (`_deliver_before`): the front end serves work in time order, and stepping
        would have submitted it by then."""
        st = self._leap_state()
        if st is None:
            return 0
        ids, c, g, room, most, cap = st
        t, bs = self.ctx.table, self.pool.block_size
        out = self._views[4]
        r = [out[i] - x for i, x in zip(self.running, g)]
        first = min(r)
        B = len(c)
        if self.waiting or t.on_finish is not None or most < LEAP_CAP:
            # a finish could admit the head, or a client reacts to it: stop there
            kmax = largest_k(min(first, most), lambda k: new_blocks(room, k, bs) <= cap)
            segs = None
        else:  # blocks freed by finishes are not counted: the bound only errs short
            kmax = largest_k(min(max(r), most), lambda k: new_blocks_upto(room, r, k, bs) <= cap)
            segs = Segments(c, r) if kmax > first else None
        if kmax < 1:
            return 0
        p = PendingLeap(ids, c, g, room, r, self.clock, kmax, self._own_next_s(),
                        sum(c) + B, max(c) + 1, min(first, kmax), segs, sizes=[B])
        if self._async and self.ctx.recorder.trace is None:  # (a timeline keeps its leaps)
            p.after = 1
        self._price(p)
        self._pending = p
        return 1

    def _price(self, p: PendingLeap) -> None:
        """Price the pending leap up to its own bounds. A new leap is priced only up to the
        first step ending at or after the next arrival anywhere (then `open`), which is where
        a single engine's leap ends; once that arrival went elsewhere, the rest is priced in
        one go (other engines take arrivals: pricing many steps in one call costs less than
        waking at every arrival, and a cut drops the steps it makes unneeded). Once most
        arrivals went elsewhere, new leaps are priced whole, a segment at a time while
        nothing bounds them (then `more`: an arrival may cut them soon). The floats are the
        same however a leap is priced (`leap_ends`)."""
        k = k0 = len(p.ends)
        clock = p.ends[-1] if k else p.clock
        glob = self.ctx.source.next_arrival_s if not k and \
            self._arrivals_elsewhere <= self._arrivals_here else INF
        stop = min(p.own, glob)
        cost, out = self.cost, p.ends
        p.more = False
        while k < p.kmax:
            if k == p.seg_end:  # the current segment's finishes: price the next batch
                if not p.next_segment():
                    break
                if stop == INF and k > k0:  # unbounded: the next batch when this one ends
                    p.more = True
                    break
            s0, B = p.starts[-1], p.sizes[-1]
            j = k - s0
            ends = leap_ends(cost, clock, B, p.seg_sum + B * j, p.seg_max + j,
                             p.seg_end - k, stop, self._step_hint)
            self._step_hint = (ends[-1] - clock) / len(ends)
            out += ends
            k += len(ends)
            clock = ends[-1]
            if clock >= stop:
                if stop == p.own and p.after and not p.reach_step:
                    self._go_past(p, bisect.bisect_left(out, stop) + 1)
                    if p.reach_step:  # price the steps already scheduled then
                        stop = INF
                        continue
                break
        p.open = k < p.kmax and glob < p.own and clock >= glob

    def _await_leap(self):
        """Wait for the pending leap's end, extending it while the arrivals it stopped for
        went to other engines (or while it was priced only to a horizon), then commit it. A
        request reaching this engine meanwhile may shorten it (`_bound_leap`, which
        interrupts this wait); front-end events submit the output work of the steps that
        ended before them (`_deliver_before`)."""
        env = self.ctx.env
        while True:
            p = self._pending
            if p is None:  # committed meanwhile: the engine goes on from its clock
                yield at(env, max(self.clock, env.now))
                return
            try:
                yield at(env, max(p.ends[-1], env.now))
            except simpy.Interrupt:
                continue
            if self._pending is not p:
                continue
            if p.open or p.more:
                if p.open:
                    self._arrivals_elsewhere += 1
                self._price(p)
                if p.ends[-1] > env.now:
                    continue
            self._pending = None
            self._commit_leap(p, len(p.ends))
            return

    def _bound_leap(self, own: float) -> None:
        """One of this engine's requests can reach its queue at `own`: the pending leap's
        last step is the first ending at or after it (stepping would see it then)."""
        p = self._pending
        if own >= p.own:
            return
        p.own = own
        k = bisect.bisect_left(p.ends, own) + 1
        if k <= len(p.ends):  # priced past it already
            p.open = p.more = False
            if p.after and not p.reach_step:
                self._go_past(p, k)
                if p.reach_step:
                    k = p.kmax
                    p.more = k > len(p.ends)  # the step past it is still to price
            if k < len(p.ends):
                p.cut(k)
                self._proc.interrupt()  # wake at the new last step

    def _go_past(self, p: PendingLeap, j: int) -> None:
        """Step j of the pending leap is the first to end at or after `p.own`, when one of
        this engine's requests reaches its queue. Under async scheduling the step after it
        was scheduled before the request arrived (`_head_seen`), so stepping decodes it with
        the same batch whatever the request: the leap goes on through it (`p.after` steps, at
        most `kmax`, whose bounds already hold its KV and the waiting head's blockage) and
        records j (`reach_step`), where stepping's engine woke and sampled. An exact tie of
        the arrival with step j's end is left to stepping (the order of the two events)."""
        if j < p.kmax and p.ends[j - 1] != p.own:
            p.reach_step = j
            p.kmax = min(p.kmax, j + p.after)
            p.seg_end = min(p.seg_end, p.kmax)

    def _deliver_before(self, now: float) -> None:
        """Submit to the front end the output work of the pending steps that ended before
        `now`, ahead of the front-end event at `now` (stepping would have submitted it by
        then); the steps themselves are applied when the leap is committed."""
        p = self._pending
        k, j = bisect.bisect_left(p.ends, now), len(p.delivered)
        if k > j:
            p.delivered += self._deliver_steps(p, j, k)

    def _deliver_steps(self, p: PendingLeap, j: int, k: int) -> list[float]:
        """The front end's delivery times of steps j..k-1, each with its segment's tokens."""
        if len(p.starts) == 1:
            return self.frontend.deliver_many(p.ends[j:k], p.B)
        out = []
        bounds = p.starts[1:] + [k]
        for s, B in zip(bounds, p.sizes):
            if s > j:
                e = min(s, k)
                out += self.frontend.deliver_many(p.ends[j:e], B)
                j = e
                if j >= k:
                    break
        return out

    def _commit_leap(self, p: PendingLeap, k: int) -> None:
        """Apply the leap's first k steps."""
        ends, ids, c, B = p.ends[:k], p.ids, p.c, p.B
        t, bs = self.ctx.table, self.pool.block_size
        self._prev_start, self._prev_end = (ends[k - 2] if k > 1 else p.clock), ends[k - 1]
        times = ends
        if self.frontend is not None:
            j = len(p.delivered)
            times = p.delivered[:k] if j >= k else p.delivered + self._deliver_steps(p, j, k)
        if len(p.starts) > 1 or 0 < p.reach_step < k:
            self._commit_segments(p, k, times)
            return
        il = ids if type(ids) is list else ids.tolist()
        cv, bv = self._views[:2]  # a few requests: element writes beat numpy's fancy indexing
        nb = _advance_steps(cv, bv, il, c, p.room, [k] * len(il), k, bs, [])
        if nb:
            self.pool.allocate(nb)
        if self.ctx.recorder.trace is not None:
            self.ctx.recorder.trace.iteration(
                f"engine {self.index}", p.clock, ends[-1], f"decode x{k}", steps=k,
                prefill_tokens=0, prefill_chunks=[], decodes=B,
                kv_blocks_used=self.pool.num_used, waiting=len(self.waiting))
        self.clock = ends[-1]
        done = t.emit_steps(il, times, p.g)
        if len(done):
            self._finish(done)
        self.ctx.recorder.num_iterations += k
        self._sample()

    def _commit_segments(self, p: PendingLeap, k: int, times: list) -> None:
        """Apply a leap's first k steps that go through finishes: every request's tokens at
        once, then, segment by segment as stepping would, the KV blocks its steps take, the
        finishes at its end (their blocks freed) and a sample."""
        c, room, r = p.c, p.room, p.r
        t, bs, pool, rec = self.ctx.table, self.pool.block_size, self.pool, self.ctx.recorder
        il = p.ids if type(p.ids) is list else p.ids.tolist()
        cv, bv = self._views[:2]  # a few requests: element writes beat numpy's fancy indexing
        steps = [s if s < k else k for s in r]  # each one's steps
        short = []  # those of the ones finishing before step k
        nk = _advance_steps(cv, bv, il, c, room, steps, k, bs, short)  # new blocks after all
        # k steps: `new_blocks_upto(room, r, k, bs)`
        emitted = t.num_emitted  # after the segments so far: + Σ min(steps[i], b) at bound b
        done = t.emit_runs(il, times, p.g, steps)
        bounds = [s for s in p.starts[1:] if s < k] + [k]
        sizes = p.sizes[:len(bounds)]
        j = p.reach_step
        if 0 < j < k and j not in bounds:  # stepping's engine woke at step j: a sample there
            i = bisect.bisect_left(bounds, j)
            bounds.insert(i, j)
            sizes.insert(i, sizes[i])
        short.sort()
        a, held, m, left = 0, 0, 0, len(steps)  # short[:m] (< a) are counted in `emitted`
        for b, B in zip(bounds, sizes):
            nb = nk if b == k else new_blocks_upto(room, steps, b, bs)
            if nb > held:
                pool.allocate(nb - held)
                held = nb
            if rec.trace is not None:
                rec.trace.iteration(
                    f"engine {self.index}", p.ends[a - 1] if a else p.clock, p.ends[b - 1], f"decode x{b - a}",
                    steps=b - a, prefill_tokens=0, prefill_chunks=[], decodes=B,
                    kv_blocks_used=pool.num_used, waiting=len(self.waiting) if b == k else 0)
            self.clock = p.ends[b - 1]
            fin = done.get(b)
            if fin is not None:
                self._finish(fin)
            while m < len(short) and short[m] < b:  # finished in (a, b): its steps only
                emitted += short[m] - a
                left -= 1
                m += 1
            emitted += left * (b - a)
            rec.sample(self.clock, self.index, len(self.running),
                       len(self.waiting) if b == k else self._waiting_at(self.clock) if b == j
                       else 0, pool.num_used, emitted)
            a = b
        rec.num_iterations += k

    def _waiting_at(self, t: float) -> int:
        """Requests waiting at t, before the queue's later arrivals (async scheduling keeps
        when each reached it)."""
        reached = self._reached
        return sum(1 for r in self.waiting if reached.get(r, -1.0) < t)

    # -- admission of waiting requests (FCFS, head-of-line blocking) -------------------------
    def _admit(self, ids, n):
        if self.pc is not None:
            return self._admit_cached(ids, n)
        t = self.ctx.table
        left = self.budget - (sum(n) if type(n) is list else int(n.sum()))
        new_ids, new_n = [], []
        while self.waiting and left > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if self._unseen(r):
                break
            k = min(int(t.num_tokens[r] - t.computed[r]), left)
            nb = self._admission_blocks(r, k)
            if not self.pool.can_allocate(nb):
                break
            self._grow(r, nb)
            self._take(r)
            new_ids.append(r)
            new_n.append(k)
            left -= k
        return _appended(ids, n, new_ids, new_n)

    def _unseen(self, r: int) -> bool:
        """Did `r` reach the engine after this step was scheduled (async scheduling)?"""
        return self._async and self._reached.get(r, -1.0) > self._cutoff

    def _take(self, r: int) -> None:
        """The head of the queue joins the running batch."""
        self.waiting.popleft()
        self._reached.pop(r, None)
        self.running.append(r)

    def _head_admits(self, num_running: int, free_blocks: int) -> bool:
        """Would `_admit` take the head of the queue with this many running and free blocks?"""
        need = self._head_blocks(num_running)
        return need is not None and need <= free_blocks

    def _head_blocks(self, num_running: int) -> int | None:
        """Free blocks `_admit` needs to take the head of the queue with this many running
        (with prefix caching: its new blocks plus its cached hits now in the free queue), or
        None if the token budget or `max_num_seqs` stops it."""
        left = self.budget - num_running
        if left <= 0 or num_running >= self.max_seqs:
            return None
        comp, blocks, ntok, _, _ = self._views
        r = self.waiting[0]
        if self.pc is not None:
            _, h, p, e = self._lookup(r)
            k = min(ntok[r] - (h + p) * self.pool.block_size, left)
            comp[r], blocks[r] = (h + p) * self.pool.block_size, h + p
            nb = self._admission_blocks(r, k)
            comp[r] = blocks[r] = 0
            return nb + e
        return self._admission_blocks(r, min(ntok[r] - comp[r], left))

    # -- policy-specific parts ------------------------------------------------------------
    def _admission_blocks(self, rid: int, chunk: int) -> int:
        """KV blocks to reserve when admitting `rid` with a first chunk of `chunk` tokens."""
        raise NotImplementedError

    def _schedule_running(self):
        raise NotImplementedError

    # -- prefix caching (vLLM V1's KVCacheManager over a PrefixCachingBlockPool) -------------
    # A request's blocks: [shared (prompt keys, hashed; `_reg`) | private (its own content,
    # cached as one run when freed) | anonymous tail (the partial block, blocks not full)].
    def _lookup(self, r: int) -> tuple[list, int, int, int]:
        """(r's shared hashes, shared blocks hit, private blocks hit, hit blocks now in the
        free queue)."""
        pool = self.pool
        n = self._views[2][r]
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

    def _claim_prefix(self, r: int, hashes: list, h: int, p: int) -> None:
        """r (computed 0, no blocks) takes its h + p cached blocks and starts after them."""
        t, pool = self.ctx.table, self.pool
        pool.touch(hashes[:h])
        if p:
            pool.touch_private(r, p)
        else:
            pool.drop_private(r)  # unreachable behind a miss: as good as uncached
        self._reg[r] = hashes[:h]
        comp, blocks, ntok, _, _ = self._views
        blocks[r] = h + p
        comp[r] = (h + p) * pool.block_size
        self.pc.record(ntok[r], comp[r], bool(t.preemptions[r] > 0))

    def _cache_upto(self, r: int, tokens: int) -> None:
        """Hash r's shared blocks that are full once `tokens` tokens have KV (vLLM
        `cache_blocks`); its private blocks are cached when it frees them (only r can hit
        them, and only after that)."""
        if self._hasher.hash_ids is None:
            return  # no request has shared blocks (`_release` pops `_reg` with a default)
        reg = self._reg.setdefault(r, [])
        full = min(tokens // self.pool.block_size, self._hasher.shared_count(r))
        if full > len(reg):
            pool = self.pool
            for x in self._hasher.hashes(r, full)[len(reg):]:
                reg.append(x if pool.register(x) else None)

    def _cache_scheduled(self, ids: np.ndarray, n: np.ndarray) -> None:
        """Cache the shared blocks this step's prefill chunks fill."""
        if self._hasher.hash_ids is None:
            return  # no shared blocks at all
        t = self.ctx.table
        ids, n = np.asarray(ids, dtype=np.int64), np.asarray(n, dtype=np.int64)
        pre = (n > 1) | (t.generated[ids] == 0)
        for r, k in zip(ids[pre].tolist(), n[pre].tolist()):
            self._cache_upto(r, int(t.computed[r]) + k)

    def _release(self, r: int) -> None:
        """Free r's blocks tail first: the anonymous tail, its private run, then its shared
        blocks in reverse."""
        if self._hasher.hash_ids is None:
            self._release_unshared(r)
            return
        pool = self.pool
        cv, bv = self._views[:2]
        c = cv[r]
        self._cache_upto(r, c)
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

    def _release_unshared(self, r: int) -> None:
        """`_release` when the trace has no hash_ids: no request has shared blocks
        (shared_count 0, `_reg` empty), so r's full blocks are all its private run, the
        rest its anonymous tail (tests/test_vllm_commit_fastpaths.py ties it to `_release`)."""
        cv, bv = self._views[:2]
        self._reg.pop(r, None)
        full = cv[r] // self.pool.block_size
        self.pool.release_unshared(r, bv[r] - full, full)

    def _admit_cached(self, ids, n):
        bs = self.pool.block_size
        comp, blocks, ntok, _, _ = self._views
        left = self.budget - (sum(n) if type(n) is list else int(n.sum()))
        new_ids, new_n = [], []
        while self.waiting and left > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if self._unseen(r):
                break
            hashes, h, p, e = self._lookup(r)
            hit = (h + p) * bs
            k = min(ntok[r] - hit, left)
            comp[r], blocks[r] = hit, h + p  # what `_admission_blocks` sees
            nb = self._admission_blocks(r, k)
            comp[r] = blocks[r] = 0
            if not self.pool.can_allocate(nb + e):  # touched free blocks leave the free queue
                break
            self._claim_prefix(r, hashes, h, p)
            self._grow(r, nb)
            self._cache_upto(r, hit + k)
            self._take(r)
            new_ids.append(r)
            new_n.append(k)
            left -= k
        return _appended(ids, n, new_ids, new_n)

    def prefix_cache_stats(self) -> dict | None:
        if self.pc is None:
            return None
        return dict(self.pc.as_dict(), evictions=self.pool.num_evictions,
                    cached_blocks_at_end=self.pool.num_cached())
