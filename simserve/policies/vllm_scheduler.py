"""A vLLM-family policy's decisions: the `Scheduler` a chunked-prefill engine runs.

The engine runtime (`vllm_engine.ChunkedEngine`) owns the SimPy process, pricing, event
leaping, the API front end and the KV / prefix-cache bookkeeping; a scheduler only decides.
Each step the runtime calls `schedule(state)` for the batch and, once the step's tokens are
applied, `on_step_done(state, batch)`; before a decode-only step it asks `leap_bound(state,
room)` for how many such steps the batch stays the same.

`state` is the engine (`EngineState` below says what a scheduler may read and call). A batch
is `(ids, tokens)`: the request ids scheduled and the tokens each computes this step (1 for a
decode), as lists of ints or int64 arrays.

Hooks a variant overrides (each documented on its method):

- `waiting_queue(table)`: the waiting order (default FCFS, a deque);
- `victim(state)`: the running request preempted when KV runs short (default the newest);
- `admits(state, rid, blocks)`: the admission test of the waiting head (default: its blocks
  fit in the free pool; head-of-line blocking: a head that fails stops admission);
- `admission_blocks(state, rid, chunk)`: the KV reserved when `rid` is admitted;
- `schedule_running(state)`: the running requests' tokens this step.

Leaping is safe by default: a subclass that overrides `schedule`, `schedule_running`,
`admit`, `admits` or `on_step_done` has not said how it leaps unless the same class defines
`leap_bound` or sets `leap_checked = True` (the inherited bound holds for its decisions);
otherwise its engine steps one iteration at a time and warns once. `waiting_queue`, `victim`
and `admission_blocks` leave the bound right: a leap ends at every arrival and before KV
runs out, and the bound asks `admission_blocks` itself.
"""
from __future__ import annotations

import warnings
from collections import deque
from typing import Protocol

import numpy as np

from simserve.policies.vllm_leap import new_blocks

LEAP_CAP = 8192  # at most this many decode steps per leap (bounds the temporary arrays)
# decisions whose override needs a `leap_bound` declared with it
DECISIONS = ("schedule", "schedule_running", "admit", "admits", "on_step_done")


class EngineState(Protocol):
    """What a scheduler reads and calls on its engine."""

    running: list            # request ids running, in admission order
    waiting: deque           # request ids waiting, in service order (`waiting_queue`)
    budget: int              # token budget of one step (max_num_batched_tokens)
    max_seqs: int            # most requests running at once (max_num_seqs)
    clock: float             # the engine's time
    num_preemptions: int     # preemptions so far
    table: object            # the request table (`simserve.sim.requests.RequestTable`)
    kv: object               # KV bookkeeping (`vllm_kv.KvBook`): pool, blocks_needed, ...
    intake: object           # arrivals (`vllm_intake.Intake`): unseen, head_seen

    def preempt(self, rid: int) -> None:
        """Preempt running request `rid` by recompute: its KV freed, to the waiting front."""

    def take(self, rid: int) -> None:
        """The waiting head `rid` joins the running batch."""


class ChunkedScheduler:
    """The decisions shared by vLLM's family: admission of waiting requests in queue order
    while the token budget, `max_num_seqs` and the KV pool allow, stopping at the first that
    does not fit (head-of-line blocking); nothing is admitted in a step that preempted."""

    kind = "vllm"
    prefix_caching_default: bool | None = None  # None: vLLM's default for `vllm_version`

    def __init__(self, cfg):
        self.cfg = cfg

    # -- the step ---------------------------------------------------------------------
    def schedule(self, s: EngineState):
        """This step's batch `(ids, tokens)`: the running requests' tokens, then (unless a
        request was preempted) admissions."""
        ids, n, preempted = self.schedule_running(s)
        s.kv.scheduled(ids, n)
        if not preempted:
            ids, n = self.admit(s, ids, n)
        return ids, n

    def on_step_done(self, s: EngineState, batch) -> None:
        """The batch's tokens were computed and sampled (finished requests already left)."""

    def schedule_running(self, s: EngineState):
        """(ids, tokens, preempted) of the running requests this step; grows their KV."""
        raise NotImplementedError(f"{type(self).__name__}.schedule_running")

    # -- hooks --------------------------------------------------------------------------
    def waiting_queue(self, table):
        """The waiting queue: deque operations append, appendleft (a preempted request
        back), popleft, [0], len, iteration in service order. Default FCFS."""
        return deque()

    def victim(self, s: EngineState) -> int:
        """The running request to preempt when KV runs short. Default: the newest."""
        return s.running[-1]

    def admission_blocks(self, s: EngineState, rid: int, chunk: int) -> int:
        """KV blocks to reserve when admitting `rid` with a first chunk of `chunk` tokens.
        Default: the chunk's (incremental allocation, as vLLM)."""
        return s.kv.blocks_needed(rid, s.kv.views[0][rid] + chunk)

    def admits(self, s: EngineState, rid: int, blocks: int) -> bool:
        """Admit waiting head `rid`, which needs `blocks` free blocks? False stops admission
        this step. Default: they fit."""
        return s.kv.pool.can_allocate(blocks)

    # -- admission ----------------------------------------------------------------------
    def admit(self, s: EngineState, ids, n):
        """The batch with waiting requests admitted, in queue order. A request that `admits`
        preempted to make room leaves the batch and gives its tokens back."""
        kv, waiting, unseen = s.kv, s.waiting, s.intake.unseen
        left = s.budget - (sum(n) if type(n) is list else int(n.sum()))
        new_ids, new_n = [], []
        while waiting and left > 0 and len(s.running) < s.max_seqs:
            r = waiting[0]
            if unseen(r):
                break
            k, nb, extra, claim = kv.plan(r, left, self.admission_blocks, s)
            pre = s.num_preemptions
            ok = self.admits(s, r, nb + extra)  # touched free blocks leave the free queue
            if s.num_preemptions != pre:  # freed blocks may hold r's prefix: plan again
                ids, n, left = _without_preempted(s, ids, n, left)
                k, nb, extra, claim = kv.plan(r, left, self.admission_blocks, s)
                ok = ok and kv.pool.can_allocate(nb + extra)
            if not ok:
                break
            kv.admit(r, k, nb, claim)
            s.take(r)
            new_ids.append(r)
            new_n.append(k)
            left -= k
        return appended(ids, n, new_ids, new_n)

    def head_blocks(self, s: EngineState) -> int | None:
        """Free blocks `admit` needs to take the waiting head now, or None if the token
        budget or `max_num_seqs` stops it."""
        num_running = len(s.running)
        left = s.budget - num_running
        if left <= 0 or num_running >= s.max_seqs:
            return None
        _, nb, extra, _ = s.kv.plan(s.waiting[0], left, self.admission_blocks, s)
        return nb + extra

    # -- leaping ------------------------------------------------------------------------
    def leap_bound(self, s: EngineState, room: list) -> tuple[int, int] | None:
        """For how many decode-only steps does the running batch (all decoding; `room`:
        tokens each one's held blocks still fit) stay the same? (most steps, most new
        blocks those steps may take), or None: step once. Here: while the waiting head
        stays blocked. Free blocks only shrink while decoding; with prefix caching the leap
        stops before an allocation could evict one of the head's cached hits (the only way
        its admission could get cheaper). Under async scheduling a head the next step will
        not see (it reached the engine after the step was scheduled) allows one step."""
        free = s.kv.pool.num_free
        if not s.waiting:
            return LEAP_CAP, free
        need = self.head_blocks(s)
        if need is None:
            return LEAP_CAP, free
        if need <= free - new_blocks(room, 1, s.kv.pool.block_size):
            if s.intake.head_seen(s.waiting[0], s.clock):
                return None  # admissible even if every decode takes a new block
            return 1, free  # the next step decodes only
        if s.kv.pc is not None:
            # Allocations evict from the free queue's head. Evicting a shared hit can break
            # the head's hit prefix and leave cached blocks behind it unused, making
            # admission cheaper: stop before that. Evicting a block of its private run
            # loses one hit, which costs a new block or frees a cached one, never more than
            # the block the allocation took: harmless while the head is blocked even with
            # no allocation (need > free), as free blocks only shrink.
            return LEAP_CAP, s.kv.free_ahead(s.waiting[0], need, free)
        return LEAP_CAP, free


def leap_declared(cls: type) -> bool:
    """Does scheduler class `cls` say how it leaps? False when it overrides a decision
    (`DECISIONS`) below the class that defines `leap_bound` or sets `leap_checked`."""
    for c in cls.__mro__:
        if "leap_bound" in c.__dict__ or c.__dict__.get("leap_checked"):
            return True
        if any(name in c.__dict__ for name in DECISIONS):
            return False
    return True


_warned: set = set()


def leaps(scheduler: ChunkedScheduler, wanted: bool) -> bool:
    """Whether an engine running `scheduler` leaps: as configured, unless the scheduler's
    class did not declare its leap (then stepped, with one warning per class)."""
    if not wanted:
        return False
    cls = type(scheduler)
    if leap_declared(cls):
        return True
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(f"scheduler {cls.__qualname__} overrides a decision without defining "
                      "leap_bound: it runs stepped (define leap_bound to declare how it "
                      "leaps)", stacklevel=2)
    return False


def _without_preempted(s: EngineState, ids, n, left: int):
    """The batch less the requests no longer running, the budget `left` with their tokens."""
    running = set(s.running)
    keep = [i for i, r in enumerate(ids) if int(r) in running]
    back = (sum(n) if type(n) is list else int(n.sum())) - sum(int(n[i]) for i in keep)
    return [int(ids[i]) for i in keep], [int(n[i]) for i in keep], left + back


def appended(ids, n, new_ids: list, new_n: list):
    """The batch (ids, tokens: arrays, or lists for a small batch) with the requests
    admitted this step appended."""
    if not new_ids:
        return ids, n
    if type(ids) is list:
        return ids + new_ids, n + new_n
    return (np.concatenate((ids, np.asarray(new_ids, dtype=np.int64))),
            np.concatenate((n, np.asarray(new_n, dtype=np.int64))))
