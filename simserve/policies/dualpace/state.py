"""What DualPace's two engines share (App. A: "request ownership, transfer readiness, future
migration intent, and the host KV obligations in Equation 2") and nothing else.

Per-request arrays are indexed by request id: `owner` (GPU, CPU or in migration),
`ready` (transfer readiness), `marked` (deferred swap-in), host blocks held, and the finish
peak b̂ in blocks. GPU blocks live in `RequestTable.blocks`.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from simserve.sim.kv import BlockPool

NONE, GPU, CPU, MIGRATING = 0, 1, 2, 3


class SharedState:
    def __init__(self, env, table, gpu_pool: BlockPool, host_pool: BlockPool):
        self.env, self.table = env, table
        self.gpu_pool, self.host_pool = gpu_pool, host_pool
        n = table.n
        bs = gpu_pool.block_size
        self.owner = np.zeros(n, dtype=np.int8)
        self.ready = np.zeros(n, dtype=bool)
        self.marked = np.zeros(n, dtype=bool)
        self.host_blocks = np.zeros(n, dtype=np.int64)
        # b̂: the KV of prompt + output − 1 tokens (the last sampled token is never cached).
        # Replays set max_tokens to the output length, so this is what a server reserves.
        self.peak = -(-(table.prompt + table.output - 1) // bs)
        self.migration_reserve = 0          # B_migration published by the GPU scheduler
        self.cpu_waiting: deque[int] = deque()
        self.cpu_running: list[int] = []
        self.cpu_batch_limit = 1
        self._cpu_wake = None
        self._ready_events: dict[int, object] = {}
        # (cpu_running, Eq. 3 over it) while neither that list nor its requests' host blocks
        # changed (see `running_growth`)
        self._growth = None
        # ownership log for tests: (t_start, t_end, engine, ids) of every executed batch
        self.log = None

    # -- readiness ----------------------------------------------------------------------
    def ready_event(self, rid: int):
        ev = self._ready_events.get(rid)
        if ev is None:
            ev = self._ready_events[rid] = self.env.event()
        return ev

    def set_ready(self, ids) -> None:
        self.ready[ids] = True
        for rid in np.atleast_1d(ids).tolist():
            ev = self._ready_events.pop(rid, None)
            if ev is not None and not ev.triggered:
                ev.succeed()
        self.poke_cpu()

    # -- the CPU engine's wake-up -------------------------------------------------------
    def cpu_wait_event(self):
        self._cpu_wake = self.env.event()
        return self._cpu_wake

    def poke_cpu(self) -> None:
        if self._cpu_wake is not None and not self._cpu_wake.triggered:
            self._cpu_wake.succeed()

    def host_growth(self, ids) -> int:
        """Eq. 3 over `ids`: Σ max(b̂ − b, 0) of host blocks."""
        if len(ids) == 0:
            return 0
        ids = np.asarray(ids)
        # np.add.reduce: ndarray.sum without its Python wrapper (the same reduction)
        return int(np.add.reduce(np.maximum(self.peak[ids] - self.host_blocks[ids], 0)))

    def running_growth(self) -> int:
        """`host_growth(cpu_running)`, worked out again only after the CPU batch or its host
        blocks changed (the GPU engine reads it each round it admits prompts).

        Every change of the CPU batch assigns a new list (held here, so `is` tells it apart).
        The host blocks of the requests in it are written by the CPU engine alone, in the same
        step as such a change (next-token blocks just after `_select`, a finished request's
        freed just before it leaves the list); the GPU engine and the Prefill-to-CPU copies
        write those of requests not in it (new Prefill-to-CPU and swap-out victims go to the
        waiting queue, swap-ins come from it). Tests check the kept value at every read."""
        g = self._growth
        if g is not None and g[0] is self.cpu_running:
            return g[1]
        v = self.host_growth(self.cpu_running)
        self._growth = (self.cpu_running, v)
        return v

