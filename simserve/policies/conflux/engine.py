"""One XP instance of ConfluxServe (§5): the iteration of Alg. 1 on `SpRanksEngine`'s ranks.

Each iteration (§5.1): every resident decode advances one token on its rank (stall-free); then
`plan.plan_prefills` fills the TBT-safe budget with prefill chunks (estimator + waterfill +
placement + admission), committed against the per-rank pools; the iteration lasts
`SpCostModel.iteration_s`.
"""
from __future__ import annotations

import numpy as np

from simserve.cost.sp import SpCostModel
from simserve.policies.conflux.admission import PendingPrefill
from simserve.policies.conflux.dispatch import RankState
from simserve.policies.conflux.kv_moves import KvMoves
from simserve.policies.conflux.leap import FEW_DECODES, leap_instance
from simserve.policies.conflux.placement import place_on
from simserve.policies.conflux.plan import plan_prefills
from simserve.policies.sp_leap import flat_decodes
from simserve.policies.sp_ranks import SpRanksEngine

_ADMISSION = {"slo": "moore_hodgson", "fcfs": "fcfs"}
_FEW = 8  # pending prompts read one by one (more: gathered with numpy)


class XpInstance(SpRanksEngine):
    margin = 0.0  # dispatch headroom (ConfluxConfig.tbt_margin, resolved by the policy)
    # the decode placement rule, `placement.place_on`'s signature (`placement.PLACEMENTS`):
    # the one place the plan reads it from; the policy sets it from `placement:`
    placement = staticmethod(place_on)
    tracker = None  # tracking.EstimatorTracker: estimate vs actual of prefill iterations

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hints: dict = {}    # the last water levels found (searches start there)
        self._specs: dict = {}    # req_id -> its PendingPrefill while it stays as it was
        self._flat: tuple = (None, None)   # (decode lists, _flat_decodes of them)
        self._moves = KvMoves(self.ctx.env)   # KV moves without SimPy processes
        self._channels: dict = {}  # decode rank -> the NVLink channels a move to it uses
        self._report: dict = {}    # the plan's estimate of its iteration (`plan_prefills`)
        # the table's int arrays, read and written one by one where there are few decodes
        # (FEW_DECODES; the arrays are made once, with the table)
        t = self.ctx.table
        self._comp, self._held = memoryview(t.computed), memoryview(t.blocks)
        self._gen, self._out = memoryview(t.generated), memoryview(t.output)
        self._ntok = memoryview(t.num_tokens)
        self._kv_blocks = sum(p.num_blocks for p in self.pools)   # the pools' blocks in all
        self._shard, self._rank_of = memoryview(self.shard), memoryview(self.rank_of)
        # a prefilling iteration's time: `SpCostModel.mixed_step_s` where it is what
        # `iteration_s` computes (the class's own), else the cost model's `iteration_s`
        c = self.cost
        self._mixed_step_s = c.mixed_step_s if isinstance(c, SpCostModel) and \
            type(c).iteration_s is SpCostModel.iteration_s else c.iteration_s

    def counters(self) -> dict:
        """The estimator counters (`tracking.EstimatorTracker.summary`) with the estimator's
        α, β and dispatch margin, and admission's: `conflux_num_admission_rejections`, the
        requests Moore–Hodgson dropped from at least one iteration's admitted set (each
        counted once), and `conflux_num_admission_rejection_iterations`, the (request,
        iteration) drops (a request dropped in 50 iterations counts 50). The instances share
        one tracker and one KV-move count, which only instance 0 reports; each instance
        reports its own admission drops (a request is planned by one instance), and the
        runner sums engines' counters per key."""
        if self.tracker is None:
            return {}
        rep = self._report
        own = dict(conflux_num_admission_rejections=len(rep.get("rejected_ids", ())),
                   conflux_num_admission_rejection_iterations=rep.get("rejected", 0))
        if self.index != 0:
            return own
        return dict(self.tracker.summary(), conflux_tbt_margin=self.margin,
                    conflux_alpha=self.est.alpha, conflux_beta=self.est.beta,
                    conflux_num_ranks=self.R,
                    conflux_num_kv_transfers=self.counts["num_kv_transfers"], **own)

    def _leap(self) -> int:
        return leap_instance(self)

    def _start_transfer(self, rid: int, g: int, tokens: int) -> None:
        """`SpRanksEngine._start_transfer`'s transfers booked in closed form (`kv_moves`: the
        same ends and landing); with a trace (which draws each transfer as it ends) or a
        single rank, the processes."""
        if self.ctx.recorder.trace is not None or self.R == 1:
            return super()._start_transfer(rid, g, tokens)
        chs = self._channels.get(g)
        if chs is None:
            cl = self.ctx.cluster
            chs = self._channels[g] = [
                cl.nvlink_channel(src, dst) for r in range(self.R) if r != g
                for src, dst in zip(self.rank_gpus[r], self.rank_gpus[g])]
        ev = self._moves.start(chs, self.cost.shard_transfer_bytes(tokens))
        self.moving.append((ev, rid, g))
        self.counts["num_kv_transfers"] += 1

    def _land(self) -> None:
        """`SpRanksEngine._land` with `kv_moves`' landing rule for closed-form moves."""
        if not self.moving:
            return
        keep, landed = [], self._moves.landed
        for ev, rid, g in self.moving:
            if landed(ev):  # the decode rank keeps its shard blocks (now in t.blocks)
                self._free_shard(rid, keep=g)
                self.decodes[g].append(rid)
            else:
                keep.append((ev, rid, g))
        self.moving = keep

    def _decode_state(self) -> tuple[list[int], list[int], list[int]]:
        """`_grow_decodes` then, per rank, the decodes, their Σ context and the longest context
        (tokens in KV plus the new one; 0 without decodes): `_rank_states()` and `_rank_max()`
        from one gather of the decodes' contexts (growing leaves the contexts as they were).
        Up to FEW_DECODES decodes are read one by one from the table's int arrays (the same
        integers; numpy calls cost more than the arithmetic on a few)."""
        t, bs, R = self.ctx.table, self.cfg.block_size, self.R
        flat, nd, nz, idx = self._flat_decodes()
        if not nz:
            return nd, [0] * R, [0] * R
        if len(flat) <= FEW_DECODES:
            state = self._decode_state_few(nd, nz, bs)
            if state is not None:
                return state
        else:
            c = t.computed[flat]
            nb = (c + bs) // bs        # blocks for c + 1 tokens
            nb -= t.blocks[flat]
            np.maximum(nb, 0, out=nb)
            need = [0] * R
            for r, x in zip(nz, np.add.reduceat(nb, idx).tolist()):
                need[r] = x
            if all(x <= p.num_free for x, p in zip(need, self.pools)):  # `_grow_decodes`' fast path
                if any(need):  # (adding zeros changes nothing)
                    for x, p in zip(need, self.pools):
                        p.allocate(x)
                    t.blocks[flat] += nb
                return self._contexts(c, nd, nz, idx)
        # some rank preempts: the general path, then the survivors' contexts
        self._grow_decodes()
        flat, nd, nz, idx = self._flat_decodes()
        if not nz:
            return nd, [0] * R, [0] * R
        return self._contexts(t.computed[flat], nd, nz, idx)

    def _contexts(self, c: np.ndarray, nd: list[int], nz: list[int], idx: list[int]
                  ) -> tuple[list[int], list[int], list[int]]:
        """(nd, Σ context, longest context) per rank from the decodes' tokens in KV `c`."""
        dctx, rmax = [0] * self.R, [0] * self.R
        for r, x, m in zip(nz, np.add.reduceat(c, idx).tolist(),
                           np.maximum.reduceat(c, idx).tolist()):
            dctx[r], rmax[r] = x + nd[r], m + 1
        return nd, dctx, rmax

    def _decode_state_few(self, nd: list[int], nz: list[int], bs: int):
        """`_decode_state`'s fast path in plain ints: each decode's new blocks
        max(0, ⌈(c + 1)/bs⌉ − held), summed per rank, allocated (and added to the decodes'
        blocks) when every rank has room; None (nothing changed) when some rank does not."""
        comp, held = self._comp, self._held
        lists = self._flat[0]          # the decode lists `_flat_decodes` read
        R = self.R
        need, dctx, rmax, grow = [0] * R, [0] * R, [0] * R, []
        for r in nz:
            x = s = m = 0
            for i in lists[r]:
                c = comp[i]
                s += c
                if c > m:
                    m = c
                b = (c + bs) // bs - held[i]
                if b > 0:
                    x += b
                    grow.append((i, b))
            need[r], dctx[r], rmax[r] = x, s + nd[r], m + 1
        pools = self.pools
        for r in nz:
            if need[r] > pools[r].num_free:
                return None
        if grow:
            for r in nz:
                if need[r]:
                    pools[r].allocate(need[r])
            for i, b in grow:
                held[i] += b
        return nd, dctx, rmax

    def _flat_decodes(self) -> tuple[np.ndarray, list[int], list[int], list[int]]:
        """`sp_leap.flat_decodes` of the decode lists (kept while they stay as they were): the
        ids, decodes per rank, the ranks with decodes and where each one's ids start."""
        key, val = self._flat
        if key != self.decodes:
            flat, starts, nd = flat_decodes(self.decodes)
            nz = [r for r, n in enumerate(nd) if n]
            self._flat = ([list(ids) for ids in self.decodes],
                          (flat, nd, nz, [starts[r] for r in nz]))
            val = self._flat[1]
        return val

    def _iteration(self):
        R = self.R
        nd, dctx, rmax = self._decode_state()
        chunks = self._plan(nd, dctx, rmax) if self.pending else []
        if not chunks:
            if not any(nd):
                return None
            # decode-only: `decode_step_s` gives `iteration_s`'s floats (its decode-only
            # branch) from the ranks' cached decode lines
            dt = self.cost.decode_step_s(nd, dctx, rmax)
            dec_ids = self._flat_decodes()[0]  # the decodes, as `_apply` wants them
            self.last_prefill_per_rank = [0] * R
            return dt, lambda: self._apply(dec_ids, (), ())
        n_p = [0] * R
        shard = self._shard   # the counts one by one (memoryviews of the int arrays)
        for ch in chunks:  # commit the plan's KV (the plan checked it against these pools)
            n_p = [a + b for a, b in zip(n_p, ch.per_rank)]
            if ch.shard_new:
                for p in self.pools:
                    p.allocate(ch.shard_new)
                shard[ch.req_id] += ch.shard_new
            if ch.decode_rank >= 0:
                self.pools[ch.decode_rank].allocate(ch.dest_blocks)
                self._held[ch.req_id] = ch.dest_blocks + shard[ch.req_id]
                self._rank_of[ch.req_id] = ch.decode_rank
                self._start_transfer(ch.req_id, ch.decode_rank, ch.context + ch.tokens)
        finishing = [ch for ch in chunks if ch.finishes]
        dt = self._mixed_step_s(
            n_p, nd, dctx, [ch.tokens for ch in chunks], [ch.context for ch in chunks],
            max(nd) + len(finishing), rmax)
        if self.tracker is not None:  # the estimate this dispatch planned against
            self.tracker.add(dt, self._report["estimate"])
        dec_ids = self._flat_decodes()[0]  # the decodes, as `_apply` wants them
        self.last_prefill_per_rank = n_p   # for a trace's per-rank events
        return dt, lambda: self._apply(dec_ids, chunks, finishing)

    def _apply(self, dec_ids: np.ndarray, chunks, finishing) -> None:
        """`SpRanksEngine._apply`, its emit given the decodes' own array when no prompt
        samples its first token (the same ids in the same order; no array of none built and
        joined to them, most iterations), a few decodes' tokens counted one by one."""
        t = self.ctx.table
        if len(dec_ids) <= FEW_DECODES:   # the same additions, one by one
            comp = self._comp
            for i in dec_ids.tolist():
                comp[i] += 1
        else:
            t.computed[dec_ids] += 1
        for ch in chunks:
            self._comp[ch.req_id] += ch.tokens
        if finishing:   # `SpRanksEngine._apply`'s emit with the prompts' first tokens
            fin_ids = np.asarray([ch.req_id for ch in finishing], dtype=np.int64)
            done = t.emit(np.concatenate((dec_ids, fin_ids)), self.clock)
            gone = set(fin_ids.tolist())
            self.pending = [r for r in self.pending if r not in gone]
        else:
            done = t.emit(dec_ids, self.clock)
        if len(done):
            self._finish(done)
        self._sample()

    def _sample(self) -> None:
        """`SpRanksEngine._sample`: the blocks in use as the pools' size less their free
        blocks (the same integer as Σ num_used, with one attribute read a pool)."""
        pools = self.pools
        self.ctx.recorder.sample(self.clock, self.index, sum(map(len, self.decodes)),
                                 len(self.pending),
                                 self._kv_blocks - sum([p.num_free for p in pools]),
                                 self.ctx.table.num_emitted)

    def _finish(self, done: np.ndarray) -> None:
        """`SpRanksEngine._finish`, filtering only the decode lists of the finished requests'
        ranks (a request in `decodes[r]` has rank_of r; one without a rank never decoded)."""
        t, pools, rank_of = self.ctx.table, self.pools, self.rank_of
        touched = set()
        for rid in done.tolist():
            g = rank_of.item(rid)
            if g >= 0:
                pools[g].free(t.blocks.item(rid))
                t.blocks[rid] = 0
                rank_of[rid] = -1
                touched.add(g)
            self._free_shard(rid)  # a prompt that ended at its first token
        if touched:
            gone = set(done.tolist())
            for r in sorted(touched):
                self.decodes[r] = [i for i in self.decodes[r] if i not in gone]

    def _pending_specs(self) -> tuple[list[PendingPrefill], list[bool], list[int]]:
        """The pending prompts as Alg. 1 sees them, whether each decodes after its next token,
        and the shard blocks each holds. A prompt's spec is kept while its tokens in KV and to
        prefill stay as they were (most iterations leave all but the first prompt alone)."""
        t, cache = self.ctx.table, self._specs
        if len(cache) > 2 * len(self.pending) + 64:
            cache.clear()
        ids = self.pending
        ttft = self.cfg.ttft_ms * 1e-3
        if len(ids) <= _FEW:  # plain reads cost less than numpy's gathers for a few prompts
            comp_v, gen, out, shard, ntok = (self._comp, self._gen, self._out, self._shard,
                                             self._ntok)
            comp, rem, needs, held = [], [], [], []
            for i in ids:
                c = comp_v[i]
                comp.append(c)
                rem.append(ntok[i] - c)
                needs.append(gen[i] + 1 < out[i])
                held.append(shard[i])
        else:
            pend = np.asarray(ids, dtype=np.int64)
            comp = t.computed[pend].tolist()
            rem = (t.num_tokens[pend] - t.computed[pend]).tolist()
            needs = (t.generated[pend] + 1 < t.output[pend]).tolist()
            held = self.shard[pend].tolist()
        specs = []
        for i, m, c in zip(ids, rem, comp):
            p = cache.get(i)
            if p is None or p.remaining_tokens != m or p.context_tokens != c:
                a = t.arrival.item(i)
                p = cache[i] = PendingPrefill(int(i), a, a + ttft, m, c)
            specs.append(p)
        return specs, needs, held

    def _plan(self, nd: list[int], dctx: list[int], rmax: list[int]) -> list:
        """Alg. 1's chunks for this iteration (`plan.plan_prefills`) over the pending prompts."""
        cfg = self.cfg
        specs, needs, held = self._pending_specs()
        _, chunks = plan_prefills(
            specs, needs, held, _RankStates(nd, dctx, self.pools, rmax),
            [p.num_free for p in self.pools],
            self.est, cfg.tbt_ms * 1e-3, self.clock, admission=_ADMISSION[cfg.scheduler],
            quantum=cfg.quantum, eta=cfg.eta, headroom=cfg.headroom, block_size=cfg.block_size,
            max_level=cfg.max_tokens_per_rank, margin=self.margin, hints=self._hints,
            decode=(nd, self.est.decode_path(nd, dctx, rmax)),   # dispatch.decode_state's
            report=self._report, place=self.placement, waterfill=cfg.waterfill)
        return chunks


class _RankStates:
    """The ranks' `RankState`s, made when the plan first places a decode (before that it
    reads only how many there are; the pools do not change while it plans)."""

    __slots__ = ("_nd", "_dctx", "_pools", "_rmax")

    def __init__(self, nd: list[int], dctx: list[int], pools: list, rmax: list[int]):
        self._nd, self._dctx, self._pools, self._rmax = nd, dctx, pools, rmax

    def __len__(self) -> int:
        return len(self._nd)

    def columns(self) -> tuple[list[int], list[int], list[int]]:
        """`plan.placement_columns` of these states, read from the lists and pools."""
        pools = self._pools
        return list(self._dctx), [p.num_used for p in pools], [p.num_blocks for p in pools]

    def __iter__(self):
        return (RankState(n, c, p.num_used, p.num_blocks, m)
                for n, c, p, m in zip(self._nd, self._dctx, self._pools, self._rmax))
