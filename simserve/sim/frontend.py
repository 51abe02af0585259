"""A serving engine's front end as one CPU that requests contend for (vLLM's API-server
process: HTTP, tokenisation, output processing, detokenisation and streaming run on one
asyncio event loop).

Work is served first come, first served on a virtual clock: a request's admission work
(`admit`) delays the moment its engine sees it, and each engine step's output work
(`deliver`) delays the moment its tokens reach the client. Both kinds queue behind each other,
so many small requests or many streams slow admissions (the cap on admission rate real
servers show). Work must be submitted in nondecreasing time order, which an engine's own
events are (a leap submits only steps that end before the next arrival).

Costs are fitted functions from the engine's profile (`simserve.cost.host`); the core only
adds them up.
"""
from __future__ import annotations

import numpy as np


class FrontEnd:
    """FIFO virtual clock of one front-end CPU. Costs in µs: admission `in_us + in_per_token_us
    · prompt_tokens`, output `out_us + out_per_output_us · outputs` per engine step. Delays
    that hold no CPU (hand-offs between the HTTP server, the tokenizer's thread, the engine
    core's input queue and back) follow the work: `in_delay_us` before the engine sees a
    request, `out_delay_us` before a client sees a token; they add latency, not load."""

    def __init__(self, in_us: float, in_per_token_us: float, out_us: float,
                 out_per_output_us: float, in_delay_us: float = 0.0, out_delay_us: float = 0.0):
        self.in_s, self.in_tok_s = in_us * 1e-6, in_per_token_us * 1e-6
        self.out_s, self.out_n_s = out_us * 1e-6, out_per_output_us * 1e-6
        self.in_delay_s, self.out_delay_s = in_delay_us * 1e-6, out_delay_us * 1e-6
        self.free_at = 0.0
        self.busy_s = 0.0

    def admit(self, t: float, prompt_tokens: int) -> float:
        """A request arriving at `t`: the time its engine receives it."""
        w = self.in_s + self.in_tok_s * prompt_tokens
        self.free_at = max(t, self.free_at) + w
        self.busy_s += w
        return self.free_at + self.in_delay_s

    def deliver(self, t: float, outputs: int) -> float:
        """One engine step finishing at `t` with `outputs` tokens: when clients receive them."""
        w = self.out_s + self.out_n_s * outputs
        f = self.free_at
        self.free_at = (t if t > f else f) + w
        self.busy_s += w
        return self.free_at + self.out_delay_s

    def deliver_many(self, ends: np.ndarray, outputs: int) -> np.ndarray:
        """`deliver` for consecutive steps ending at `ends` (nondecreasing), `outputs` tokens
        each, with the same float operations as one `deliver` call per step (event leaping
        must give byte-identical results to stepping)."""
        w = self.out_s + self.out_n_s * outputs
        f, d = self.free_at, self.out_delay_s
        out = []
        for e in ends.tolist():
            f = (e if e > f else f) + w
            out.append(f + d)
        self.free_at = f
        self.busy_s += w * len(out)
        return np.asarray(out, dtype=np.float64)
