"""Where a streamed run's per-request rows go: `requests.csv`, appended chunk by chunk (the
header once, before the first point's rows), or nowhere.

Each point gets a digest of its retired chunks (`simserve.metrics_stream.ChunkDigest`: the
latencies its summary needs, and the CSV rows). On a machine with a spare core a large point's
digest runs in a child process (`DigestProcess`), so deriving the latencies and formatting the
rows (about 6 % of a million-request vLLM point) overlap the simulation instead of adding to
it; the rows and the summary are byte for byte the same either way (tests check).
`SIMSERVE_STREAM_PROCESS=0` keeps every digest in-process, `=1` moves every one out.
"""
from __future__ import annotations

import os
from pathlib import Path

from simserve.runner.csv_chunks import csv_text

# The child's start-up (spawn, imports, first answer) is a fixed cost and the digest it takes
# over a per-request one (benchmarks/bench_scale.py measures both): below ~20,000 requests it
# would cost more than it saves; 100,000 leaves a margin.
PROCESS_MIN_REQUESTS = 100_000


def label_frame(frame, label: tuple):
    """The point's (policy, request_rate, seed) as the rows' first columns."""
    policy, rate, seed = label
    frame.insert(0, "seed", seed)
    frame.insert(0, "request_rate", rate)
    frame.insert(0, "policy", policy)
    return frame


class CsvAppender:
    """`write(frame)`: the chunk's rows, labelled, appended to `path` (the header first when
    `header` and nothing was written yet)."""

    def __init__(self, path: str | Path, header: bool, label: tuple):
        self.path, self.header, self.label = path, header, label

    def __call__(self, frame) -> None:
        text = csv_text(label_frame(frame, self.label), header=self.header)
        with open(self.path, "a", newline="") as f:
            f.write(text)
        self.header = False


def _spare_core() -> bool:
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # not on Linux
        return (os.cpu_count() or 1) >= 2


class RecordSink:
    """The rows of every point of one run: `path` (created empty now) or None (rows dropped;
    only the summaries are kept)."""

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self.header = True
        if self.path is not None:
            self.path.write_text("")

    def use_process(self, num_requests: int) -> bool:
        forced = os.environ.get("SIMSERVE_STREAM_PROCESS", "")
        if forced in ("0", "1"):
            return forced == "1"
        return num_requests >= PROCESS_MIN_REQUESTS and _spare_core()

    def digest(self, slo, label: tuple, num_requests: int):
        """A fresh digest for the next point's chunks (`add`, `result`, `close`)."""
        from simserve.metrics_stream import ChunkDigest
        header, self.header = self.header, False  # every point has rows
        if self.use_process(num_requests):
            from simserve.runner.digest_process import DigestProcess
            try:
                return DigestProcess(slo, self.path, header, label)
            except OSError:  # no child process here: digest in-process
                pass
        write = None if self.path is None else CsvAppender(self.path, header, label)
        return ChunkDigest(slo, write)
