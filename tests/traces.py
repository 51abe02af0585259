"""The public traces some tests read are not shipped with simserve (`simserve traces fetch
NAME` downloads one; a checkout also finds `../shared/traces`). A test that needs one skips,
saying which, when it is not found; `SIMSERVE_TRACE_DIR` at an empty folder hides them all."""
from __future__ import annotations

from pathlib import Path

import pytest

from simserve.errors import SimserveError


def find_trace(name: str) -> Path | None:
    """The file of a manifest trace name (or a bare trace file name), or None."""
    from simserve.workload.manifest import resolve_trace
    try:
        return resolve_trace(name)
    except SimserveError:
        return None


def _reason(name: str) -> str:
    return (f"trace {name!r} not found (`simserve traces fetch {name}`, or point "
            f"SIMSERVE_TRACE_DIR at a folder holding it)")


def needs_trace(*names: str):
    """Mark a test `traces` (CI runs those again with the traces hidden) and skip it unless
    every named trace is found. A test that calls `trace_or_skip` carries the mark itself."""
    missing = [n for n in names if find_trace(n) is None]
    skip = pytest.mark.skipif(bool(missing), reason=_reason(missing[0]) if missing else "")

    def mark(fn):
        return pytest.mark.traces(skip(fn))
    return mark


def trace_or_skip(name: str) -> Path:
    """Inside a test: the trace's file, or skip the test."""
    path = find_trace(name)
    if path is None:
        pytest.skip(_reason(name))
    return path
