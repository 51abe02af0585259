"""DualPace's host KV safety envelope (Eq. 2–4, policies.md §8.2) and the FIFO prefill
placement of App. A.1 step 5, as pure functions over block counts.

    B_used + B_planned + B_growth + B_migration ≤ B_capacity_CPU                    (Eq. 2)
    B_growth    = Σ_{r ∈ CPU running} max(b̂_r − b_r, 0)                              (Eq. 3)
    B_migration = the b̂ of the shortest tail of Q_G (scanned from its eviction-priority
                  tail) whose removal makes the rest of Σ_{r∈Q_G} b̂_r fit in HBM       (Eq. 4)

All quantities are KV blocks. The GPU ownership queue Q_G is given in eviction-priority
order: its LAST element is evicted first. A newly admitted Prefill-to-GPU request joins that
tail (the youngest request is the first eviction candidate, as vLLM preempts).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


def growth_blocks(current: Sequence[int], peaks: Sequence[int]) -> int:
    """Eq. 3: the remaining KV growth of CPU-running requests, Σ max(b̂_r − b_r, 0)."""
    if len(current) != len(peaks):
        raise ValueError("current and peaks must have one entry per request")
    return int(sum(max(int(p) - int(b), 0) for b, p in zip(current, peaks)))


def migration_tail_len(q_gpu_peaks_in_order: Sequence[int], gpu_capacity: int) -> int:
    """How many requests at the eviction tail of Q_G must be reserved host space (Eq. 4)."""
    rest = sum(q_gpu_peaks_in_order)
    if rest <= gpu_capacity:
        return 0
    k = 0
    for p in reversed(q_gpu_peaks_in_order):
        if rest <= gpu_capacity:
            break
        rest -= int(p)
        k += 1
    return k


def migration_blocks(q_gpu_peaks_in_order: Sequence[int], gpu_capacity: int) -> int:
    """Eq. 4: B_migration. Scan Q_G from its eviction-priority tail, moving each b̂ into
    B_migration until the remaining finish peaks fit in HBM (0 if they already fit)."""
    k = migration_tail_len(q_gpu_peaks_in_order, gpu_capacity)
    if k == 0:
        return 0
    return int(sum(int(p) for p in q_gpu_peaks_in_order[len(q_gpu_peaks_in_order) - k:]))


def migration_blocks_of(q_peaks: list[int], total: int, gpu_capacity: int) -> int:
    """`migration_blocks(q_peaks, gpu_capacity)` of a list of ints whose sum `total` the
    caller keeps: the scan from the tail only when they do not all fit."""
    if total <= gpu_capacity:
        return 0
    rest, i = total, len(q_peaks)
    while rest > gpu_capacity:
        i -= 1
        rest -= q_peaks[i]
    return total - rest


def fits(used: int, planned: int, growth: int, migration: int, capacity: int) -> bool:
    """Eq. 2."""
    return used + planned + growth + migration <= capacity


@dataclass(slots=True)
class PrefillPlacement:
    """Outcome of one round of prefill admission. `dest[i]` is "gpu" or "cpu" for the i-th
    candidate; the admitted candidates are exactly the first len(dest)."""

    dest: list[str] = field(default_factory=list)
    gpu_queue_peaks: list[int] = field(default_factory=list)   # Q_G after admission
    gpu_free: int = 0           # HBM blocks left for persistent KV
    planned: int = 0            # B_planned after admission
    growth: int = 0             # B_growth after admission
    migration: int = 0          # B_migration over the new Q_G
    stop: str = "exhausted"     # exhausted | fits_neither | rows | tokens | cpu_limit

    @property
    def num_admitted(self) -> int:
        return len(self.dest)


def admit_prefills(prompt_blocks: Sequence[int], peak_blocks: Sequence[int], *,
                   gpu_queue_peaks: Sequence[int], gpu_free: int, gpu_capacity: int,
                   cpu_used: int, cpu_planned: int, cpu_growth: int, cpu_capacity: int,
                   prompt_tokens: Sequence[int] | None = None, max_rows: int | None = None,
                   max_tokens: int | None = None, max_cpu_admits: int | None = None,
                   reserve_cpu_growth: bool = False,
                   cpu_from: int | None = None) -> PrefillPlacement:
    """App. A.1 step 5: walk the FIFO of prefill candidates.

    Candidate i needs `prompt_blocks[i]` blocks of persistent KV after its prefill and may
    grow to `peak_blocks[i]` (b̂). While no candidate has gone to the CPU:
      - Prefill-to-GPU if its persistent KV fits the free HBM (`gpu_free`, blocks left after
        this round's GPU decodes) AND Eq. 2 still holds with B_migration recomputed over Q_G
        extended by its b̂;
      - otherwise Prefill-to-CPU if Eq. 2 holds with its host blocks added to B_planned
        (and, with `reserve_cpu_growth`, its remaining growth b̂ − b to B_growth, so its
        whole finish peak is reserved; the paper's Eq. 3 counts growth of running requests
        only, hence off by default).
    Once one goes to the CPU every later one must go to the CPU (order preservation). The walk
    stops at the first candidate that fits neither, or at the row limit, the batched-token
    limit (a soft cap: the first prompt is always allowed, policies.md §10) or the host
    decode-admission limit `max_cpu_admits` (0: no Prefill-to-CPU). `cpu_from`: candidates
    from this index on may not go to the GPU (a placement rule that sends them to the CPU)."""
    if len(prompt_blocks) != len(peak_blocks):
        raise ValueError("prompt_blocks and peak_blocks must have one entry per candidate")
    out = PrefillPlacement(gpu_queue_peaks=list(map(int, gpu_queue_peaks)),
                           gpu_free=int(gpu_free), planned=int(cpu_planned),
                           growth=int(cpu_growth))
    q_sum = sum(out.gpu_queue_peaks)        # Σ b̂ over Q_G, kept as it grows
    out.migration = migration_blocks_of(out.gpu_queue_peaks, q_sum, gpu_capacity)
    tokens = 0
    num_cpu = 0
    for i, (blk, peak) in enumerate(zip(prompt_blocks, peak_blocks)):
        blk, peak = int(blk), int(peak)
        if max_rows is not None and i >= max_rows:
            out.stop = "rows"
            return out
        if prompt_tokens is not None and max_tokens is not None and i > 0 \
                and tokens + int(prompt_tokens[i]) > max_tokens:
            out.stop = "tokens"
            return out
        placed = False
        if num_cpu == 0 and blk <= out.gpu_free and (cpu_from is None or i < cpu_from):
            out.gpu_queue_peaks.append(peak)          # Q_G with it (taken back if not)
            mig = migration_blocks_of(out.gpu_queue_peaks, q_sum + peak, gpu_capacity)
            if not fits(cpu_used, out.planned, out.growth, mig, cpu_capacity):
                out.gpu_queue_peaks.pop()
            else:
                q_sum += peak
                out.gpu_free -= blk
                out.migration = mig
                out.dest.append("gpu")
                placed = True
        if not placed:
            if max_cpu_admits is not None and num_cpu >= max_cpu_admits:
                out.stop = "cpu_limit"
                return out
            extra = max(peak - blk, 0) if reserve_cpu_growth else 0
            if not fits(cpu_used, out.planned + blk, out.growth + extra, out.migration,
                        cpu_capacity):
                out.stop = "fits_neither"
                return out
            out.planned += blk
            out.growth += extra
            out.dest.append("cpu")
            num_cpu += 1
        if prompt_tokens is not None:
            tokens += int(prompt_tokens[i])
    return out
