"""The chunked-prefill engine runtime that `vllm`, `sarathi` and `chunked` run (one GPU or one
TP group), around a scheduler that makes the decisions (`vllm_scheduler.ChunkedScheduler`).

The runtime owns the SimPy process: each step it asks the scheduler for a batch, prices it
(`GpuCostModel.step_s`), waits for it and applies its tokens. Its collaborators:

- `KvBook` (`vllm_kv.py`): the paged pool, each request's blocks, prefix caching;
- `Intake` (`vllm_intake.py`): the API front end and async scheduling's cut-offs;
- `Leaper` (`vllm_leaper.py`): event leaping over decode-only steps, with results identical
  to stepping (tests check), which is where the speed comes from.

A batch is small (about ten requests at moderate load), so up to `SMALL_BATCH` requests it is
shaped on plain ints: numpy's per-call cost exceeds the arithmetic there.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simserve.cost import BatchShape, GpuCostModel
from simserve.cost.host import client_host, engine_host, with_batching
from simserve.errors import ConfigError
from simserve.policies.base import EngineBase, cost_model, deploy, kv_blocks
from simserve.policies.routing import route
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policies.vllm_intake import Intake
from simserve.policies.vllm_kv import KvBook
from simserve.policies.vllm_leaper import Leaper
from simserve.policies.vllm_loop import EngineLoop, loop_calls
from simserve.policies.vllm_scheduler import ChunkedScheduler, leaps
from simserve.sim.clock import at
from simserve.sim.context import SimContext

SMALL_BATCH = 48  # up to this many requests, schedule and shape batches on plain ints


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


class ChunkedEngine(EngineBase):
    """One engine over a TP group running `scheduler`; parameters are in
    `vllm_engine_config.py`; the members the runner reads are `policies/base.py`'s `Replica`;
    what the scheduler reads is `vllm_scheduler.EngineState`."""

    def __init__(self, ctx: SimContext, cfg: ChunkedConfig, index: int, gpus: list[int],
                 scheduler: ChunkedScheduler):
        self.ctx, self.cfg, self.index, self.gpus = ctx, cfg, index, gpus
        self.scheduler, self.kind = scheduler, scheduler.kind
        self.table = ctx.table
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
            pc = (r["enable_prefix_caching"] if scheduler.prefix_caching_default is None
                  else scheduler.prefix_caching_default)
        r["enable_prefix_caching"] = pc
        self.kv = KvBook(ctx.table, f"engine{index}.gpu_kv", blocks, cfg.block_size, pc)
        self.pool = self.kv.pool
        self.prefill_tokens = 0  # prompt (and recomputed) tokens computed, prefix hits excluded
        self.kv_summary = dict(kv.summary(), num_gpu_blocks=blocks, **r)
        host = self._host(cfg, hw)
        self.cost = cost_model(ctx, lambda: GpuCostModel(
            ctx.model, hw.gpu, cfg.tp, hw.nvlink, cfg.cuda_graphs,
            table_tokens=max(self.budget, self.max_seqs), mixed_attention=cfg.mixed_attention,
            graph_max_tokens=cfg.graph_max_tokens, host=host), f"policy {self.kind}")
        # the API-server front end (admission and token delivery contend for one CPU)
        self.intake = Intake(ctx, self, host.make_frontend() if host is not None else None,
                             host is not None and not host.ideal and host.async_scheduling)
        self.leaper = Leaper(self)
        # vLLM's async engine-core loop (`vllm_loop.py`), where its host calls were measured
        # (its launch modes cut at the cost model's CUDA-graph limit: 0 without graphs)
        self.loop = None
        calls = loop_calls(host)
        if calls and self.intake.async_:
            fe = self.intake.frontend
            self.loop = self.intake.loop = EngineLoop(
                ctx.table, calls, self.cost.graph_max, ctx.model.num_layers,
                fe.out_s + fe.out_delay_s if fe is not None else 0.0)
        self.leap = leaps(scheduler, cfg.leap)
        self.running: list[int] = []
        self.waiting = scheduler.waiting_queue(ctx.table)
        self.clock = 0.0
        self._wake = None
        self.num_preemptions = 0
        self.proc = None  # this engine's SimPy process (a cut leap interrupts its wait)

    def _host(self, cfg: ChunkedConfig, hw):
        try:
            host = engine_host(hw.gpu, cfg.engine, cfg.vllm_version)
            if host is not None and cfg.async_scheduling is not None and not host.ideal:
                host = dataclasses.replace(host, async_scheduling=cfg.async_scheduling)
            host = with_batching(host, cfg.tokenizer_batching)
            host = client_host(host, cfg.api_server, cfg.detokenize, cfg.offline)
        except ValueError as exc:
            raise ConfigError(f"policy {self.kind}: {exc}") from None
        return host

    # -- the router's interface ---------------------------------------------------------
    counts_front_end = True  # `load()` counts requests still in the front end

    def load(self) -> int:
        """Requests held now, those still in the API server's front end included (a burst
        at one instant spreads over the replicas); a pending leap's finishes count from
        their step's end."""
        n = len(self.running) + len(self.waiting) + self.intake.num_in_frontend()
        p = self.leaper.pending
        if p is not None and len(p.starts) > 1:
            n -= p.finished_before(self.ctx.env.now)
        return n

    def enqueue(self, rid: int) -> None:
        self.intake.enqueue(rid)

    # -- what the scheduler and the collaborators call ----------------------------------
    def arrive(self, rid: int) -> None:
        """`rid` reaches the waiting queue now."""
        self.waiting.append(rid)
        self.intake.reach(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def take(self, rid: int) -> None:
        """The head of the queue joins the running batch."""
        self.waiting.popleft()
        self.intake.reached.pop(rid, None)
        self.running.append(rid)

    def preempt(self, rid: int) -> None:
        """Preempt running request `rid` by recompute: its KV freed, back to the waiting
        queue's front."""
        run = self.running
        if run[-1] == rid:
            run.pop()
        else:
            run.remove(rid)
        self.kv.drop(rid)
        self.table.preemptions[rid] += 1
        self.num_preemptions += 1
        self.waiting.appendleft(rid)

    def finish(self, done) -> None:
        """Free the KV of the running requests `done` (an id array or list) and drop them."""
        dl = done if type(done) is list else done.tolist()
        self.kv.free_finished(dl)
        if len(dl) == 1:  # the common case: one finish (ids are distinct, all running)
            self.running.remove(dl[0])
        else:
            gone = set(dl)
            self.running = [r for r in self.running if r not in gone]

    def sample(self) -> None:
        self.ctx.recorder.sample(self.clock, self.index, len(self.running), len(self.waiting),
                                 self.pool.num_used, self.table.num_emitted)

    # -- the engine process ---------------------------------------------------------------
    def run(self):
        env = self.ctx.env
        self.proc = env.active_process
        while True:
            if not self.running and not self.waiting:
                if self.loop is not None:   # the last step's tokens go out at once
                    self.loop.release()
                self._wake = env.event()
                yield self._wake
                self._wake = None
                self.clock = max(self.clock, env.now)
                if self.loop is not None:
                    self.loop.idle(env.now)
                continue
            loop, leap = self.loop, self.leap
            if loop is not None:
                start = loop.decode_start(self.clock)
                # a step the host holds back (after a host-timed step) is stepped: a leap
                # takes arrivals during its first step as arriving in flight; a batch beyond
                # the CUDA-graph sizes runs eager, host-timed
                leap = leap and start == self.clock and loop.leaps(len(self.running))
                self.clock = start
            if leap and self.leaper.start():
                if loop is not None:   # a full-graph step: the last step's tokens went out
                    loop.release()
                yield from self.leaper.wait()
                if loop is not None:
                    loop.leapt(self.intake.prev_start, self.leaper.last_ids, self.clock,
                               self.leaper.last_time)
                continue
            batch = self._schedule()
            shape, sample = self._shape(*batch)
            if loop is not None:
                if loop.full(shape):
                    loop.decoded(self.clock)
                else:
                    self.clock = loop.host_step(shape, self.clock)
            self._price(shape)
            yield at(env, max(self.clock, env.now))
            self._apply(batch, sample)

    def _schedule(self):
        """This step's batch from the scheduler, as the engine core sees it: under async
        scheduling a step back to back with the last was scheduled when the last began."""
        intake = self.intake
        if self.loop is not None:   # requests that reached the engine core before H
            intake.cutoff = self.loop.cut
        elif intake.async_:
            intake.cutoff = intake.step_cutoff(self.clock)
        pre = self.num_preemptions
        ids, n = self.scheduler.schedule(self)
        if len(ids) == 0 and self.num_preemptions != pre:
            # every running request was preempted: the step admits from the queue instead
            ids, n = self.scheduler.schedule(self)
        if len(ids) == 0 and intake.cutoff < self.clock:
            # nothing else was schedulable, so the engine core blocked on the last step
            # and scheduled this one when it ended
            intake.cutoff = self.clock
            ids, n = self.scheduler.schedule(self)
        if len(ids) == 0:
            raise RuntimeError(f"engine {self.index}: nothing schedulable with "
                               f"{len(self.waiting)} waiting; KV pool too small?")
        return ids, n

    def _price(self, shape: BatchShape) -> None:
        """Advance the clock by the step's time and record it."""
        rec, intake = self.ctx.recorder, self.intake
        start = intake.prev_start = self.clock
        self.clock += self.cost.step_s(shape)
        intake.prev_end = self.clock
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

    def _shape(self, ids, n) -> tuple[BatchShape, list | np.ndarray]:
        t = self.table
        if type(ids) is list or len(ids) <= SMALL_BATCH:  # plain ints beat numpy's
            comp, _, ntok, gen, _ = self.kv.views  # per-call cost here
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

    def _apply(self, batch, sample) -> None:
        t = self.table
        ids, n = batch
        if type(sample) is list:  # `_shape`'s small batch
            out = _advance(self.kv.views[0], ids if type(ids) is list else ids.tolist(),
                           n if type(n) is list else n.tolist(), sample)  # (`emit` takes a list)
        else:
            t.computed[ids] += n
            out = ids[sample]
        loop = self.loop
        d = self.intake.delivered(self.clock, len(out))
        if loop is not None and t.on_finish is not None:   # a closed loop: finishes held
            loop.held()
            done = t.emit(out, d)
            loop.restore()
        else:
            done = t.emit(out, d)
        if loop is not None:
            loop.applied(out, self.clock, float(d))
        if len(done):
            self.finish(done)
        self.sample()
        self.scheduler.on_step_done(self, batch)

    def prefix_cache_stats(self) -> dict | None:
        return self.kv.stats()


def chunked_replicas(ctx: SimContext, cfg: ChunkedConfig, scheduler_cls: type):
    """num_gpus / tp replicas of a `ChunkedEngine` running `scheduler_cls(cfg)` each, behind
    `cfg.router` (`routing.py`; default: the fewest requests, the lowest index on ties). A
    policy's build function returns this."""
    G, tp, kind = ctx.hardware.num_gpus, cfg.tp, scheduler_cls.kind
    if G % tp:
        raise ConfigError(f"policy {kind}: tp={tp} does not divide num_gpus={G}")
    if cfg.offline:  # LLM.generate on a list: every request added at once
        ctx.table.scheduled[:] = 0.0
        ctx.table.arrival[:] = 0.0
    engines = [ChunkedEngine(ctx, cfg, i, list(range(i * tp, (i + 1) * tp)), scheduler_cls(cfg))
               for i in range(G // tp)]
    return route(ctx, cfg, deploy(ctx, kind, engines))
