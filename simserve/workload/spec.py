"""The value every workload source produces: requests as arrays (struct of arrays)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests sorted by arrival time.

    arrival_s      float64 seconds from the start of the run (first arrival may be > 0)
    prompt_tokens  int64 >= 1
    output_tokens  int64 >= 1 (tokens the request generates, the first one included)
    name           where it came from (trace name or generator)
    num_capped     how many requests were shortened to fit the model's max context
    num_dropped    how many requests were left out because they do not fit it
    hash_ids       per request, the content hashes of its prompt's blocks of
                   `hash_block_tokens` tokens (Mooncake's `hash_ids`, 512 tokens each; the last
                   block may be partial), as sequences of ints (lists or int arrays; never
                   modified); None when the source has none (Azure,
                   synthetic). Prefix caching derives its KV-block hashes from them.
    max_concurrency  the client's limit on requests in flight (`vllm bench serve
                   --max-concurrency`): a request waits past its arrival time until fewer are
                   in flight; None sends every request at its arrival time (open loop)
    attrs          extra per-request columns of the trace (e.g. `priority`), name -> a numeric
                   array with one entry per request; a policy reads them from the request
                   table (`RequestTable.attrs`)
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    name: str = "workload"
    num_capped: int = 0
    meta: dict = field(default_factory=dict)
    num_dropped: int = 0
    hash_ids: tuple | None = None
    hash_block_tokens: int = 512
    max_concurrency: int | None = None
    attrs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("Workload arrays must have equal lengths")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError("Workload.hash_ids must have one entry per request")
        for k, v in self.attrs.items():
            if len(v) != n:
                raise ValueError(f"Workload.attrs[{k!r}] must have one entry per request")
        m = self.max_concurrency
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer))
                              or m < 1):
            raise ValueError(f"max_concurrency: expected a positive integer or null, got {m!r}")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    def __len__(self) -> int:
        return self.num_requests
