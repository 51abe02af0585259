"""A finished prompt's KV move to its decode rank, worked out in closed form.

`SpRanksEngine._start_transfer` starts one SimPy process per (source GPU, decode-rank GPU)
NVLink channel and lands the request when all of them are done (`_land`: `ev.processed`).
Here the same transfers are booked without processes, for the same times:

- a channel is a FIFO server that only this instance's moves use: a transfer asked for at
  `now` on a channel whose last transfer ends at `free` ends at max(now, free) + d (SimPy
  grants a queued request when the last one releases, at `free`, and times it from there;
  an idle channel from `now`), d = `Channel.duration_s`; the move ends with its last channel;
- when it lands, ending at E: at a check at time T > E it has landed. At T == E the
  processes' version lands it only if the engine was woken by a move: the processes finish
  through a chain of events created at E (timeout, release, process end, all_of), so any
  wake-up of the engine created before E (an iteration ending at E) comes first and sees
  it in flight; a wait on the moves (`env.any_of`) resumes after the whole chain, by when
  every move ending at E is done. A `Landing` event is queued at E behind SimPy's NORMAL
  events (so an iteration ending at E is seen first) and records when one fired (so the
  wait's wake-up lands every move ending then).

tests/test_conflux_kv_moves.py checks both against the processes, ties included.
"""
from __future__ import annotations

from heapq import heappush

import simpy

_BEHIND_NORMAL = 2  # SimPy's heap priority: URGENT 0, NORMAL 1; this fires after both


class Landing(simpy.Event):
    """Fires when a move's last transfer ends (`end`, the exact float)."""

    def __init__(self, env: simpy.Environment, end: float, moves: "KvMoves"):
        super().__init__(env)
        self.end = end
        self._ok, self._value = True, None
        self.callbacks.append(moves._fired)
        heappush(env._queue, (end, _BEHIND_NORMAL, next(env._eid), self))


class KvMoves:
    """The closed-form moves of one instance: each channel's end of its last transfer."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.free: dict = {}        # channel -> when its last booked transfer ends
        self.fired_at = None        # when a Landing last fired

    def start(self, channels, nbytes: float) -> Landing:
        """Book `nbytes` on every channel (counted as `Channel.transfer` counts them)."""
        now = self.env.now
        end = now
        for ch in channels:
            d = ch.duration_s(nbytes)
            s = self.free.get(ch, now)
            e = (s if s > now else now) + d
            self.free[ch] = e
            ch.book(nbytes, d, e)
            if e > end:
                end = e
        return Landing(self.env, end, self)

    def _fired(self, ev: Landing) -> None:
        self.fired_at = ev.end

    def landed(self, ev) -> bool:
        """Whether the engine, checking now, sees the move `ev` done (any other event: when
        it has been processed)."""
        if ev.processed:
            return True
        now = self.env.now
        return type(ev) is Landing and ev.end == now and self.fired_at == now
