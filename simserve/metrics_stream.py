"""Metrics of a run too large to hold: a streaming request table retires finished requests in
chunks (id order); each chunk's per-request rows go to a writer and only what the run summary
needs stays: per-request latencies (a few floats a request) and the distinct ITL gaps with
their counts (a decode batch's requests share one gap, so there are about as many distinct gaps
as iterations). `summary()` equals `summarize` on the whole run (its ITL percentiles exactly;
mean and std to rounding)."""
from __future__ import annotations

import math

from typing import Callable

import numpy as np
import pandas as pd

from simserve.metrics import (KEEP_UP_KEYS, SLO, _derive, _slo_met, request_frame, summarize_derived,
                              weighted_stats)
from simserve.sim.records import RequestRecords

_KEEP = ("finished", "ttft", "e2el", "tpot", "normalized")


class ChunkDigest:
    """What a streamed run keeps of each retired chunk: the per-request latencies the summary
    needs, the distinct ITL gaps with their counts, and the chunk's `request_frame` rows handed
    to `write(frame)` (request ids global). Needs only the chunk, so it can run in another
    process (`simserve.runner.digest_process`)."""

    def __init__(self, slo: SLO | None = None, write: Callable[[pd.DataFrame], None] | None = None,
                 max_distinct_gaps: int = 1 << 22):
        self.slo, self.write = slo, write
        self.max_distinct_gaps = max_distinct_gaps
        self._parts: dict[str, list] = {k: [] for k in (*_KEEP, "met")}
        self._gaps: list[tuple[np.ndarray, np.ndarray]] = []
        self._num_gaps = 0

    def add(self, rec: RequestRecords, start: int) -> None:
        """The requests [start, start + len(rec)) of the run."""
        d = _derive(rec)
        for k in _KEEP:
            self._parts[k].append(d[k])
        met = None
        if self.slo is not None:
            met = _slo_met(rec, self.slo, d["finished"], d)
            self._parts["met"].append(met)
        v, c = np.unique(d["itl"], return_counts=True)
        self._gaps.append((v, c))
        self._num_gaps += len(v)
        if self._num_gaps > self.max_distinct_gaps:
            self._compact()
        if self.write is not None:
            frame = request_frame(rec, self.slo, d, met)
            frame["request_id"] += start
            self.write(frame)

    def _compact(self) -> None:
        v = np.concatenate([g[0] for g in self._gaps])
        c = np.concatenate([g[1] for g in self._gaps])
        u, inv = np.unique(v, return_inverse=True)
        self._gaps = [(u, np.bincount(inv, weights=c).astype(np.int64))]
        self._num_gaps = len(u)

    def close(self) -> None:
        """Nothing to release in-process (a `DigestProcess` stops its child here)."""

    def result(self) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
        """(the kept per-request columns, SLO met, distinct ITL gaps, their counts)."""
        d = {k: np.concatenate(self._parts[k]) if self._parts[k] else np.zeros(0)
             for k in _KEEP}
        d["finished"] = d["finished"].astype(bool)
        met = np.concatenate(self._parts["met"]) if self._parts["met"] else np.zeros(0, bool)
        if self._gaps:
            self._compact()
            v, c = self._gaps[0]
        else:
            v, c = np.zeros(0), np.zeros(0, dtype=np.int64)
        return d, met, v, c


class RecordStream:
    """Attach to a `RequestTable` built with `token_window`; `write(frame)` receives each
    chunk's `request_frame` rows (request ids global), in id order. `digest`: where the chunks
    go instead of an in-process `ChunkDigest(slo, write)` (anything with its `add` and
    `result`, e.g. `simserve.runner.digest_process.DigestProcess`)."""

    def __init__(self, slo: SLO | None = None, write: Callable[[pd.DataFrame], None] | None = None,
                 token_window: int = 1 << 21, chunk: int = 8192, max_distinct_gaps: int = 1 << 22,
                 digest=None):
        self.slo = slo
        self.token_window, self.chunk = token_window, chunk
        self.digest = digest if digest is not None else ChunkDigest(slo, write, max_distinct_gaps)
        self.table = None
        self.num_rows = 0

    def attach(self, table) -> None:
        self.table = table
        table.on_retire = self.retire

    def retire(self, s: int, e: int) -> None:
        t = self.table
        rec = RequestRecords(
            arrival_s=t.arrival[s:e], prompt_tokens=t.prompt[s:e], output_tokens=t.output[s:e],
            first_token_s=t.first_token[s:e], finish_s=t.finish[s:e],
            token_offsets=t.offsets[s:e + 1] - t.offsets[s], token_times_s=t.token_slice(s, e),
            num_preemptions=t.preemptions[s:e], token_on_cpu=t.cpu_slice(s, e),
            scheduled_s=t.scheduled[s:e])
        self.digest.add(rec, s)
        self.num_rows += e - s

    def summary(self) -> dict:
        t = self.table
        d, met, v, c = self.digest.result()
        n = len(d["finished"])
        out = summarize_derived(d, t.prompt[:n], t.output[:n], t.finish[:n], t.arrival[:n],
                                self.slo, met, weighted_stats("itl", v, c))
        # the keep-up reading needs every token time, which a streamed run does not keep:
        # the keys are there (NaN) so streamed and in-memory summaries have the same columns
        out.update({k: math.nan for k in KEEP_UP_KEYS})
        return out
