"""The NEO engine: one SimPy process over a GPU (or TP group), its host KV pool and PCIe links.

Each round (`scheduler.next_round`) commits swaps and prefills, then runs either a GPU-only
batch (timed by `GpuCostModel.step_s`, as the GPU-only engines are) or the asymmetric pipeline
(`Predictor.pipeline_s`). PCIe traffic goes through the cluster's contended channels with the
real KV bytes: swap-outs (D2H) and swap-ins (H2D) start with the round and the first attention
waits for them; a Prefill-to-CPU prompt's KV is copied D2H layer by layer as each layer ends,
and the round ends when its copies are done (the intermediate GPU blocks are then free).
With `leap` on, those transfers are worked out in closed form (`pcie.round_times`: the same
times, one event per round) and booked on the channels when the round ends.

Between interesting events a GPU-only decode round with no CPU work and nothing waiting is
leapt k steps at once, as the chunked engines do (`_leap`), with identical results.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from simserve.cost import BatchShape, GpuCostModel
from simserve.policies.base import EngineBase
from simserve.policies.neo.cpu_queue import CpuQueue
from simserve.policies.neo.pcie import arrives_at, round_times
from simserve.policies.neo.predictor import Predictor
from simserve.policies.neo.scheduler import next_round
from simserve.sim.clock import at
from simserve.sim.context import SimContext
from simserve.sim.kv import BlockPool
from simserve.sim.leap import largest_k, leap_ends

LEAP_CAP = 8192


def blocks_beyond(rooms: list[int], k: int, bs: int) -> int:
    """KV blocks that decodes need after k more steps beyond those they hold, given each one's
    room (held blocks × bs − tokens in KV; sorted): max(held, ceil((tokens + k) / bs)) − held
    = max(0, ceil((k − room) / bs)), which is 0 for every room >= k."""
    n = 0
    for room in rooms:
        if room >= k:
            break
        n += -(-(k - room) // bs)
    return n


class _PlusConstant:
    """A GPU cost model's decode-only steps plus a constant host term per step (NEO's scan of
    a stalled CPU queue while GPU decodes are leapt): each of the model's step prices, +
    `extra_s`, the same floats as a stepped round's `step_s` + it."""

    def __init__(self, cost, extra_s: float):
        self.cost, self.extra_s = cost, extra_s
        self.list_steps = cost.list_steps

    def decode_only_s(self, num_decodes, ctx_sum, ctx_max=None):
        return self.cost.decode_only_s(num_decodes, ctx_sum, ctx_max) + self.extra_s

    def decode_steps_list(self, num_decodes, ctx_sum0, ctx_max0, k):
        x = self.extra_s
        return [d + x for d in self.cost.decode_steps_list(num_decodes, ctx_sum0, ctx_max0, k)]

    def decode_steps(self, num_decodes, ctx_sum0, ctx_max0, k):
        """The model's `decode_steps` (its cheapest form of k steps), + `extra_s` each: a
        leap prices its steps with it instead of one array call of `decode_only_s`."""
        x = self.extra_s
        return [d + x for d in self.cost.decode_steps(num_decodes, ctx_sum0, ctx_max0, k)]

    def decode_steps_s(self, num_decodes, ctx_sum0, ctx_max0, k):
        return self.cost.decode_steps_s(num_decodes, ctx_sum0, ctx_max0, k) + self.extra_s


class NeoEngine(EngineBase):
    kind = "neo"

    def __init__(self, ctx: SimContext, cfg, gpu_cost: GpuCostModel, pred: Predictor,
                 num_gpu_blocks: int, num_cpu_blocks: int, gpus: list[int],
                 pricing: Predictor | None = None, host=None):
        """`pred` steers the decisions (NEO's table, or the oracle); `pricing`, an oracle
        `Predictor`, prices the pipelined rounds (`pred` itself when None); `host`, a
        `SwiftLLMHost` or None, adds NEO's per-iteration scan of the CPU queue."""
        self.ctx, self.cfg, self.cost, self.pred, self.gpus = ctx, cfg, gpu_cost, pred, gpus
        self.pricing = pred if pricing is None else pricing
        self.host = host
        self.err_sum = self.err_max = 0.0   # |NEO's predicted − simulated| / simulated layers
        self.err_n = 0
        self.num_cpu_stalled = 0            # rounds in which host-resident decodes got no service
        self.block_size = cfg.block_size
        self.pool = self.gpu_pool = BlockPool("neo.gpu_kv", num_gpu_blocks, cfg.block_size)
        self.host_pool = BlockPool("neo.host_kv", num_cpu_blocks, cfg.block_size)
        # intermediate GPU blocks of Prefill-to-CPU prompts, held for the prefill's round only
        # (NEO sizes them like the GPU pool, in an extra KV layer: `itm_layer`)
        self.itm_pool = BlockPool("neo.itm_kv", num_gpu_blocks, cfg.block_size)
        self.host_blocks = np.zeros(ctx.table.n, dtype=np.int64)
        self.kv_token_bytes = ctx.model.kv_bytes_per_token_per_rank(cfg.tp)
        self.kv_layer_bytes = ctx.model.kv_bytes_per_token_per_layer(cfg.tp)
        self.waiting: deque[int] = deque()
        self.gpu_q: list[int] = []
        self.cpu_q = CpuQueue()
        self.clock = 0.0
        self._wake = None
        self.index = 0
        self.num_swap_out = self.num_swap_in = self.num_recompute = 0
        self.num_pipe = self.num_gpu_only = self.num_idle = 0
        self.cpu_tokens = 0
        self.num_p2g = self.num_p2c = self.num_cpu_batches = 0
        self.stats: dict = {}      # `counters()`, refreshed whenever requests finish
        self._d2h, self._h2d = self._channels("d2h"), self._channels("h2d")
        self._arrivals = ctx.source.arrival.tolist()   # scheduled, sorted
        self._step_hint = 0.0      # a recent leapt step's duration (`leap_ends`' guess)

    def enqueue(self, rid: int) -> None:
        self.waiting.append(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def load(self) -> int:
        return len(self.waiting) + len(self.gpu_q) + len(self.cpu_q)

    # -- PCIe -------------------------------------------------------------------------------
    def _channels(self, direction: str):
        gs = self.ctx.cluster.gpus
        return [getattr(gs[i], direction) for i in self.gpus]

    def _swaps(self, out_tokens: int, in_tokens: int):
        """Both swap directions at once on every rank's link; returns when all are done."""
        env = self.ctx.env
        ev = [ch.start(out_tokens * self.kv_token_bytes) for ch in self._channels("d2h")
              if out_tokens] + [ch.start(in_tokens * self.kv_token_bytes)
                                for ch in self._channels("h2d") if in_tokens]
        yield env.all_of(ev)
        return env.now

    def _layer_copies(self, tokens: int, first_s: float, layer_s: float):
        """Prefill-to-CPU: layer l's KV (tokens × per-layer bytes) leaves once layer l ends."""
        env, nbytes = self.ctx.env, tokens * self.kv_layer_bytes
        chans = self._channels("d2h")
        for layer in range(self.pred.L):
            due = first_s + (layer + 1) * layer_s
            if due > env.now:
                yield at(env, due)
            yield env.all_of([ch.start(nbytes) for ch in chans])

    # -- the engine process ---------------------------------------------------------------
    def run(self):
        env, t = self.ctx.env, self.ctx.table
        while True:
            if not self.waiting and not self.gpu_q and not self.cpu_q:
                yield from self._idle()
                continue
            if self.cfg.leap and self._leap_ok():
                if self._leap():
                    yield at(env, max(self.clock, env.now))
                    continue
            r = next_round(self)
            d = r.decision
            if d.mode != "pipe" and r.cpu_queue:
                self.num_cpu_stalled += 1          # GPU gating held the CPU queue back
            if d.mode == "none":
                self.num_idle += 1
                if self.ctx.source.next_index >= self.ctx.source.n:
                    raise RuntimeError(
                        "neo: no runnable work and no arrivals left "
                        f"({len(self.waiting)} waiting, {len(self.gpu_q)} on the GPU, "
                        f"{len(self.cpu_q)} on the CPU; GPU {self.gpu_pool.num_used}/"
                        f"{self.gpu_pool.num_blocks} and host {self.host_pool.num_used}/"
                        f"{self.host_pool.num_blocks} blocks used); KV pools too small?")
                yield from self._idle()
                continue
            start = self.clock
            pref = np.concatenate((r.pref_gpu, r.pref_cpu))
            if d.mode == "pipe":
                dur, head, layer = self.pricing.pipeline_s(self._true_b0(d.b0, pref), d.b1)
                self.num_pipe += 1
            else:
                plen = t.num_tokens[pref]
                shape = BatchShape(num_tokens=d.g.tokens, prefill_chunks=plen,
                                   prefill_ctx=np.zeros(len(plen), dtype=np.int64),
                                   num_decodes=len(r.gdec), decode_ctx_sum=r.gdec_ctx,
                                   num_sample_rows=len(pref) + len(r.gdec),
                                   decode_ctx=t.num_tokens[r.gdec],
                                   decode_ctx_max=r.gdec_max if len(r.gdec) else None)
                dur = self.cost.step_s(shape)
                head = self.pricing.head_us(len(pref) + len(r.gdec), d.g.tokens) * 1e-6
                layer = max(dur - head - self.pricing.lm_us(shape.num_sample_rows) * 1e-6,
                            0.0) / self.pred.L
                self.num_gpu_only += 1
            self._count_error(d, layer)
            if self.host is not None and r.cpu_queue:
                scan = self.host.scan_us(r.cpu_queue) * 1e-6   # NEO's loop over the CPU queue
                dur += scan
                head += scan
            rec = self.ctx.recorder
            rec.num_iterations += 1
            rec.num_steps_scheduled += 1
            cp_tokens = r.p2c_tokens
            end = None
            if self.cfg.leap and rec.trace is None:  # the same times, one event (pcie.py)
                end, wake, books = round_times(
                    env.now, start, dur, head, layer, self.pred.L,
                    r.swap_out_tokens * self.kv_token_bytes,
                    r.swap_in_tokens * self.kv_token_bytes, cp_tokens * self.kv_layer_bytes,
                    self._d2h, self._h2d)
                if arrives_at(self._arrivals, self.ctx.source.next_index, wake):
                    end = None
            if end is None:
                end = yield from self._round_events(r, start, dur, head, layer, cp_tokens)
            else:
                yield at(env, wake)
                for ch, nbytes, d, e in books:
                    ch.book(nbytes, d, e)
            self.clock = end
            if rec.trace is not None:
                rec.trace.iteration(
                    "engine 0", start, end, d.mode, prefill_tokens=int(t.num_tokens[pref].sum()),
                    prefill_chunks=t.num_tokens[pref], prefill_to_cpu=len(r.pref_cpu),
                    decodes=len(r.gdec) + len(r.cdec), gpu_decodes=len(r.gdec),
                    cpu_decodes=len(r.cdec), swap_out_tokens=r.swap_out_tokens,
                    swap_in_tokens=r.swap_in_tokens, kv_blocks_used=self.gpu_pool.num_used,
                    host_kv_blocks_used=self.host_pool.num_used)
            self._apply(r, pref)

    def _true_b0(self, b0, pref: np.ndarray):
        """b0 with its prefills' attention from the pricing model (the decision's sums are the
        deciding predictor's)."""
        if self.pricing is self.pred or not len(pref):
            return b0
        b = b0.copy()
        b.pref_us = float(sum(self.pricing.pref(x) for x in self.ctx.table.num_tokens[pref].tolist()))
        return b

    def _count_error(self, d, layer_s: float) -> None:
        """NEO's predicted GPU time of the round's layers (its t_pipe or t_seq) against the
        simulated layers."""
        p = self.pred
        pred_us = p.L * (p.gpu_time(d.b0) + p.gpu_time(d.b1) if d.mode == "pipe"
                         else p.gpu_time(d.g))
        sim_us = layer_s * 1e6 * p.L
        if sim_us > 0:
            err = abs(pred_us - sim_us) / sim_us
            self.err_sum += err
            self.err_n += 1
            self.err_max = max(self.err_max, err)

    def _round_events(self, r, start: float, dur: float, head: float, layer: float,
                      cp_tokens: int):
        """The round's PCIe transfers as SimPy processes on the contended channels; returns
        the round's end (the engine wakes at max(end, when the transfers are done))."""
        env = self.ctx.env
        swaps = env.process(self._swaps(r.swap_out_tokens, r.swap_in_tokens)) if (
            r.swap_out_tokens or r.swap_in_tokens) else None
        copies = env.process(self._layer_copies(cp_tokens, start + head, layer)) \
            if cp_tokens else None
        end = start + dur
        yield at(env, max(end, env.now))
        if swaps is not None:
            done = yield swaps
            end = max(end, done + dur - head)   # the first attention waited for the swap
        if copies is not None:
            yield copies
            end = max(end, env.now)
        if end > env.now:
            yield at(env, end)
        return end

    def _idle(self):
        env = self.ctx.env
        self._wake = env.event()
        yield self._wake
        self._wake = None
        self.clock = max(self.clock, env.now)

    def _apply(self, r, pref: np.ndarray) -> None:
        t = self.ctx.table
        if r.p2c_blocks:
            self.itm_pool.free(r.p2c_blocks)
        if len(pref):
            t.computed[pref] = t.num_tokens[pref]
            gen = np.concatenate((pref, r.gdec))
        else:
            gen = r.gdec
        t.computed[r.gdec] += 1
        done = t.emit(gen, self.clock)
        self.num_p2g += len(r.pref_gpu)
        self.num_p2c += len(r.pref_cpu)
        if len(r.cdec):
            self.num_cpu_batches += 1           # an iteration with CPU attention in it
            t.computed[r.cdec] += 1
            done = np.concatenate((done, t.emit(r.cdec, self.clock, on_cpu=True)))
            self.cpu_tokens += len(r.cdec)
        if len(r.pref_gpu):
            self.gpu_q.extend(r.pref_gpu.tolist())
        if len(r.pref_cpu):
            self.cpu_q.extend(r.pref_cpu.tolist())
        if len(done):
            self._finish(done)
        self._sample()

    def _finish(self, done: np.ndarray) -> None:
        t = self.ctx.table
        # (sums of a few ints: plain Python costs less than numpy's reductions here)
        self.gpu_pool.free(sum(t.blocks[done].tolist()))
        hb = self.host_blocks[done]
        on_host = sum(hb.tolist())
        self.host_pool.free(on_host)
        t.blocks[done] = 0
        self.host_blocks[done] = 0
        gone = set(done.tolist())
        self.gpu_q = [x for x in self.gpu_q if x not in gone]
        # a request holds host blocks exactly while it is in the CPU queue (a swapped-out
        # decode its GPU blocks, a Prefill-to-CPU prompt its KV; a swap-in returns them)
        if on_host:
            for x in done[hb > 0].tolist():
                self.cpu_q.remove(x)
        self.stats.update(self.counters())

    def _sample(self) -> None:
        self.ctx.recorder.sample(self.clock, 0, len(self.gpu_q) + len(self.cpu_q),
                                 len(self.waiting), self.gpu_pool.num_used,
                                 self.ctx.table.num_emitted)

    # -- event leaping over GPU-only decode rounds ------------------------------------------
    def _leap_ok(self) -> bool:
        """Only GPU decodes will run for the next rounds: nothing waits, and every CPU request
        stays stalled (no swap-in, none fits the pipeline), which holds until a request
        finishes or arrives since the GPU decodes' blocks only grow and b0 keeps its width."""
        B = len(self.gpu_q)
        cfg = self.cfg
        if not B or self.waiting or B > min(cfg.max_batch_size, cfg.max_tokens_in_batch):
            return False
        if not self.cpu_q:
            return True
        t, bs = self.ctx.table, self.block_size
        need = sum([-(-x // bs) for x in t.num_tokens[self.gpu_q].tolist()])
        if need > self.gpu_pool.num_blocks:
            return False                       # a swap-out is due
        head = self.cpu_q[0]
        if (B < min(cfg.max_batch_size, cfg.max_tokens_in_batch)
                and need + -(-int(t.num_tokens[head]) // bs)
                <= round(cfg.swap_in_ratio * self.gpu_pool.num_blocks)):
            return False                       # the head would be swapped in
        if not cfg.use_cpu:
            return True
        if not cfg.gpu_gating:
            return False                       # ungated: every CPU decode runs
        cq = self.cpu_q.ids()
        clen = t.num_tokens[cq]
        fits = self.pred.alone_us(clen) <= self.pred.lin(B)
        if self.host_pool.num_free <= 0:       # then only those needing no new host block
            fits &= -(-clen // bs) <= self.host_blocks[cq]
        return not fits[fits.argmax()]         # no CPU decode fits b1 (argmax: any True)

    def _leap(self) -> int:
        t, bs = self.ctx.table, self.block_size
        ids = np.asarray(self.gpu_q, dtype=np.int64)
        # plain ints: the batch is small, numpy calls cost more than the arithmetic
        c, held = t.computed[ids].tolist(), t.blocks[ids].tolist()
        g = t.generated[ids].tolist()
        kmax = min(min([o - x for o, x in zip(t.output[ids].tolist(), g)]), LEAP_CAP)
        if kmax < 2:
            return 0
        rooms = sorted([h * bs - x for h, x in zip(held, c)])
        free = self.gpu_pool.num_blocks - sum(held)

        def fits(k: int) -> bool:  # the decodes' GPU blocks after k more steps fit the pool
            return blocks_beyond(rooms, k, bs) <= free

        B = len(c)
        arrival = self.ctx.source.next_arrival_s
        cost = self.cost
        if self.host is not None and self.cfg.use_cpu and self.cpu_q:
            cost = _PlusConstant(cost, self.host.scan_us(len(self.cpu_q)) * 1e-6)
        # the steps that start before the next arrival, priced as `decode_ends` prices them
        # and cut as `steps_before` cuts them (`leap_ends`: the same floats), and of those the
        # most whose KV fits. Cutting by the arrival first gives the same steps as cutting by
        # the KV first (`leap_ends` returns a prefix of one sequence of floats whatever its
        # kmax, and the KV cut is a threshold on k), and then the KV is checked on a few
        # steps instead of searched over all of them; with no arrival ahead, the KV first.
        if arrival < np.inf:
            ends = leap_ends(cost, self.clock, B, sum(c) + B, max(c) + 1, kmax, arrival,
                             self._step_hint)
            k = largest_k(len(ends), fits)
        else:
            k = largest_k(kmax, fits)
            ends = leap_ends(cost, self.clock, B, sum(c) + B, max(c) + 1, k, arrival,
                             self._step_hint) if k >= 2 else ()
            k = len(ends)
        if k < 2:
            return 0
        if k < len(ends):
            ends = ends[:k]
        self._step_hint = (ends[-1] - self.clock) / k
        more = blocks_beyond(rooms, k, bs)
        if more:
            self.gpu_pool.allocate(more)
            t.blocks[ids] = [max(h, -(-(x + k) // bs)) for h, x in zip(held, c)]
        t.computed[ids] += k
        tr = self.ctx.recorder.trace
        if tr is not None:
            tr.iteration("engine 0", self.clock, ends[-1], f"decode x{k}", steps=k,
                         prefill_tokens=0, decodes=len(ids), gpu_decodes=len(ids),
                         cpu_decodes=0, kv_blocks_used=self.gpu_pool.num_used,
                         host_kv_blocks_used=self.host_pool.num_used)
        self.clock = ends[-1]
        self.ctx.recorder.num_iterations += k
        self.num_gpu_only += k
        if self.cfg.use_cpu and self.cpu_q:
            self.num_cpu_stalled += k
        done = t.emit_steps(ids, ends, g)      # emit_many of k - 1 steps, then emit
        if len(done):
            self._finish(done)
        self._sample()
        return k

    def counters(self) -> dict:
        return {"num_gpu_blocks": self.gpu_pool.num_blocks,
                "num_cpu_blocks": self.host_pool.num_blocks,
                "gpu_kv_peak_blocks": self.gpu_pool.peak_used,
                "host_kv_peak_blocks": self.host_pool.peak_used,
                "host_kv_blocks_in_use_at_end": self.host_pool.num_used,
                "itm_blocks_in_use_at_end": self.itm_pool.num_used,
                "num_pipeline_iterations": self.num_pipe,
                "num_gpu_only_iterations": self.num_gpu_only,
                "num_idle_rounds": self.num_idle, "num_swap_out": self.num_swap_out,
                "num_swap_in": self.num_swap_in, "num_recompute_victims": self.num_recompute,
                "num_cpu_tokens": self.cpu_tokens, "num_cpu_batches": self.num_cpu_batches,
                "num_prefill_to_gpu": self.num_p2g, "num_prefill_to_cpu": self.num_p2c,
                "num_cpu_stalled_rounds": self.num_cpu_stalled,
                "predictor_rounds": self.err_n,
                "predictor_error_mean": self.err_sum / self.err_n if self.err_n else 0.0,
                "predictor_error_max": self.err_max,
                "predictor_beyond_table": self.pred.beyond()}
