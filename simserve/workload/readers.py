"""Trace readers: Azure LLM Inference 2023 CSV, Mooncake FAST'25 JSONL, plain CSV.

Parsing is vectorised (pandas / one `json.loads` call); per-row Python runs only to find the
first bad line once a vectorised check has failed. Blank lines are skipped, but every error
names the file and the 1-based line number of the offending row.

Output lengths of 0 are kept as read, counted in `meta["num_zero_output"]`, with the first such
row's line in `meta["first_zero_output_line"]` and every such row (`zero_output_rows`, 0-based)
with its line (`zero_output_lines`): a run refuses those among the requests it selects, naming
the first one's line, unless the workload says `zero_output: one`
(`workload.transform.zero_outputs`). Prompt lengths of 0 and negative lengths are errors.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simserve.errors import TraceFormatError
from simserve.workload.spec import Workload

if TYPE_CHECKING:
    import pandas as pd

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake FAST'25 README: hash_ids cover 512-token blocks

_INT_RE = r"[+-]?\d{1,18}"  # cells are already stripped; 18 digits fit in int64


class _Rows:
    """Collects row-level problems; raises the one on the earliest line."""

    def __init__(self, path: Path, lines: np.ndarray) -> None:
        self.path, self.lines, self.first = path, lines, None

    def flag(self, bad: np.ndarray, why) -> None:
        """`bad` is a boolean mask over rows; `why(i)` explains row i."""
        idx = np.flatnonzero(bad)
        if idx.size and (self.first is None or idx[0] < self.first[0]):
            self.first = (int(idx[0]), why)

    def raise_first(self) -> None:
        if self.first is not None:
            i, why = self.first
            raise TraceFormatError(f"{self.path}:{int(self.lines[i])}: {why(i)}")


def _read_csv_strings(path: Path, columns: tuple[str, ...],
                      extra: bool = False) -> tuple[pd.DataFrame, np.ndarray]:
    """All cells as stripped strings, blank lines dropped; also each row's file line number.
    Only `columns` are kept, unless `extra`: then every column (`columns` first)."""
    import pandas as pd  # here, not at import: a cached trace needs no pandas (parsed_cache)
    try:
        df = pd.read_csv(path, dtype=str, na_filter=False, skip_blank_lines=False,
                         encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise TraceFormatError(f"{path}:1: empty file, expected header {','.join(columns)}")
    except pd.errors.ParserError as exc:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        if m:
            raise TraceFormatError(
                f"{path}:{m.group(2)}: expected {m.group(1)} fields, found {m.group(3)}") from None
        raise TraceFormatError(f"{path}: not a readable CSV file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}: not a UTF-8 text file ({exc})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceFormatError(
            f"{path}:1: header lacks column(s) {', '.join(missing)}; expected "
            f"{','.join(columns)}, found {','.join(df.columns)}")
    keep = list(columns) + ([c for c in df.columns if c not in columns] if extra else [])
    df = df.loc[:, keep].apply(lambda s: s.str.strip())
    blank = (df == "").all(axis=1).to_numpy()
    lines = np.flatnonzero(~blank) + 2  # header is line 1
    df = df.loc[~blank].reset_index(drop=True)
    if len(df) == 0:
        raise TraceFormatError(f"{path}: no requests after the header")
    return df, lines


def _token_column(df: pd.DataFrame, col: str, rows: _Rows) -> np.ndarray:
    """A strict integer column, >= 0 (callers decide what 0 means)."""
    import pandas as pd
    s = df[col]
    empty = (s == "").to_numpy()
    rows.flag(empty, lambda i: f"missing field {col}")
    is_int = s.str.fullmatch(_INT_RE).to_numpy(dtype=bool) | empty
    rows.flag(~is_int, lambda i: f"{col}: expected an integer, got {s.iloc[i]!r}")
    vals = pd.to_numeric(s.where(is_int & ~empty, "1")).to_numpy(dtype=np.int64)
    rows.flag(vals < 0, lambda i: f"{col}: negative token count {vals[i]}")
    return vals


def _check_arrivals(t: np.ndarray, rows: _Rows, what: str) -> None:
    """Arrival times must be finite and non-decreasing."""
    bad = ~np.isfinite(t)
    rows.flag(bad, lambda i: f"{what}: not a finite number")
    back = np.zeros(len(t), dtype=bool)
    back[1:] = t[1:] < t[:-1]
    rows.flag(back, lambda i: f"{what} goes backwards: earlier than the previous row "
                              f"(line {int(rows.lines[i - 1])})")


def _finish(path: Path, fmt: str, arrival_s, prompt, output, rows: _Rows, **meta) -> Workload:
    """Shared last checks: prompt >= 1; outputs of 0 kept, counted, the first one's line kept."""
    rows.flag(prompt == 0, lambda i: "prompt length of 0 tokens")
    rows.raise_first()
    zero_out = np.flatnonzero(output == 0)
    meta = {"source": str(path), "format": fmt, "num_zero_output": int(zero_out.size),
            **({"first_zero_output_line": int(rows.lines[zero_out[0]]),
                "zero_output_rows": zero_out.tolist(),
                "zero_output_lines": rows.lines[zero_out].tolist()} if zero_out.size
               else {}), **meta}
    output = np.asarray(output, dtype=np.int64)
    return Workload(np.asarray(arrival_s, dtype=np.float64), prompt.astype(np.int64), output,
                    name=path.stem, meta=meta)


def read_azure_csv(path) -> Workload:
    """Azure LLM Inference Trace 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`).

    Arrivals are seconds after the first row's timestamp; `meta["start_time"]` keeps it.
    """
    import pandas as pd
    path = Path(path)
    df, lines = _read_csv_strings(path, AZURE_COLUMNS)
    rows = _Rows(path, lines)
    ts_text = df["TIMESTAMP"]
    rows.flag((ts_text == "").to_numpy(), lambda i: "missing field TIMESTAMP")
    # utc=True: naive stamps (Azure's) are taken as UTC; explicit offsets are converted
    ts = pd.to_datetime(ts_text, format="ISO8601", errors="coerce", utc=True)
    nat = ts.isna().to_numpy() & (ts_text != "").to_numpy()
    rows.flag(nat, lambda i: f"TIMESTAMP: cannot parse {ts_text.iloc[i]!r}")
    prompt = _token_column(df, "ContextTokens", rows)
    output = _token_column(df, "GeneratedTokens", rows)
    rows.raise_first()  # timestamps must parse before "backwards" means anything
    ns = ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arrival = (ns - ns[0]) / 1e9  # subtract as integers: float64 of epoch-ns loses ~0.1 us
    _check_arrivals(arrival, rows, "TIMESTAMP")
    return _finish(path, "azure-csv", arrival, prompt, output, rows,
                   start_time=ts.iloc[0].tz_localize(None).isoformat(sep=" "))


def read_plain_csv(path) -> Workload:
    """Plain CSV with header `arrival_s,prompt_tokens,output_tokens`; further columns whose
    every cell is a number (e.g. `priority`) become per-request attributes (`Workload.attrs`),
    others are ignored.

    Arrivals are kept as written (seconds, >= 0, non-decreasing).
    """
    import pandas as pd
    path = Path(path)
    df, lines = _read_csv_strings(path, PLAIN_COLUMNS, extra=True)
    rows = _Rows(path, lines)
    a_text = df["arrival_s"]
    rows.flag((a_text == "").to_numpy(), lambda i: "missing field arrival_s")
    arrival = pd.to_numeric(a_text, errors="coerce").to_numpy(dtype=np.float64)
    bad_num = np.isnan(arrival) & (a_text != "").to_numpy()
    rows.flag(bad_num, lambda i: f"arrival_s: expected a number, got {a_text.iloc[i]!r}")
    rows.flag(arrival < 0, lambda i: f"arrival_s: negative time {arrival[i]}")
    prompt = _token_column(df, "prompt_tokens", rows)
    output = _token_column(df, "output_tokens", rows)
    rows.raise_first()
    _check_arrivals(arrival, rows, "arrival_s")
    w = _finish(path, "plain-csv", arrival, prompt, output, rows)
    attrs = _numeric_columns(df, [c for c in df.columns if c not in PLAIN_COLUMNS])
    return dataclasses.replace(w, attrs=attrs) if attrs else w


def _numeric_columns(df: pd.DataFrame, names: list[str]) -> dict:
    """The columns among `names` whose every cell is a number, as int64 (all integers) or
    float64 arrays: a trace's extra per-request attributes. Other columns are left out."""
    out = {}
    for c in names:
        s = df[c]
        if s.str.fullmatch(_INT_RE).all():
            out[c] = s.astype(np.int64).to_numpy()
            continue
        try:
            out[c] = s.astype(np.float64).to_numpy()
        except ValueError:
            continue
    return out


def _jsonl_lines(path: Path) -> tuple[list[str], np.ndarray]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}: not a UTF-8 text file ({exc})") from None
    raw = text.split("\n")
    keep = [(n, s) for n, s in enumerate(raw, 1) if s.strip()]
    if not keep:
        raise TraceFormatError(f"{path}: no requests (empty file)")
    return [s for _, s in keep], np.fromiter((n for n, _ in keep), dtype=np.int64, count=len(keep))


def _mooncake_row_error(obj) -> str | None:
    """Why one parsed JSONL line is not a request, or None."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for key in MOONCAKE_KEYS:
        if key not in obj:
            return f"missing field {key!r}"
        v = obj[key]
        ok = isinstance(v, int) or (key == "timestamp" and isinstance(v, float))
        if isinstance(v, bool) or not ok:
            kind = "a number" if key == "timestamp" else "an integer"
            return f"{key}: expected {kind}, got {v!r}"
    if "hash_ids" in obj and not isinstance(obj["hash_ids"], list):
        return f"hash_ids: expected a list, got {type(obj['hash_ids']).__name__}"
    return None


def read_mooncake_jsonl(path) -> Workload:
    """Mooncake FAST'25 JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).

    Arrivals are `timestamp / 1000` as written. hash_ids are kept per request
    (`Workload.hash_ids`, one per 512-token block; prefix caching replays their reuse) and the
    number of distinct ones goes to `meta["num_prefix_blocks"]`.
    """
    path = Path(path)
    texts, lines = _jsonl_lines(path)
    try:
        objs = json.loads("[" + ",".join(texts) + "]")
        if len(objs) != len(texts):  # a line holding "1, 2" would split into two values
            raise ValueError("line count mismatch")
    except ValueError:
        for text, n in zip(texts, lines):
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    f"{path}:{n}: invalid JSON at column {exc.colno}: {exc.msg}") from None
        raise TraceFormatError(f"{path}: more than one JSON value on a line") from None
    for obj, n in zip(objs, lines):
        why = _mooncake_row_error(obj)
        if why:
            raise TraceFormatError(f"{path}:{n}: {why}")
    rows = _Rows(path, lines)
    cols = {k: np.array([o[k] for o in objs]) for k in MOONCAKE_KEYS}
    prompt, output = cols["input_length"], cols["output_length"]
    for key, vals in (("input_length", prompt), ("output_length", output)):
        rows.flag(vals < 0, lambda i, k=key, v=vals: f"{k}: negative token count {v[i]}")
    arrival = cols["timestamp"].astype(np.float64) / 1000.0
    rows.flag(arrival < 0, lambda i: f"timestamp: negative time {cols['timestamp'][i]}")
    rows.raise_first()
    _check_arrivals(arrival, rows, "timestamp")
    hashed = [o["hash_ids"] for o in objs if "hash_ids" in o]
    meta = {}
    hash_ids = None
    if hashed:
        lists = [o.get("hash_ids", []) for o in objs]
        every = list(itertools.chain.from_iterable(lists))
        flat = np.array(every)
        if flat.size and flat.dtype.kind not in "iu":
            bad = next(n for h, n in zip(lists, lines)
                       if any(isinstance(x, bool) or not isinstance(x, int) for x in h))
            raise TraceFormatError(f"{path}:{bad}: hash_ids: expected integers")
        hash_ids = tuple(lists)  # the parsed lists themselves: no per-row copies
        meta = {"num_prefix_blocks": len(set(every)),
                "prefix_block_tokens": MOONCAKE_BLOCK_TOKENS}
    w = _finish(path, "mooncake-jsonl", arrival, prompt, output, rows, **meta)
    if hash_ids is not None:
        w = dataclasses.replace(w, hash_ids=hash_ids, hash_block_tokens=MOONCAKE_BLOCK_TOKENS)
    attrs = _numeric_keys(objs)
    return dataclasses.replace(w, attrs=attrs) if attrs else w


def _numeric_keys(objs: list[dict]) -> dict:
    """Keys beyond Mooncake's that every row has as a number (e.g. `priority`): per-request
    attributes, int64 when all are integers, else float64. Other keys are left out."""
    out = {}
    for k in sorted(set(objs[0]) - set(MOONCAKE_KEYS) - {"hash_ids"}):
        vals = [o.get(k) for o in objs]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            continue
        ints = all(isinstance(v, int) and -2**63 <= v < 2**63 for v in vals)
        out[k] = np.array(vals, dtype=np.int64 if ints else np.float64)
    return out


def read_trace(path) -> Workload:
    """Pick the reader from the file's content: a JSON object per line, or the CSV header."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such file")
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        first = next((ln for ln in f if ln.strip()), "").strip()
    if first.startswith("{") or (not first and path.suffix in (".jsonl", ".json")):
        return read_mooncake_jsonl(path)
    header = [c.strip() for c in first.split(",")]
    if all(c in header for c in AZURE_COLUMNS):
        return read_azure_csv(path)
    if all(c in header for c in PLAIN_COLUMNS):
        return read_plain_csv(path)
    raise TraceFormatError(
        f"{path}:1: unknown trace format; expected JSON lines (Mooncake) or a CSV header "
        f"{','.join(AZURE_COLUMNS)} (Azure) or {','.join(PLAIN_COLUMNS)} (plain)")
