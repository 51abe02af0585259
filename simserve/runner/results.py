"""Reading a results folder back into frames: `simserve.load_results(DIR)`.

A run's folder (`simserve run`) holds summary.json (one record per point) and requests.csv
(one row per request per point, labelled by policy, request_rate and seed). A sweep's folder
(`simserve sweep`) holds summary.json (one record per point, with `point`, `variant` and the
swept keys) and each point's rows in `points/<point>/requests.csv`; those are gathered, each
row labelled with its point's `point`, `variant` and swept-key columns, so one frame can be
grouped by any of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simserve.errors import SimserveError


@dataclass(frozen=True)
class Results:
    """`summary`: one row per point (the records of summary.json); `requests`: one row per
    request of every point (None when the folder has none)."""
    summary: object  # pandas.DataFrame
    requests: object  # pandas.DataFrame | None

    def __iter__(self):  # summary, requests = load_results(DIR)
        return iter((self.summary, self.requests))


def _point_columns(record: dict) -> dict:
    """A sweep record's identifying fields: its point, variant and swept (dotted) keys."""
    return {k: v for k, v in record.items()
            if k in ("point", "variant") or ("." in k and not isinstance(v, (dict, list)))}


def load_results(path: str | Path) -> Results:
    """The summary and per-request frames of a `simserve run` or `simserve sweep` folder."""
    import pandas as pd

    from simserve.capacity import load_records
    folder = Path(path)
    if not folder.is_dir():
        raise SimserveError(f"{folder}: not a results folder (no such folder)")
    records = load_records(folder)
    summary = pd.DataFrame(records)
    if (folder / "requests.csv").is_file():
        return Results(summary, pd.read_csv(folder / "requests.csv"))
    frames = []
    for i, r in enumerate(records):
        if "point" not in r:
            continue
        csv = folder / "points" / str(r["point"]) / "requests.csv"
        if not csv.is_file():
            raise SimserveError(f"{csv}: missing (record {i} of {folder / 'summary.json'} "
                                "names this point); rerun the sweep to complete it")
        rows = pd.read_csv(csv)
        for k, v in reversed(list(_point_columns(r).items())):
            if k not in rows.columns:
                rows.insert(0, k, v)
        frames.append(rows)
    return Results(summary, pd.concat(frames, ignore_index=True) if frames else None)
