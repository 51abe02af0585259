"""One NEO scheduling round (policies.md §1.2), committed on the engine's queues and pools:

1. every GPU decode is charged 1 row + 1 token and the blocks it holds after this step;
2. while the budget is overspent or those blocks exceed the GPU pool, the newest GPU decode is
   swapped out to the FRONT of the CPU queue. If the host pool cannot take it (NEO's host
   reserve makes that rare; it has no answer for it) it is preempted by recompute as in vLLM
   (its re-prefill may exceed the token budget, and then runs without other work);
3. otherwise swap in from the front of the CPU queue while the GPU decodes' blocks stay within
   `swap_in_ratio` (0.95) of the pool: the hysteresis keeps 2 and 3 apart;
4. scan the waiting queue FIFO for whole-prompt prefills, GPU-destined while they fit and no
   earlier one went to the CPU, then Prefill-to-CPU (intermediate GPU blocks + host blocks);
5. `mode.decide` builds b0/b1/g and picks the pipeline or the GPU-only batch;
6. the prefills it kept leave the waiting queue.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simserve.policies.neo.mode import Decision, decide

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Round:
    decision: Decision
    gdec: np.ndarray = field(default_factory=lambda: _EMPTY)      # GPU decodes that run
    pref_gpu: np.ndarray = field(default_factory=lambda: _EMPTY)
    pref_cpu: np.ndarray = field(default_factory=lambda: _EMPTY)
    cdec: np.ndarray = field(default_factory=lambda: _EMPTY)      # CPU decodes that run
    swap_out_tokens: int = 0       # KV tokens moved GPU -> host at the start of the round
    swap_in_tokens: int = 0        # KV tokens moved host -> GPU
    gdec_ctx: int = 0              # Σ and max of the GPU decodes' lengths (num_tokens)
    gdec_max: int = 0
    p2c_tokens: int = 0            # Σ prompt tokens of the Prefill-to-CPU prompts ...
    p2c_blocks: int = 0            # ... and their (host = intermediate GPU) blocks
    cpu_queue: int = 0             # CPU decoding queue the mode decision scanned


def _blocks(tokens, bs):
    return -(-tokens // bs)


class RoundPlanner:
    """One round on engine `e`, step by step. State: the budget left (`rows`, `toks`), the GPU
    decodes that run (`run`, their `lens` and the blocks `need`ed after this step, `gpu_need`
    in all), the prefills found (`pg`/`pc`: to the GPU, to the CPU) and the round (`r`)."""

    def __init__(self, e):
        self.e, self.t, self.cfg, self.bs = e, e.ctx.table, e.cfg, e.block_size
        self.G = e.gpu_pool.num_blocks
        self.rows, self.toks = self.cfg.max_batch_size, self.cfg.max_tokens_in_batch
        self.r = Round(None)               # its decision is set by `decide`
        self.recompute: list[int] = []
        self.pg: list[int] = []            # ids of the prefills (to the GPU, to the CPU) ...
        self.pc: list[int] = []
        self.pg_len: list[int] = []        # ... their lengths and KV blocks
        self.pc_len: list[int] = []
        self.pg_blk: list[int] = []
        self.pc_blk: list[int] = []
        self.cpu_need = 0

    def gpu_decodes(self) -> list[int]:
        """1-2: charge every GPU decode, then pick the newest as victims while the budget is
        overspent or their blocks exceed the pool; returns the swap-out victims (plain ints:
        the GPU decodes are few, numpy calls would cost more than the arithmetic)."""
        e, t = self.e, self.t
        ids = e.gpu_q
        self.lens = lens = t.num_tokens[ids].tolist()
        self.need = need = [-(-x // self.bs) for x in lens]   # GPU blocks after this step
        self.gpu_need = sum(need)
        self.rows -= len(ids)
        self.toks -= len(ids)
        keep = len(ids)
        out = []
        host_free = e.host_pool.num_free
        while keep and (self.rows < 0 or self.toks < 0 or self.gpu_need > self.G):
            keep -= 1
            v = ids[keep]
            held = int(t.blocks[v])
            self.rows += 1
            self.toks += 1
            if held <= host_free:
                out.append(v)
                host_free -= held
            else:
                self.recompute.append(v)
            self.gpu_need -= need[keep]
        self.keep = keep
        return out

    def evict(self, out: list[int]) -> None:
        """Swap the victims out (the newest ends up at the front of the CPU queue), or drop
        their KV for a re-prefill when the host cannot take them (vLLM-style)."""
        e, t, r = self.e, self.t, self.r
        for v in out:
            held = int(t.blocks[v])
            e.gpu_pool.free(held)
            e.host_pool.allocate(held)
            e.host_blocks[v] = held
            t.blocks[v] = 0
            r.swap_out_tokens += int(t.computed[v])
            e.cpu_q.appendleft(v)
        for v in self.recompute:
            e.gpu_pool.free(int(t.blocks[v]))
            t.blocks[v] = 0
            t.computed[v] = 0
            t.preemptions[v] += 1
            e.waiting.appendleft(v)
        moved = set(out) | set(self.recompute)
        e.gpu_q = run = [x for x in e.gpu_q if x not in moved]
        self.run = list(run)
        # the kept decodes are a prefix of the queue
        self.lens, self.need = self.lens[:self.keep], self.need[:self.keep]
        e.num_swap_out += len(out)
        e.num_recompute += len(self.recompute)

    def swap_in(self) -> None:
        """3: swap in from the front of the CPU queue while the GPU decodes' blocks stay within
        `swap_in_ratio` of the pool (the hysteresis keeps swap-in and swap-out apart)."""
        e, t, r, bs = self.e, self.t, self.r, self.bs
        self.run = list(e.gpu_q)
        thr_in = round(self.cfg.swap_in_ratio * self.G)
        while e.cpu_q and self.rows >= 1 and self.toks >= 1:
            c = e.cpu_q[0]
            ln = int(t.num_tokens[c])
            blk = -(-ln // bs)
            if self.gpu_need + blk > thr_in:
                break
            e.cpu_q.popleft()
            e.host_pool.free(int(e.host_blocks[c]))
            e.host_blocks[c] = 0
            cc = int(t.computed[c])
            e.gpu_pool.allocate(-(-cc // bs))
            t.blocks[c] = -(-cc // bs)
            r.swap_in_tokens += cc
            e.gpu_q.append(c)
            self.run.append(c)
            self.lens.append(ln)
            self.need.append(blk)
            self.gpu_need += blk
            self.rows -= 1
            self.toks -= 1
            e.num_swap_in += 1

    def prefills(self) -> None:
        """4: whole-prompt prefills, FIFO: GPU-destined while they fit and no earlier one went
        to the CPU, then Prefill-to-CPU (intermediate GPU blocks + host blocks)."""
        e, cfg = self.e, self.cfg
        cpu_thr = e.host_pool.num_blocks - self.G
        self.cpu_need = e.host_pool.num_used
        itm_need = 0
        to_cpu = False
        for w in (e.waiting if not self.recompute else ()):   # as vLLM: none after a recompute
            ln = int(self.t.num_tokens[w])      # the prompt (plus outputs after a recompute)
            blk = -(-ln // self.bs)
            # a re-prefill after a recompute may exceed the token budget: it then runs alone
            alone = (not self.run and not self.pg and not self.pc
                     and self.toks == cfg.max_tokens_in_batch)
            if self.rows < 1 or (self.toks < ln and not alone):
                break
            if cfg.use_cpu and (itm_need + blk > e.itm_pool.num_blocks
                                or self.cpu_need + blk > cpu_thr):
                break
            if not to_cpu and self.gpu_need + blk <= self.G:
                self.pg.append(w)
                self.pg_len.append(ln)
                self.pg_blk.append(blk)
                self.gpu_need += blk
            elif cfg.use_cpu:
                to_cpu = True
                self.pc.append(w)
                self.pc_len.append(ln)
                self.pc_blk.append(blk)
                itm_need += blk
                self.cpu_need += blk
            else:
                break
            self.rows -= 1
            self.toks -= ln

    def decide(self) -> Decision:
        """5: the mode decision over the CPU queue (CPU decodes need a host block at block
        boundaries; which ones matters only if the host may run out of them)."""
        e, t, cfg, bs = self.e, self.t, self.cfg, self.bs
        if not cfg.use_cpu:
            cq, clen = _EMPTY, _EMPTY
        else:
            cq = e.cpu_q.ids()
            clen = t.num_tokens[cq]
        self.r.cpu_queue = len(cq)
        host_free = e.host_pool.num_blocks - self.cpu_need
        grow = None if host_free >= len(cq) else \
            (_blocks(clen, bs) > e.host_blocks[cq]).astype(np.int64)
        d = self.r.decision = decide(
            e.pred, self.pg_len, self.pc_len, len(self.run), sum(self.lens), cq, clen, grow,
            self.rows, self.toks, host_free, cfg.linr_s_threshold, max(self.lens, default=0),
            cfg.gpu_gating)
        return d

    def commit(self, d: Decision) -> None:
        """6: the kept prefills leave the waiting queue; every decode that runs grows."""
        e, t, r, bs = self.e, self.t, self.r, self.bs
        npg, npc = d.num_pref_gpu, d.num_pref_cpu
        for _ in range(npg + npc):
            e.waiting.popleft()
        # (plain ints: the prefills are few; their blocks were counted in the scan)
        r.pref_gpu = np.asarray(self.pg[:npg], dtype=np.int64)
        r.pref_cpu = np.asarray(self.pc[:npc], dtype=np.int64)
        if npg:
            nb = self.pg_blk[:npg]
            e.gpu_pool.allocate(sum(nb))
            t.blocks[r.pref_gpu] = nb
        if npc:
            nb = self.pc_blk[:npc]
            r.p2c_blocks, r.p2c_tokens = sum(nb), sum(self.pc_len[:npc])
            e.host_pool.allocate(r.p2c_blocks)
            e.host_blocks[r.pref_cpu] = nb
            e.itm_pool.allocate(r.p2c_blocks)
        # every running GPU decode holds `need` blocks after this step (the same as adding
        # need - held to each, and allocating their sum)
        r.gdec = run = np.asarray(self.run, dtype=np.int64)
        r.gdec_ctx, r.gdec_max = sum(self.lens), max(self.lens, default=0)
        if len(self.need):
            e.gpu_pool.allocate(sum(self.need) - sum(t.blocks[run].tolist()))
            t.blocks[run] = self.need
        if d.mode == "pipe":
            r.cdec = np.asarray(d.cdec[0] + d.cdec[1], dtype=np.int64)
            grow_c = _blocks(t.num_tokens[r.cdec], bs) - e.host_blocks[r.cdec]
            e.host_pool.allocate(int(grow_c.sum()))
            e.host_blocks[r.cdec] += grow_c


def next_round(e) -> Round:
    """Decide and commit one round on engine `e` (queues, GPU/host/intermediate pools)."""
    p = RoundPlanner(e)
    out = p.gpu_decodes()
    if out or p.recompute:
        p.evict(out)
    else:
        p.swap_in()
    p.prefills()
    d = p.decide()
    if d.mode != "none":
        p.commit(d)
    return p.r
