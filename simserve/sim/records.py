"""Per-request records a simulation hands to `simserve.metrics`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestRecords:
    """What happened to every request of one run, as arrays indexed by request id.

    Token k (0-based) of request i arrived at token_times_s[token_offsets[i] + k];
    token_offsets has n+1 entries and token_offsets[i+1]-token_offsets[i] == output_tokens[i].
    A request that did not finish has finish_s = NaN and NaN for its missing tokens.
    first_token_s[i] == token_times_s[token_offsets[i]] and finish_s[i] is its last token's time.
    num_preemptions counts recompute/swap preemptions of each request.
    token_on_cpu[j] is True where token j was decoded by a CPU engine (CPU-tier policies);
    None for policies that never decode on the CPU.
    arrival_s is when the request reached the server (the client sent it), which every latency
    counts from; scheduled_s is when the workload scheduled it (None: the same). They differ
    under a closed-loop client (`max_concurrency`), which holds a request until a slot frees.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    token_offsets: np.ndarray
    token_times_s: np.ndarray
    num_preemptions: np.ndarray
    token_on_cpu: np.ndarray | None = None
    scheduled_s: np.ndarray | None = None

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    def token_times(self, i: int) -> np.ndarray:
        return self.token_times_s[self.token_offsets[i]:self.token_offsets[i + 1]]
