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


def _blocks(tokens, bs):
    return -(-tokens // bs)


def next_round(e) -> Round:
    """Decide and commit one round on engine `e` (queues, GPU/host/intermediate pools)."""
    t, cfg, bs = e.ctx.table, e.cfg, e.block_size
    G = e.gpu_pool.num_blocks
    rows, toks = cfg.max_batch_size, cfg.max_tokens_in_batch
    # 1-2: GPU decodes, then swap-out of the newest under budget or KV pressure
    # (plain ints: the GPU decodes are few, numpy calls would cost more than the arithmetic)
    ids = e.gpu_q
    ntok = t.num_tokens
    lens = ntok[ids].tolist()
    need = [-(-x // bs) for x in lens]     # GPU blocks each decode holds after this step
    gpu_need = sum(need)
    rows -= len(ids)
    toks -= len(ids)
    keep = len(ids)
    out, recompute = [], []
    host_free = e.host_pool.num_free
    while keep and (rows < 0 or toks < 0 or gpu_need > G):
        keep -= 1
        v = ids[keep]
        held = int(t.blocks[v])
        rows += 1
        toks += 1
        if held <= host_free:
            out.append(v)
            host_free -= held
            gpu_need -= need[keep]
        else:
            recompute.append(v)
            gpu_need -= need[keep]
    r = Round(None)                    # its decision is set below
    for v in out:                      # the newest ends up at the front
        held = int(t.blocks[v])
        e.gpu_pool.free(held)
        e.host_pool.allocate(held)
        e.host_blocks[v] = held
        t.blocks[v] = 0
        r.swap_out_tokens += int(t.computed[v])
        e.cpu_q.appendleft(v)
    for v in recompute:                # vLLM-style: all KV dropped, re-prefilled later
        e.gpu_pool.free(int(t.blocks[v]))
        t.blocks[v] = 0
        t.computed[v] = 0
        t.preemptions[v] += 1
        e.waiting.appendleft(v)
    if out or recompute:
        moved = set(out) | set(recompute)
        e.gpu_q = run = [x for x in e.gpu_q if x not in moved]
        run = list(run)
        lens, need = lens[:keep], need[:keep]   # the kept decodes are a prefix of the queue
        e.num_swap_out += len(out)
        e.num_recompute += len(recompute)
    else:
        run = list(e.gpu_q)
        # 3: swap-in with hysteresis
        thr_in = round(cfg.swap_in_ratio * G)
        while e.cpu_q and rows >= 1 and toks >= 1:
            c = e.cpu_q[0]
            ln = int(ntok[c])
            blk = -(-ln // bs)
            if gpu_need + blk > thr_in:
                break
            e.cpu_q.popleft()
            e.host_pool.free(int(e.host_blocks[c]))
            e.host_blocks[c] = 0
            cc = int(t.computed[c])
            e.gpu_pool.allocate(-(-cc // bs))
            t.blocks[c] = -(-cc // bs)
            r.swap_in_tokens += cc
            e.gpu_q.append(c)
            run.append(c)
            lens.append(ln)
            need.append(blk)
            gpu_need += blk
            rows -= 1
            toks -= 1
            e.num_swap_in += 1
    # 4: prefills, FIFO, whole prompts
    cpu_thr = e.host_pool.num_blocks - G
    cpu_need = e.host_pool.num_used
    itm_need = 0
    to_cpu = False
    pg, pc = [], []                   # ids of the prefills (to the GPU, to the CPU) ...
    pg_len, pc_len, pg_blk, pc_blk = [], [], [], []   # ... their lengths and KV blocks
    for w in (e.waiting if not recompute else ()):   # as vLLM: no admission after a recompute
        ln = int(ntok[w])                 # the prompt (plus outputs after a recompute)
        blk = -(-ln // bs)
        # a re-prefill after a recompute may exceed the token budget: it then runs alone
        alone = not run and not pg and not pc and toks == cfg.max_tokens_in_batch
        if rows < 1 or (toks < ln and not alone):
            break
        if cfg.use_cpu and (itm_need + blk > e.itm_pool.num_blocks or cpu_need + blk > cpu_thr):
            break
        if not to_cpu and gpu_need + blk <= G:
            pg.append(w)
            pg_len.append(ln)
            pg_blk.append(blk)
            gpu_need += blk
        elif cfg.use_cpu:
            to_cpu = True
            pc.append(w)
            pc_len.append(ln)
            pc_blk.append(blk)
            itm_need += blk
            cpu_need += blk
        else:
            break
        rows -= 1
        toks -= ln
    # 5: mode decision over the CPU queue (CPU decodes need a host block at block boundaries)
    if not cfg.use_cpu:
        cq, clen = _EMPTY, _EMPTY
    else:
        cq = e.cpu_q.ids()
        clen = t.num_tokens[cq]
    host_free = e.host_pool.num_blocks - cpu_need
    # which candidates need a new host block matters only if the host may run out of them
    grow = None if host_free >= len(cq) else \
        (_blocks(clen, bs) > e.host_blocks[cq]).astype(np.int64)
    d = decide(e.pred, pg_len, pc_len, len(run), sum(lens), cq, clen, grow, rows, toks,
               host_free, cfg.linr_s_threshold, max(lens, default=0))
    r.decision = d
    # 6: commit the kept prefills and the growth of every decode that runs
    if d.mode == "none":
        return r
    npg, npc = d.num_pref_gpu, d.num_pref_cpu
    for _ in range(npg + npc):
        e.waiting.popleft()
    # (plain ints: the prefills are few; their blocks were counted in the scan)
    r.pref_gpu = np.asarray(pg[:npg], dtype=np.int64)
    r.pref_cpu = np.asarray(pc[:npc], dtype=np.int64)
    if npg:
        nb = pg_blk[:npg]
        e.gpu_pool.allocate(sum(nb))
        t.blocks[r.pref_gpu] = nb
    if npc:
        nb = pc_blk[:npc]
        r.p2c_blocks, r.p2c_tokens = sum(nb), sum(pc_len[:npc])
        e.host_pool.allocate(r.p2c_blocks)
        e.host_blocks[r.pref_cpu] = nb
        e.itm_pool.allocate(r.p2c_blocks)
    # every running GPU decode holds `need` blocks after this step (the same as adding
    # need - held to each, and allocating their sum)
    r.gdec = run = np.asarray(run, dtype=np.int64)
    r.gdec_ctx, r.gdec_max = sum(lens), max(lens, default=0)
    if len(need):
        e.gpu_pool.allocate(sum(need) - sum(t.blocks[run].tolist()))
        t.blocks[run] = need
    if d.mode == "pipe":
        r.cdec = np.asarray(d.cdec[0] + d.cdec[1], dtype=np.int64)
        grow_c = _blocks(t.num_tokens[r.cdec], bs) - e.host_blocks[r.cdec]
        e.host_pool.allocate(int(grow_c.sum()))
        e.host_blocks[r.cdec] += grow_c
    return r
