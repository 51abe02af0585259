"""The MuxWise engine: one TP group, prefill and decode as separate concurrent streams.

- Prefill stream: one batch of whole prompts at a time (up to `prefill_max_tokens`, always at
  least one), never co-batched with decode.
- Decode stream: continuous batching; prefilled requests join at the next decode step.
- SM split (policies.md §5, ConfluxServe §8.1): while both run, decode gets the fewest SMs of
  SGLang's groups whose predicted step, slowed by the contention factor alpha, meets the TBT
  SLO (the largest group if none does); prefill gets the rest, slowed by beta. A phase running
  alone gets every SM and no contention. The split is chosen at every decode step; the prefill
  batch advances by the fraction of its work done under each step's split.
- KV: one pool; a request reserves blocks for prompt + output when its prefill starts (so
  decode never runs out; MuxWise-FCFS has no preemption).
Decode-only stretches are leapt exactly up to the next arrival or finish.
"""
from __future__ import annotations

import numpy as np

from simserve.cost import GpuCostModel
from simserve.errors import ConfigError
from simserve.policies import register
from simserve.policies.base import EngineBase, cost_model, deploy, kv_blocks
from simserve.sim.leap import leap_ends
from simserve.policies.muxwise.config import MuxWiseConfig
from simserve.cost.smshare import contention
from simserve.cost.mux_share import MuxShareCost
from simserve.policies.queues import make_queue
from simserve.policies.signal import Signal
from simserve.sim.kv import BlockPool
from simserve.sim.clock import at

LEAP_CAP = 8192
SCALAR_SPLIT_STEPS = 16  # split steps priced one at a time (~15 us each) before runs (~60 us)


class MuxWiseEngine(EngineBase):
    kind = "muxwise"

    def __init__(self, ctx, cfg: MuxWiseConfig, index: int, gpus: list[int]):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        hw, tp = ctx.hardware, len(gpus)
        blocks, kv = kv_blocks(ctx, "policy muxwise", tp, cfg.gpu_memory_utilization,
                               cfg.block_size, cfg.prefill_max_tokens, cfg.max_num_seqs,
                               cfg.num_gpu_blocks_override, cuda_graphs=cfg.cuda_graphs,
                               graphs_counted=False)
        self.pool = BlockPool(f"engine{index}.gpu_kv", blocks, cfg.block_size)
        self.kv_summary = dict(kv.summary(), num_gpu_blocks=blocks)
        cost = cost_model(ctx, lambda: GpuCostModel(
            ctx.model, hw.gpu, tp, hw.nvlink, cfg.cuda_graphs,
            table_tokens=max(cfg.prefill_max_tokens, cfg.max_num_seqs)), "policy muxwise")
        try:
            self.sms = int(hw.gpu.spec["sms"])
            self.choices = cfg.decode_sm_choices(self.sms)
        except ValueError as exc:
            raise ConfigError(f"policy muxwise: {exc}") from None
        # measured spatial-sharing curves of the profile, unless bw_saturation forces the
        # analytic model; alpha, beta from the same measurement unless configured
        self.curves = hw.gpu.overheads.get("sm_share")
        self._ab: dict[float, tuple[float, float]] = {}
        self.cost = MuxShareCost(cost, cfg.bw_saturation or 0.5,
                                 curves=self.curves if cfg.bw_saturation is None else None,
                                 table_tokens=max(cfg.prefill_max_tokens, cfg.max_num_seqs))
        self.tbt_s = cfg.tbt_ms / 1e3
        self.waiting = make_queue(cfg.scheduler, ctx.table)
        self.running: list[int] = []
        self.batch = None          # prefill batch: request ids
        self._batch_start = 0.0    # when it started (a trace's prefill event)
        self.left = 0.0            # fraction of its work still to do
        self._tp_cache: dict[float, float] = {}
        self._last_choice: tuple = (None, None)  # `_choose`'s last (arguments, answer)
        self.signal = Signal(ctx.env)
        self.clock = 0.0
        self._step_hint = 0.0      # a recent decode-alone step's duration (sizes a leap's pricing)
        self.num_split_steps = 0
        self.decode_sms_sum = 0

    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def enqueue(self, rid: int) -> None:
        self.waiting.append(rid)
        self.signal.fire()

    # -- decisions --------------------------------------------------------------------------
    def contention(self, f_decode: float) -> tuple[float, float]:
        """(alpha, beta) with decode on share `f_decode` of the SMs: configured numbers, else
        the profile's measured curves, else the Fig. 14a constant (memoised: the shares are
        SGLang's few SM groups)."""
        ab = self._ab.get(f_decode)
        if ab is None:
            a, b = contention(self.curves, f_decode)
            c = self.cfg
            ab = self._ab[f_decode] = (
                a if c.decode_contention is None else c.decode_contention,
                b if c.prefill_contention is None else c.prefill_contention)
        return ab

    def decode_sms(self, batch: int, ctx_sum: int, ctx_max: int | None = None) -> int:
        """Fewest decode SMs whose contended step meets the TBT (the largest group if none)."""
        return self._choose(batch, ctx_sum, ctx_max)[0]

    def _choose(self, batch: int, ctx_sum: int, ctx_max: int | None) -> tuple[int, float]:
        """`decode_sms` and the contended step time on them (priced once; the last answer is
        kept: a split step that ends the prefill is priced by `_mixed_plan`, then stepped)."""
        key = (batch, ctx_sum, ctx_max)
        if self._last_choice[0] == key:
            return self._last_choice[1]
        self._last_choice = (key, self._choose_now(batch, ctx_sum, ctx_max))
        return self._last_choice[1]

    def _choose_now(self, batch: int, ctx_sum: int, ctx_max: int | None) -> tuple[int, float]:
        d = 0.0
        for sms in self.choices:
            f = sms / self.sms
            a = self.contention(f)[0]
            d = a * self.cost.decode_step_s(batch, ctx_sum, f, ctx_max)
            if d <= self.tbt_s:
                return sms, d
        return self.choices[-1], d

    def _start_batch(self, at: float | None = None) -> None:
        """The next prefill batch (FCFS up to the token limit, KV for prompt and output),
        starting at `at` (default the clock)."""
        t, pool = self.ctx.table, self.pool
        batch, tokens = [], 0
        while self.waiting:
            r = self.waiting[0]
            p = int(t.prompt[r])
            nb = pool.blocks_for(p + int(t.output[r]))
            if (batch and tokens + p > self.cfg.prefill_max_tokens) or not pool.can_allocate(nb):
                break
            pool.allocate(nb)
            t.blocks[r] = nb
            batch.append(self.waiting.popleft())
            tokens += p
        if batch:
            self.batch, self.left, self._tp_cache = np.asarray(batch, dtype=np.int64), 1.0, {}
            self._batch_start = self.clock if at is None else at

    def _prefill_s(self, f: float) -> float:
        """Time of the current prefill batch on share f (with contention when f < 1)."""
        if f not in self._tp_cache:
            x = self.cost.prefill_s(self.ctx.table.prompt[self.batch], f)
            self._tp_cache[f] = x * (self.contention(1.0 - f)[1] if f < 1.0 else 1.0)
        return self._tp_cache[f]

    def _end_prefill(self, at: float, joiners: list[int]) -> None:
        t = self.ctx.table
        ids = self.batch
        tr = self.ctx.recorder.trace
        if tr is not None:
            tr.iteration(f"engine {self.index} prefill stream", self._batch_start, at, "prefill",
                         prefill_tokens=int(t.prompt[ids].sum()) - int(t.computed[ids].sum()),
                         prefill_chunks=t.prompt[ids] - t.computed[ids], decodes=0,
                         kv_blocks_used=self.pool.num_used)
        t.computed[ids] = t.prompt[ids]
        done = t.emit(ids, at)
        self._release(done)
        gone = set(done.tolist())
        joiners += [r for r in ids.tolist() if r not in gone]
        self.batch = None
        self.ctx.recorder.num_iterations += 1

    def _release(self, done: np.ndarray) -> None:
        if len(done):
            t = self.ctx.table
            self.pool.free(int(t.blocks[done].sum()))
            t.blocks[done] = 0

    # -- the engine process -------------------------------------------------------------------
    def run(self):
        env, t, rec = self.ctx.env, self.ctx.table, self.ctx.recorder
        while True:
            if self.batch is None and self.waiting:
                self._start_batch()
            if self.batch is None and not self.running:
                yield self.signal.wait()
                self.clock = max(self.clock, env.now)
                continue
            joiners: list[int] = []
            if not self.running:                      # prefill alone, every SM
                end = self.clock + self.left * self._prefill_s(1.0)
                yield at(env, max(end, env.now))
                self.clock = end
                self._end_prefill(end, joiners)
            elif self.batch is None:                  # decode alone: leap
                yield from self._decode_leap()
                continue
            else:
                if self.cfg.leap:
                    plan = self._mixed_plan()
                    if plan is not None:
                        yield from self._mixed_leap(*plan)
                        continue
                yield from self._mixed_step(joiners)
            self.running += joiners
            rec.num_steps_scheduled += 1
            rec.sample(self.clock, self.index, len(self.running), len(self.waiting),
                       self.pool.num_used, t.num_emitted)

    def _decode_ids(self):
        t = self.ctx.table
        ids = np.asarray(self.running, dtype=np.int64)
        return ids, int((t.computed[ids] + 1).sum())

    def _finish_decode(self, ids, kd: int, ends) -> None:
        """The first kd decode steps of `ends` (their end times) done: tokens, clock, finishes."""
        t = self.ctx.table
        tr = self.ctx.recorder.trace
        if tr is not None:
            tr.iteration(f"engine {self.index} decode stream", self.clock, float(ends[kd - 1]),
                         "decode" if kd == 1 else f"decode x{kd}", steps=kd, prefill_tokens=0,
                         decodes=len(ids), kv_blocks_used=self.pool.num_used,
                         prefill_running=self.batch is not None)
        self.clock = float(ends[kd - 1])
        # decodes have their first token (from the prefill): emit_steps' one call is
        # emit_many of the first kd - 1 steps and emit of the last (emit is quicker for one)
        done = t.emit(ids, self.clock) if kd == 1 else \
            t.emit_steps(ids, ends[:kd], t.generated[ids].tolist())
        t.computed[ids] += kd
        self.ctx.recorder.num_iterations += kd
        if len(done):
            gone = set(done.tolist())
            self.running = [r for r in self.running if r not in gone]
            self._release(done)

    def _decode_leap(self):
        env, t = self.ctx.env, self.ctx.table
        ids, S = self._decode_ids()
        k = min(int((t.output[ids] - t.generated[ids]).min()), LEAP_CAP) if self.cfg.leap else 1
        # steps after the first must start before the next arrival (which starts a prefill);
        # `leap_ends` gives `decode_ends` cut by `steps_before`, pricing only about the steps
        # taken (sized by the last leap's step time)
        ends = leap_ends(self.cost.cost, self.clock, len(ids), S,
                         int(t.computed[ids].max()) + 1, k, self.ctx.source.next_arrival_s,
                         self._step_hint)
        k = len(ends)
        self._step_hint = (ends[-1] - self.clock) / k
        yield at(env, max(ends[k - 1], env.now))
        self._finish_decode(ids, k, ends)
        self.ctx.recorder.num_steps_scheduled += 1
        self.ctx.recorder.sample(self.clock, self.index, len(self.running), len(self.waiting),
                                 self.pool.num_used, t.num_emitted)

    def _choose_many(self, batch: int, ctx_sum0: int, ctx_max0: int, k: int):
        """`_choose` for k consecutive steps (Σ context ctx_sum0 + batch·j, longest
        ctx_max0 + j): the decode SMs and contended step time of each, the same floats as one
        step at a time. Steps still open at a share are priced as one run when they are
        consecutive (`decode_run_s`), else elementwise (`decode_steps_s`): the same floats."""
        steps = np.arange(k, dtype=np.int64)
        sms_out = np.full(k, self.choices[-1], dtype=np.int64)
        d_out = np.empty(k)
        todo = steps
        for i, sms in enumerate(self.choices):
            f = sms / self.sms
            a = self.contention(f)[0]
            j0 = int(todo[0])
            if int(todo[-1]) - j0 + 1 == len(todo):
                d = a * self.cost.decode_run_s(batch, ctx_sum0 + batch * j0, ctx_max0 + j0,
                                               len(todo), f)
            else:
                d = a * self.cost.decode_steps_s(batch, ctx_sum0 + batch * todo, f,
                                                 ctx_max0 + todo)
            sel = (d <= self.tbt_s) | (i == len(self.choices) - 1)
            sms_out[todo[sel]] = sms
            d_out[todo[sel]] = d[sel]
            todo = todo[~sel]
            if not len(todo):
                break
        return sms_out, d_out

    def _split_steps(self, batch: int, ctx_sum0: int, ctx_max0: int, kmax: int):
        """(decode SMs, contended step time) of consecutive split steps j < kmax (Σ context
        ctx_sum0 + batch·j, longest ctx_max0 + j), lazily: the first SCALAR_SPLIT_STEPS one
        at a time (`_choose`: most split stretches end within a few steps, and a scalar step
        costs far less than a priced run), then in doubling runs (`_choose_many`); the same
        floats either way."""
        j = 0
        while j < min(kmax, SCALAR_SPLIT_STEPS):
            yield self._choose(batch, ctx_sum0 + batch * j, ctx_max0 + j)
            j += 1
        chunk = 16
        while j < kmax:
            m = min(chunk, kmax - j)
            sms, d = self._choose_many(batch, ctx_sum0 + batch * j, ctx_max0 + j, m)
            yield from zip(sms.tolist(), d.tolist())
            j += m
            chunk *= 2

    def _mixed_plan(self):
        """Exact leap over split steps (decode on its SM share, the prefill batch advancing on
        the rest) that do not end the prefill: each step's SMs and time as `_mixed_step` picks
        them (`_split_steps`), the prefill's remaining fraction updated step by step with the
        same float operations; at most up to a decode finishing, and steps after the first start
        before the next arrival (as `_decode_leap`). (ids, ends, sms per step, left) or None."""
        t = self.ctx.table
        ids, S = self._decode_ids()
        kmax = min(int((t.output[ids] - t.generated[ids]).min()), LEAP_CAP)
        if kmax < 2:
            return None
        cmax = int(t.computed[ids].max()) + 1
        arrival = self.ctx.source.next_arrival_s
        clock, left = self.clock, self.left
        ends, chosen = [], []
        for sms, d in self._split_steps(len(ids), S, cmax, kmax):
            end = clock + d
            tp = self._prefill_s(1.0 - sms / self.sms)
            if clock + left * tp <= end:  # the prefill ends in this step: step it
                return (ids, ends, chosen, left) if ends else None
            left -= (end - clock) / tp
            ends.append(end)
            chosen.append(sms)
            clock = end
            if end >= arrival:
                break
        return ids, ends, chosen, left

    def _mixed_leap(self, ids, ends, chosen, left):
        env, t = self.ctx.env, self.ctx.table
        k = len(ends)
        self.left = left
        self.num_split_steps += k
        self.decode_sms_sum += sum(chosen)
        yield at(env, max(ends[-1], env.now))
        self._finish_decode(ids, k, np.asarray(ends))
        self.ctx.recorder.num_steps_scheduled += 1
        self.ctx.recorder.sample(self.clock, self.index, len(self.running), len(self.waiting),
                                 self.pool.num_used, t.num_emitted)

    def _mixed_step(self, joiners: list[int]):
        """One decode step on its SM share while the prefill stream advances on the rest."""
        env = self.ctx.env
        ids, S = self._decode_ids()
        cmax = int(self.ctx.table.computed[ids].max()) + 1
        sms, d = self._choose(len(ids), S, cmax)
        f = sms / self.sms
        end = self.clock + d
        t0 = self.clock
        while self.batch is not None and t0 < end:
            tp = self._prefill_s(1.0 - f)
            need = self.left * tp
            if t0 + need <= end:
                t0 += need
                self._end_prefill(t0, joiners)
                self._start_batch(t0)   # the next batch starts on the freed prefill stream
            else:
                self.left -= (end - t0) / tp
                t0 = end
        self.num_split_steps += 1
        self.decode_sms_sum += sms
        yield at(env, max(end, env.now))
        self._finish_decode(ids, 1, np.asarray([end]))


@register("muxwise", MuxWiseConfig)
def build(ctx, cfg: MuxWiseConfig):
    G = ctx.hardware.num_gpus
    tp = cfg.tp or G
    if G % tp:
        raise ConfigError(f"policy.tp: {tp} does not divide hardware.num_gpus={G}")
    engines = [MuxWiseEngine(ctx, cfg, i, list(range(i * tp, (i + 1) * tp))) for i in range(G // tp)]
    return deploy(ctx, "muxwise", engines)
