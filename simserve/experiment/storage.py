"""Results on disk: folders written atomically, run records, resolved configs."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import yaml


@contextmanager
def atomic_folder(dest: Path):
    """Yield a temporary sibling of `dest` to fill; on success it replaces `dest` (so a folder
    that exists is complete), on any error it is removed and `dest` is left as it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / "x")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def strict_json(v):
    """`v` with no bare NaN or Infinity (strict JSON): NaN -> null, ±inf -> "inf" / "-inf"
    (vLLM writes an infinite request_rate as "inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: strict_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [strict_json(x) for x in v]
    return v


def from_strict_json(record: dict) -> dict:
    """Undo `strict_json` on one record in place: null numbers -> NaN, "inf" -> inf."""
    for k, v in record.items():
        if v is None and (k.endswith(("_ms", "_s")) or k in _NUMERIC):
            record[k] = math.nan
        elif v in ("inf", "-inf"):
            record[k] = float(v)
    return record


_NUMERIC = ("request_throughput", "output_throughput", "total_token_throughput", "duration",
            "request_goodput", "slo_goodput", "slo_attainment")


def records_json(records: list[dict]) -> str:
    return json.dumps(strict_json(records), indent=1, allow_nan=False) + "\n"


def records_frame(records: list[dict]):
    """Records as a DataFrame for summary.csv (nested values such as policy_options as JSON)."""
    import pandas as pd
    return pd.DataFrame([{k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
                          for k, v in r.items()} for r in records])


def write_records(path: Path, records: list[dict]) -> None:
    """A list of run records, as `vllm bench` tooling reads them (strict JSON)."""
    with open(path, "w") as f:
        f.write(records_json(records))


def write_config(path: Path, resolved: dict, header: str) -> None:
    with open(path, "w") as f:
        f.write(f"# {header}\n")
        yaml.safe_dump(resolved, f, sort_keys=False)
