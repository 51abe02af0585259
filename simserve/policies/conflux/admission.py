"""TTFT-aware admission (policies.md §7.5; paper Alg. 4, App. G) and the per-iteration
scheduler that combines it with dispatch and placement (Alg. 1).

Admission treats the instance as one machine that processes B0 prefill tokens per iteration
of length τ, so request i can finish by its deadline only if the remaining work of everything
ahead of it in EDF order fits in K_i = floor((d_i − t)/τ) · B0 tokens. Moore–Hodgson keeps the
largest such set: walk in EDF order and, whenever the running total overflows K_i, drop the
admitted job with the most remaining work. Dropped jobs are not discarded; they backfill the
iteration shortest-first after the admitted ones.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Sequence

from simserve.errors import ConfigError
from simserve.policies.conflux.dispatch import (DEFAULT_QUANTUM, Candidate, RankState, dispatch)
from simserve.policies.conflux.estimator import ConfluxEstimator
from simserve.policies.conflux.placement import DEFAULT_ETA, DEFAULT_HEADROOM, place_decode

# (d − t)/τ computed in floats can land a hair below an integer it equals exactly (0.3/0.1)
_FLOOR_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PendingPrefill:
    """A request whose prompt is not fully prefilled yet."""

    req_id: int
    arrival_s: float
    deadline_s: float           # TTFT deadline: arrival + TTFT SLO
    remaining_tokens: int       # m_i
    context_tokens: int = 0     # c_i: prompt tokens already in KV (earlier chunks)

    def __post_init__(self) -> None:
        if self.remaining_tokens < 1:
            raise ConfigError(f"PendingPrefill {self.req_id}: remaining_tokens: expected >= 1, "
                              f"got {self.remaining_tokens!r}")
        if self.context_tokens < 0:
            raise ConfigError(f"PendingPrefill {self.req_id}: context_tokens: expected >= 0, "
                              f"got {self.context_tokens!r}")


def capacity_before(deadline_s: float, now_s: float, tau: float, b0: int) -> int:
    """K_i: prefill tokens the instance can process before the deadline at B0 per iteration."""
    return max(0, math.floor((deadline_s - now_s) / tau + _FLOOR_EPS) * b0)


def edf_order(pending: Sequence[PendingPrefill]) -> list[PendingPrefill]:
    return sorted(pending, key=lambda p: (p.deadline_s, p.arrival_s, p.req_id))


def sjf_order(pending: Sequence[PendingPrefill]) -> list[PendingPrefill]:
    return sorted(pending, key=lambda p: (p.remaining_tokens, p.deadline_s, p.req_id))


def moore_hodgson(pending: Sequence[PendingPrefill], b0: int, now_s: float, tau: float
                  ) -> tuple[list[PendingPrefill], list[PendingPrefill]]:
    """Alg. 4: (admitted in EDF order, rejected in SJF order). O(R log R)."""
    if tau <= 0:
        raise ConfigError(f"moore_hodgson: tau: expected a positive TBT SLO, got {tau!r}")
    edf = edf_order(pending)
    heap: list[tuple[int, int]] = []      # (−m_i, −EDF position): ties drop the later deadline
    total, dropped = 0, set()
    for pos, p in enumerate(edf):
        total += p.remaining_tokens
        heapq.heappush(heap, (-p.remaining_tokens, -pos))
        if total > capacity_before(p.deadline_s, now_s, tau, b0):
            neg_m, neg_pos = heapq.heappop(heap)
            total += neg_m
            dropped.add(-neg_pos)
    admitted = [p for pos, p in enumerate(edf) if pos not in dropped]
    return admitted, sjf_order([edf[pos] for pos in dropped])


def fcfs(pending: Sequence[PendingPrefill], b0: int = 0, now_s: float = 0.0, tau: float = 1.0
         ) -> tuple[list[PendingPrefill], list[PendingPrefill]]:
    """FCFS variant (the paper's FCFS ablation): everything admitted, in arrival order."""
    return sorted(pending, key=lambda p: (p.arrival_s, p.req_id)), []


ADMISSION = {"moore_hodgson": moore_hodgson, "fcfs": fcfs}


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    req_id: int
    tokens: int                     # ℓ_i
    context_tokens: int             # c_i
    per_rank: tuple[int, ...]       # A_i
    finishes: bool                  # ℓ_i == m_i: decode placement reserved


@dataclass(frozen=True, slots=True)
class IterationPlan:
    b0: int                                      # reference budget used by admission
    chunks: tuple[ChunkPlan, ...]
    rank_prefill_tokens: tuple[int, ...]         # Ap after the iteration's chunks
    decode_placements: tuple[tuple[int, int], ...]  # (req_id, rank), in scheduling order
    admitted: tuple[int, ...]                    # req_ids, EDF (or FCFS) order
    rejected: tuple[int, ...]                    # req_ids, SJF order

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.rank_prefill_tokens)


def kv_blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def schedule_iteration(pending: Sequence[PendingPrefill], ranks: Sequence[RankState],
                       est: ConfluxEstimator, tau: float, now_s: float, *,
                       admission: str = "moore_hodgson", quantum: int = DEFAULT_QUANTUM,
                       eta: float = DEFAULT_ETA, headroom: float = DEFAULT_HEADROOM,
                       block_size: int = 16, place=None) -> IterationPlan:
    """Alg. 1: order the pending prefills, then give each a TBT-safe chunk until the budget is
    used up or a finishing chunk finds no decode rank (that chunk is dropped and scheduling
    stops). A finishing request's KV (context + chunk tokens) is reserved on its decode rank in a
    tentative copy of the rank state, so later placements in the same iteration see it; the
    dispatch itself only sees this iteration's decodes. `place`: a placement rule with
    `placement.place_on`'s signature (None: `placement.place_decode`, Alg. 3)."""
    if admission not in ADMISSION:
        raise ConfigError(f"schedule_iteration: admission: expected one of {sorted(ADMISSION)}, "
                          f"got {admission!r}")
    if block_size < 1:
        raise ConfigError(f"schedule_iteration: block_size: expected >= 1, got {block_size!r}")
    n = len(ranks)
    ap = [0] * n
    b0 = dispatch(tau, est, ranks, ap, None, quantum)
    admitted, rejected = ADMISSION[admission](pending, b0, now_s, tau)
    tentative = list(ranks)
    prefills: list[tuple[int, int]] = []
    chunks: list[ChunkPlan] = []
    placements: list[tuple[int, int]] = []
    for p in admitted + rejected:
        ell, per_rank = dispatch(tau, est, ranks, ap, Candidate(p.remaining_tokens, p.context_tokens),
                                 quantum, prefills)
        if ell == 0:
            break
        finishes = ell == p.remaining_tokens
        if finishes:
            total = p.context_tokens + p.remaining_tokens
            need = kv_blocks(total, block_size)
            g = place_decode(need, tentative, eta, headroom) if place is None else place(
                need, [s.decode_ctx_tokens for s in tentative],
                [s.kv_used_blocks for s in tentative], [s.kv_total_blocks for s in tentative],
                eta, headroom)
            if g is None:
                break
            s = tentative[g]
            tentative[g] = replace(s, num_decodes=s.num_decodes + 1,
                                   decode_ctx_tokens=s.decode_ctx_tokens + total,
                                   decode_max_ctx=max(s.decode_max_ctx, total),
                                   kv_used_blocks=s.kv_used_blocks + kv_blocks(total, block_size))
            placements.append((p.req_id, g))
        ap = [a + x for a, x in zip(ap, per_rank)]
        prefills.append((ell, p.context_tokens))
        chunks.append(ChunkPlan(p.req_id, ell, p.context_tokens, per_rank, finishes))
    return IterationPlan(b0, tuple(chunks), tuple(ap), tuple(placements),
                         tuple(p.req_id for p in admitted), tuple(p.req_id for p in rejected))
