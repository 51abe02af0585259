"""One NEO round's PCIe traffic in closed form: when the engine wakes, and what each channel
carried, without a SimPy process per transfer.

A round starts its swaps (D2H swap-outs and H2D swap-ins, at once on every rank's link) and,
for a Prefill-to-CPU prompt, one D2H copy per layer as that layer ends; the round waits for all
of them (`NeoEngine._round_events`, the event path). The engine is the channels' only user
and every round waits for its own transfers, so they are idle when a round starts, and each
transfer's times follow from FIFO order: a transfer asked for at t on a channel that is busy
until f is granted at max(t, f) and ends d later. `round_times` does those float operations
in the order the events would (a timeout ends at now + d; a layer copy waits for its layer's
end, then for the previous layer's copies on every rank) and returns the engine's wake time.
"""
from __future__ import annotations

from bisect import bisect_left


def round_times(now: float, start: float, dur: float, head: float, layer: float, L: int,
                swap_out_bytes: float, swap_in_bytes: float, copy_layer_bytes: float,
                d2h: list, h2d: list) -> tuple[float, float, list]:
    """(round end, engine wake time, transfers as (channel, bytes, seconds, end) in each
    channel's order) of a round started at `now` (clock `start`), as `_round_events` times it."""
    books = []
    end = start + dur
    wake = end if end >= now else now              # yield at(env, max(end, now))
    busy = {}                                      # a D2H channel's swap-out end
    if swap_out_bytes or swap_in_bytes:
        done = None
        for chans, nbytes in ((d2h, swap_out_bytes), (h2d, swap_in_bytes)):
            if not nbytes:
                continue
            for ch in chans:
                d = ch.duration_s(nbytes)
                e = now + d
                books.append((ch, nbytes, d, e))
                busy[ch] = e
                done = e if done is None or e > done else done
        if done > wake:                            # done = yield swaps
            wake = done
        x = done + dur - head                      # the first attention waited for the swap
        if x > end:
            end = x
    if copy_layer_bytes:
        first = start + head
        t = now
        for j in range(L):
            due = first + (j + 1) * layer
            if due > t:
                t = due
            last = None
            for ch in d2h:
                d = ch.duration_s(copy_layer_bytes)
                f = busy.get(ch)
                e = (f if f is not None and f > t else t) + d
                books.append((ch, copy_layer_bytes, d, e))
                last = e if last is None or e > last else last
            t = last
        if t > wake:                               # yield copies
            wake = t
        if wake > end:
            end = wake
    if end > wake:
        wake = end
    return end, wake, books


def arrives_at(arrivals: list, lo: int, t: float) -> bool:
    """A request is scheduled to arrive at exactly `t` (`arrivals` sorted, from index `lo`):
    its event and the engine's wake-up would then be ordered by when each was created, which
    the closed form does not mimic."""
    i = bisect_left(arrivals, t, lo)
    return i < len(arrivals) and arrivals[i] == t
