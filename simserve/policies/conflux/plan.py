"""One ConfluxServe iteration's prefill plan against real per-rank KV pools (Alg. 1).

Same loop as `admission.schedule_iteration`, plus what the engine needs and the pure function
leaves out: each chunk's head-sharded KV (1/R of its blocks on every rank) and, for a chunk that
finishes a prompt, its full KV on the chosen decode rank are checked on the pools before the
chunk is accepted (check, then the engine commits); a prompt whose first token is also its last
needs no decode rank.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from simserve.policies.conflux.admission import ADMISSION, PendingPrefill
from simserve.policies.conflux.dispatch import (RankState, decode_state, dispatch_on,
                                               even_dispatch_on)
from simserve.policies.conflux.estimator import ConfluxEstimator, prefill_work
from simserve.policies.conflux.placement import place_on
from simserve.policies.sp_ranks import blocks_for, shard_blocks


class Chunk(NamedTuple):  # (a tuple: made once per chunk an iteration, in the loop's hot path)
    req_id: int
    tokens: int            # ℓ_i
    context: int           # c_i
    per_rank: tuple        # A_i
    finishes: bool         # the chunk ends the prompt: it samples the first token
    decode_rank: int       # -1: none (unfinished, or the request ends at this token)
    shard_new: int         # shard blocks to add on every rank
    dest_blocks: int       # blocks added on decode_rank to complete the request's full KV


def plan_prefills(pending: Sequence[PendingPrefill], needs_decode: Sequence[bool],
                  held_shard: Sequence[int], ranks: Sequence[RankState], free: Sequence[int],
                  est: ConfluxEstimator, tau: float, now_s: float, *, admission: str,
                  quantum: int, eta: float, headroom: float, block_size: int,
                  max_level: int, margin: float = 0.0, hints: dict | None = None,
                  decode: tuple | None = None, report: dict | None = None,
                  place=place_on, waterfill: bool = True) -> tuple[int, list[Chunk]]:
    """(B0, accepted chunks in scheduling order; B0 None where admission did not need it).
    `needs_decode[k]`: pending[k] decodes after its first (next) token; `held_shard[k]`: shard
    blocks it already holds per rank; `free`: free blocks per rank after this iteration's
    decode growth; `hints`: see `dispatch`; `decode`: `decode_state(est, ranks)` when the
    caller has it (`ranks` is then read only to place a decode); `report`: receives under
    "estimate" the estimator's time of the planned iteration (`est.iteration_time` of the
    chunks: the last accepted dispatch's, `dispatch_on`). Dispatch keeps the estimate within
    τ·(1 − margin); admission counts iterations of τ (Alg. 4). `place`: the decode placement
    rule (`placement.PLACEMENTS`, `place_on`'s signature); `waterfill` False: each chunk is
    split evenly over the ranks (`dispatch.even_dispatch_on`)."""
    R = len(ranks)
    ap = [0] * R
    tau_d = tau * (1.0 - margin)
    # the same for every dispatch of this iteration
    nd, t_d = decode_state(est, ranks) if decode is None else decode
    # B0 orders the prompts only through Moore–Hodgson's drops, and one prompt is in the same
    # place whether admitted or dropped: then (and under FCFS) it is not searched for
    b0 = None
    if len(pending) == 1:  # admitted or dropped, a lone prompt is the whole order
        order = list(pending)
    else:
        if admission == "moore_hodgson":
            b0 = dispatch_on(tau_d, est, nd, t_d, ap, None, quantum, 0, max_level, hints)
        admitted, rejected = ADMISSION[admission](pending, b0 or 0, now_s, tau)
        order = admitted + rejected
        if report is not None and rejected:
            report["rejected"] = report.get("rejected", 0) + len(rejected)
            report.setdefault("rejected_ids", set()).update(p.req_id for p in rejected)
    index = {p.req_id: k for k, p in enumerate(pending)}
    free = list(free)
    cols = None  # the ranks' placement columns with this iteration's placements, once one is made
    work = 0   # Σ prefill work of the chunks placed so far, summed in their order
    out: list[Chunk] = []
    seen = None if report is None else {}
    for p in order:
        # the prompt is its own candidate (a Candidate's two fields, by the same names)
        # after the first chunk, a prompt that gets no token is seen from one estimate
        if waterfill:
            ell, per = dispatch_on(tau_d, est, nd, t_d, ap, p, quantum, work, max_level, hints,
                                   only_if_room=bool(out), report=seen)
        else:
            ell, per = even_dispatch_on(tau_d, est, nd, t_d, ap, p, quantum, work, max_level,
                                        report=seen)
        if ell == 0:
            break  # TBT-safe budget used up
        k = index[p.req_id]
        total = p.context_tokens + ell
        new = max(0, shard_blocks(total, block_size, R) - held_shard[k])
        if min(free) < new:
            break  # its head-sharded KV does not fit on every rank
        finishes = ell == p.remaining_tokens
        g, dest = -1, 0
        if finishes and needs_decode[k]:
            full = blocks_for(total, block_size)
            # the decode rank's own shard blocks become part of the request's KV (aliasing, §7)
            dest = max(0, full - held_shard[k] - new)
            # its held shard is already counted as used on every rank: ask for the rest
            if cols is None:
                cols = placement_columns(ranks)
            ctx, used, total_blocks = cols
            g = place(full - held_shard[k], ctx, used, total_blocks, eta, headroom)
            if g is None or free[g] < new + dest:
                break  # no feasible decode host: drop this chunk and stop (Alg. 1 line 11)
            ctx[g] += total     # what place_decode reads of the rank's tentative RankState
            used[g] += dest
            free[g] -= dest
        free = [f - new for f in free]
        ap = [a + x for a, x in zip(ap, per)]
        work += prefill_work(ell, p.context_tokens)
        out.append(Chunk(p.req_id, ell, p.context_tokens, tuple(per), finishes, g, new, dest))
        if report is not None:
            report["estimate"] = seen["estimate"]
    return b0, out


def placement_columns(ranks: Sequence[RankState]) -> tuple[list[int], list[int], list[int]]:
    """What `placement.place_on` reads of the ranks, as fresh lists the plan updates with its
    placements: Σ decode context, KV blocks in use, pool size. `ranks` may give them itself
    (`columns()`, the engine's: without making a RankState per rank)."""
    columns = getattr(ranks, "columns", None)
    if columns is not None:
        return columns()
    return ([s.decode_ctx_tokens for s in ranks], [s.kv_used_blocks for s in ranks],
            [s.kv_total_blocks for s in ranks])
