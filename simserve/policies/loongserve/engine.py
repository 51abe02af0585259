"""Policy `loongserve`: elastic sequence parallelism (LoongServe, SOSP'24; policies.md §4).

N = num_gpus / tp instances (each a TP group with its own KV pool). Prefill and decode run in
separate iterations (temporal isolation):
- decode iteration: every instance advances its resident decodes one token (multi-master,
  lockstep: the slowest instance sets the time, `SpCostModel.decode_only_s`);
- when no decode runs, or after `max_wait_tokens` decode iterations, a prefill batch is formed
  from the waiting queue (FCFS with head-of-line blocking, or SRPT) under LoongServe's checks:
  worst-case KV fit (outputs assumed `max_new_tokens_reserve` long), `batch_max_tokens`, and
  `max_prefill_time_ms` for batches of more than one prompt;
- the batch runs with SP = k over idle instances plus decode instances lent to it by LoongServe's
  rule (lend when the prefill gain (T_k − T_{k+1})·Σ 1/l exceeds the decode loss
  T_{k+1}·|b|·|b|/Σ out), k ≤ max_sp; instances not lent keep decoding meanwhile;
- scale-down: a finished prompt's KV goes to the most-used instance that fits it (moved over
  NVLink; the request decodes once it lands).
Simplifications: one SP group per prefill iteration (LoongServe's DP may form several); prompt
KV is accounted as 1/N on every instance while prefilling; a decode's KV lives on one instance.
Prefill time uses the same Ulysses SP cost as `conflux` (`simserve/cost/sp.py`), at degree k.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.errors import ConfigError
from simserve.policies import register
from simserve.policies.base import Deployment, cost_model, deploy, kv_blocks
from simserve.policies.loongserve.config import LoongServeConfig
from simserve.cost.loong import LoongCostModel
from simserve.policies.loongserve.decodes import DecodeRanks
from simserve.policies.loongserve.leap import leap_layout
from simserve.policies.sp_leap import LEAP_CAP
from simserve.policies.sp_ranks import blocks_for, check_fits, instance_layout, shard_blocks

# Exact event leaping over decode-only stretches (byte-identical to stepping; tests set it
# False to step one by one). Not a config field, so that configs and their hashes stay as they
# were.
LEAP = True


class LoongEngine(DecodeRanks):
    """Reuses the SP ranks' KV pools, decode growth/preemption, transfers and bookkeeping
    (its decode side over plain ints, `DecodeRanks`); replaces the iteration with
    LoongServe's alternation of prefill and decode."""

    def __init__(self, ctx, cfg: LoongServeConfig, gpus, cost_all: SpCostModel, costs: dict,
                 num_blocks: int):
        super().__init__(ctx, _Shim(cfg), 0, gpus, cost_all, None, num_blocks)
        self.lcfg, self.costs = cfg, costs
        self._progress_memo: dict = {}
        self._lent_memo: dict = {}
        self.sp_degrees = sorted(k for k in costs if k <= cfg.max_sp)
        self.num_decode_iters = 0
        total = num_blocks * len(self.pools) * cfg.block_size
        t = ctx.table  # max_req_len: the longest request (prompt and output)
        longest = int((t.prompt + t.output).max()) if t.n else 0
        self.batch_max = cfg.batch_max_tokens or max(total // 6, longest)

    # -- LoongServe's iteration ---------------------------------------------------------------
    def _iteration(self):
        self._prefill_memo = {}  # (k, batch) -> _prefill_s, for this iteration's decisions
        self._progress_memo = {}  # rank -> `_progress`, for this iteration's decisions
        self._lent_memo = {}      # (decodes per rank, batch) -> `_lent`, for this iteration
        self._grow_decodes()
        nd, dctx, dmax = self._decode_state()
        if self.pending and (not any(nd) or self.num_decode_iters >= self.lcfg.max_wait_tokens):
            batch = self._placeable(self._form_batch(list(nd)))
            if batch:
                self.num_decode_iters = 0
                return self._prefill_step(batch, list(nd), dctx)
        if not any(nd):
            return None
        self.num_decode_iters += 1
        # `decode_steps_s` at step 0: `decode_only_s`'s floats, from the cached layout's line
        dt = self.step_times.step_s(nd, dctx, dmax)
        ids = np.asarray([i for a in self.decodes for i in a], dtype=np.int64)
        return dt, lambda: self._apply(ids, [], [])

    def _leap_ok(self) -> bool:
        """Decode-only stretches: no KV in flight, and either no prompt pending or prompts
        waiting out `max_wait_tokens` decode iterations (at least 2 of them left)."""
        return not self.moving and (
            not self.pending or self.num_decode_iters + 2 <= self.lcfg.max_wait_tokens)

    def _leap(self) -> int:
        """Exact leap over decode-only steps, up to the next arrival, and while prompts wait,
        up to the iteration that tries a prefill again; each leapt step is a decode
        iteration, counted towards `max_wait_tokens` as a stepped one is."""
        cap = self.lcfg.max_wait_tokens - self.num_decode_iters if self.pending else LEAP_CAP
        k = leap_layout(self, cap)
        self.num_decode_iters += k
        return k

    def _order(self) -> list[int]:
        t = self.ctx.table
        if self.lcfg.scheduler == "srpt":
            return sorted(self.pending, key=lambda r: (int(t.num_tokens[r] - t.computed[r]), r))
        return list(self.pending)

    def _worst_case_blocks(self, rid: int) -> int:
        t = self.ctx.table
        out = min(int(t.output[rid] - t.generated[rid]), self.lcfg.max_new_tokens_reserve)
        return blocks_for(int(t.num_tokens[rid]) + out, self.cfg.block_size)

    def _growth_blocks(self, groups: list[list[int]]) -> list[int]:
        """Per group of requests: Σ max(0, `_worst_case_blocks(r)` − blocks held), in one
        gather (the same integers)."""
        t, bs = self.ctx.table, self.cfg.block_size
        n = sum(map(len, groups))
        if not n:
            return [0] * len(groups)
        a = np.fromiter((r for g in groups for r in g), dtype=np.int64, count=n)
        cap = self.lcfg.max_new_tokens_reserve
        x = [d if (d := -(-(nt + (o - gen if o - gen < cap else cap)) // bs) - b) > 0 else 0
             for nt, o, gen, b in zip(t.num_tokens[a].tolist(), t.output[a].tolist(),
                                      t.generated[a].tolist(), t.blocks[a].tolist())]
        sums, j = [], 0
        for g in groups:
            sums.append(sum(x[j:j + len(g)]))
            j += len(g)
        return sums

    def _form_batch(self, nd) -> list[tuple[int, int]]:
        """[(rid, tokens)] admitted this prefill iteration, in queue order."""
        t, lc, bs = self.ctx.table, self.lcfg, self.cfg.block_size
        free = sum(p.num_free for p in self.pools)
        room = free - sum(self._growth_blocks(self.decodes))
        shard_room = min(p.num_free for p in self.pools)  # every instance holds 1/N of a prompt
        idle = not any(nd) and not self.moving
        cap_s = self._time_cap(nd)
        batch: list[tuple[int, int]] = []
        tokens = 0
        for rid in self._order():
            m = int(t.num_tokens[rid] - t.computed[rid])
            need = self._worst_case_blocks(rid) - int(self.shard[rid])
            head = idle and not batch  # nothing else can free memory: the head always goes
            if not head and (need > room or tokens + m > self.batch_max):
                if lc.scheduler == "fcfs":
                    break  # head-of-line blocking
                continue
            trial = batch + [(rid, m)]
            k = self._sp_degree(nd, trial)
            tp = self._prefill_s(k, trial)
            if len(trial) > 1 and tp > lc.max_prefill_time_ms * 1e-3:
                break
            last = False
            if cap_s is not None and tp > cap_s:
                m, last = self._largest_chunk(k, batch, rid, cap_s), True
            new = max(0, shard_blocks(int(t.computed[rid]) + m, bs, self.R) - int(self.shard[rid]))
            if m == 0 or new > shard_room:
                break
            batch.append((rid, m))
            room -= need
            shard_room -= new
            tokens += m
            if last:
                break
        return batch

    def _placeable(self, batch):
        """The batch up to (not including) the first prompt that would finish with no instance
        able to take its whole KV (shards of the batch counted first)."""
        t, bs = self.ctx.table, self.cfg.block_size
        new = [max(0, shard_blocks(int(t.computed[r]) + m, bs, self.R) - int(self.shard[r]))
               for r, m in batch]
        free = [p.num_free - sum(new) for p in self.pools]
        for k, (rid, m) in enumerate(batch):
            if int(t.computed[rid]) + m == int(t.num_tokens[rid]) and \
                    t.generated[rid] + 1 < t.output[rid]:
                need = blocks_for(int(t.num_tokens[rid]), bs) - int(self.shard[rid]) - new[k]
                g = max(range(self.R), key=lambda r: free[r])
                if free[g] < need:
                    return batch[:k]
                free[g] -= need
        return batch

    def _time_cap(self, nd) -> float | None:
        """TBT-bounded mode: a prefill iteration may take τ minus one decode step."""
        if self.lcfg.tbt_ms is None:
            return None
        _, dctx, dmax = self._state
        dec = self.step_times.step_s(nd, dctx, dmax) if any(nd) else 0.0
        return max(0.0, self.lcfg.tbt_ms * 1e-3 - dec)

    def _largest_chunk(self, k: int, batch, rid: int, cap_s: float) -> int:
        lo, hi = 0, int(self.ctx.table.num_tokens[rid] - self.ctx.table.computed[rid])
        while lo < hi:  # prefill time grows with the chunk
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._prefill_s(k, batch + [(rid, mid)]) <= cap_s else (lo, mid - 1)
        return lo

    def _prefill_s(self, k: int, batch) -> float:
        """One SP-k prefill iteration of `batch` ([(rid, new tokens)]); memoised within an
        iteration (its cached tokens do not change until the iteration is applied)."""
        memo = getattr(self, "_prefill_memo", None)
        key = (k, tuple(batch))
        if memo is not None:
            v = memo.get(key)
            if v is not None:
                return v
        v = self._prefill_s_now(k, batch)
        if memo is not None:
            memo[key] = v
        return v

    def _prefill_s_now(self, k: int, batch) -> float:
        c = self.ctx.table.computed
        return self.costs[k].prefill_s([m for _, m in batch], [int(c[r]) for r, _ in batch])

    def _lent(self, nd, batch) -> list[int]:
        """Instances that run the prefill: idle ones, then decode instances (fewest decodes
        first) lent while the prefill gain beats the decode loss; at least one, at most max_sp.
        Memoised within an iteration (the final batch is asked for again when it runs)."""
        key = (tuple(nd), tuple(batch))
        chosen = self._lent_memo.get(key)
        if chosen is None:
            chosen = self._lent_memo[key] = self._lent_now(nd, batch)
        return chosen

    def _lent_now(self, nd, batch) -> list[int]:
        if self.lcfg.prefill_sp:  # pinned degree: idle instances first, then the least busy
            return sorted(range(self.R), key=lambda r: (nd[r], r))[:self.lcfg.prefill_sp]
        idle = [r for r in range(self.R) if nd[r] == 0]
        busy = sorted((r for r in range(self.R) if nd[r] > 0), key=lambda r: (nd[r], r))
        inv = sum(1.0 / max(1, m) for _, m in batch)
        degrees = self.sp_degrees
        k0 = max((d for d in degrees if d <= len(idle)), default=0)
        chosen, busy = idle[:k0], idle[k0:] + busy  # leftover idle instances are lent first
        while True:
            k = len(chosen)
            nxt = next((d for d in degrees if d > k), None)
            add = busy[:nxt - k] if nxt else []
            if nxt is None or len(add) < nxt - k:
                break
            if k > 0:
                gain = (self._prefill_s(k, batch) - self._prefill_s(nxt, batch)) * inv
                loss = self._prefill_s(nxt, batch) * sum(
                    nd[r] * nd[r] / self._progress(r) for r in add if nd[r] > 0)
                if gain <= loss:
                    break
            chosen += add
            busy = busy[len(add):]
        return chosen

    def _progress(self, r: int) -> int:
        """Σ (generated + 1) over rank r's decodes (memoised within an iteration)."""
        v = self._progress_memo.get(r)
        if v is None:
            a = self.decodes[r]
            v = self._progress_memo[r] = int(self.ctx.table.generated[a].sum()) + len(a)
        return v

    def _sp_degree(self, nd, batch) -> int:
        return len(self._lent(nd, batch))

    def _prefill_step(self, batch, nd, dctx):
        t, bs, R = self.ctx.table, self.cfg.block_size, self.R
        lent = self._lent(nd, batch)
        k = len(lent)
        dt = self._prefill_s(k, batch)
        for rid, m in batch:  # prompt KV, 1/N per instance while prefilling
            new = max(0, shard_blocks(int(t.computed[rid]) + m, bs, R) - int(self.shard[rid]))
            for p in self.pools:
                p.allocate(new)
            self.shard[rid] += new
        paused = [r for r in lent if nd[r] > 0]
        for r in paused:  # lent instances stop decoding for this iteration
            nd[r] = 0
        # instances that keep decoding run back-to-back steps within the prefill's time
        steps = self._decode_steps_within(nd, dctx, dt)
        finishing = []
        for rid, m in batch:
            if int(t.computed[rid]) + m == int(t.num_tokens[rid]):
                finishing.append(rid)
                if t.generated[rid] + 1 < t.output[rid]:
                    self._place(rid)
        chunks = [_Done(rid, m) for rid, m in batch]
        tokens = sum(m for _, m in batch)   # for a trace's per-rank events: the lent ranks'
        self.last_prefill_per_rank = [tokens // k if r in lent else 0 for r in range(R)]
        ends = steps[0]
        total = max(dt, float(ends[-1]) if len(ends) else 0.0)
        start = self.clock
        return total, lambda: self._apply_prefill(start, chunks, finishing, steps)

    def _place(self, rid: int) -> None:
        """Scale-down: the most-used instance that can hold the whole KV plus the output reserve
        (else the one with the most free blocks); its own 1/N shard stays in place."""
        t = self.ctx.table
        full = blocks_for(int(t.num_tokens[rid]), self.cfg.block_size)
        need = max(0, full - int(self.shard[rid]))
        reserve = blocks_for(self.lcfg.max_new_tokens_reserve, self.cfg.block_size)
        resident = [list(a) for a in self.decodes]
        for _, r, g in self.moving:
            resident[g].append(r)
        # room after the residents' worst-case growth (outputs assumed max_new_tokens_reserve)
        future = self._growth_blocks(resident)
        roomy = [r for r, p in enumerate(self.pools) if p.num_free - future[r] >= need + reserve]
        if roomy:
            g = max(roomy, key=lambda r: (self.pools[r].num_used, -r))
        else:
            g = max(range(self.R), key=lambda r: (self.pools[r].num_free, -r))
            if self.pools[g].num_free < need:
                raise RuntimeError(f"loongserve: no instance can hold request {rid}'s KV")
        self.pools[g].allocate(need)
        t.blocks[rid] = need + int(self.shard[rid])
        self.rank_of[rid] = g
        self._start_transfer(rid, g, int(t.num_tokens[rid]))

    def _apply_prefill(self, start: float, chunks, finishing, steps) -> None:
        t = self.ctx.table
        ends, ids = steps  # decode steps of the instances that kept decoding
        k = len(ends)
        if k:  # only the last can finish a request (steps <= the fewest tokens left)
            t.computed[ids] += k
            # emit_many of k - 1 steps and emit of the last (emit alone is quicker for one)
            done = t.emit(ids, start + float(ends[0])) if k == 1 else \
                t.emit_steps(ids, (start + ends).tolist(), t.generated[ids].tolist())
            if len(done):
                self._finish(done)
        # the prompts' chunks (`_apply` without decodes): the finished ones sample their
        # first token now and leave the queue
        for ch in chunks:
            t.computed[ch.req_id] += ch.tokens
        if finishing:
            done = t.emit(np.asarray(finishing, dtype=np.int64), self.clock)
            gone = set(finishing)
            self.pending = [r for r in self.pending if r not in gone]
            if len(done):
                self._finish(done)
        self._sample()


class _Done:
    __slots__ = ("req_id", "tokens")

    def __init__(self, rid: int, m: int):
        self.req_id, self.tokens = rid, m


class _Shim:
    """The fields `SpRanksEngine` reads from its config."""

    def __init__(self, cfg: LoongServeConfig):
        self.tp, self.block_size, self.leap = cfg.tp, cfg.block_size, LEAP


@register("loongserve", LoongServeConfig)
def build(ctx, cfg: LoongServeConfig) -> Deployment:
    hw, model = ctx.hardware, ctx.model
    N = instance_layout(hw.num_gpus, 1, cfg.tp, "loongserve")
    degrees = [k for k in (1, 2, 4, 8, 16) if k <= min(N, cfg.max_sp)]

    def sp_cost(k: int) -> SpCostModel:
        return cost_model(ctx, lambda: LoongCostModel(model, hw.gpu, hw.nvlink, k, cfg.tp,
                                                      cuda_graphs=cfg.cuda_graphs),
                          "policy loongserve")
    costs = {k: sp_cost(k) for k in degrees}
    if cfg.prefill_sp is not None and cfg.prefill_sp not in costs:
        raise ConfigError(f"policy loongserve: prefill_sp: {cfg.prefill_sp} is not one of the SP "
                          f"degrees available here ({sorted(costs)})")
    blocks, kv = kv_blocks(ctx, "policy loongserve: tp", cfg.tp, cfg.gpu_memory_utilization,
                           cfg.block_size, 8192, 1024, cfg.num_gpu_blocks_override,
                           cuda_graphs=cfg.cuda_graphs)
    cost_all = costs.get(N) or sp_cost(N)
    eng = LoongEngine(ctx, cfg, list(range(hw.num_gpus)), cost_all, costs, blocks)
    return deploy(ctx, "loongserve", [eng],
                  fits=lambda: check_fits(ctx, blocks, cfg.block_size, "loongserve",
                                          kv.kv_bytes / 2**30),
                  engine_stats=[dict(kv.summary(), num_gpu_blocks=blocks, instance=r)
                                for r in range(N)],
                  stats={"loongserve": eng.counts})
