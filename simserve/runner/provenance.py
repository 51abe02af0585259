"""What a stored result was made from: simserve's version, a hash of the simserve code and data
it was simulated with, the resolved config's hash and the content of the trace files it read.

A results folder carries this in its marker file `.simserve.json` (written last, so a folder
whose marker says `complete` holds everything the marker lists); each sweep point carries its
own copy in `points/<hash>/provenance.json`. A stored point is reused on resume only when all
four match what this process would compute (`staleness`).

Trace files are hashed by content (sha256 of the bytes), remembered per process by (path,
size, mtime_ns), so a sweep hashes a large trace once. A result's `code_hash` is its point's
(`point_inputs.point_code_hash`): the modules its simulation imports, the package data they
read and the hardware profiles it uses (decode pools' included), so a refitted profile or an
edited policy reruns the points that read it, and an edit elsewhere (the planner, `explain/`,
another policy) reruns none. `code_hash()` is the whole package's (every source and data file
and the user's profiles), for state that spans every design (the planner's); both are
computed once per process.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

# the infixes of simserve's own temporary entries: a killed run's leftovers are recognised by
# them, and only they are ever cleaned up
TMP = ".simserve-tmp-"
OLD = ".simserve-old-"

MARKER = ".simserve.json"
POINT_PROVENANCE = "provenance.json"
FORMAT = 1
_SOURCE_SUFFIXES = (".py", ".pyx", ".pxd")
_DATA_SUFFIXES = (".yaml", ".yml", ".json", ".csv")


def simserve_version() -> str:
    import simserve
    return str(simserve.__version__)


def _hash_files(h, root: Path, paths) -> None:
    for path in sorted(paths):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")


@functools.lru_cache(maxsize=1)
def _package_hash() -> str:
    from simserve.paths import user_profile_dirs
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    _hash_files(h, root, (p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES))
    data = root / "data"
    _hash_files(h, root, (p for p in data.rglob("*") if p.suffix in _DATA_SUFFIXES))
    for d in user_profile_dirs():
        if d.is_dir():
            h.update(b"user profiles\0")
            _hash_files(h, d, (p for p in d.glob("*.yaml") if p.is_file()))
    return h.hexdigest()[:16]


def code_hash() -> str:
    """sha256[:16] over all of simserve's source and data files and the user's hardware
    profiles (any edit gives a new hash); a point's results use `point_code_hash`."""
    return _package_hash()


def point_code_hash(cfg) -> str:
    """sha256[:16] over the code, data and profiles a point of `cfg` is simulated with."""
    from simserve.runner.point_inputs import point_code_hash as point_hash
    return point_hash(cfg)


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, remembered by (real path, size, mtime_ns)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns)
    digest = _FILE_HASHES.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(real, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = _FILE_HASHES[key] = h.hexdigest()
    return digest


def trace_hashes(cfg) -> dict[str, str]:
    """{trace as the config names it: sha256 of its file} for a config's trace file (none for
    a synthetic workload)."""
    from simserve.workload.build import RANDOM, SYNTHETIC, is_trace_file
    from simserve.workload.manifest import resolve_trace
    trace = cfg.workload.trace
    if not is_trace_file(trace):
        return {}
    return {trace: file_sha256(resolve_trace(trace, also_known=(*SYNTHETIC, RANDOM)))}


def provenance(cfg, config_hash: str | None = None) -> dict:
    """What a result of `cfg` is made from, as stored beside it."""
    return {"simserve_version": simserve_version(), "code_hash": point_code_hash(cfg),
            "config_hash": config_hash or cfg.hash(), "traces": trace_hashes(cfg)}


def staleness(stored: dict | None, current: dict) -> str | None:
    """Why a result stored with provenance `stored` differs from `current` (None: it does not).
    The first difference found, in the order: config, trace content, version, code."""
    if not stored:
        return "no provenance recorded (written by an older simserve)"
    if stored.get("config_hash") != current["config_hash"]:
        return "config changed"
    old, new = stored.get("traces") or {}, current["traces"]
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            return f"trace file {name} changed"
    if stored.get("simserve_version") != current["simserve_version"]:
        return (f"simserve version changed ({stored.get('simserve_version')} -> "
                f"{current['simserve_version']})")
    if stored.get("code_hash") != current["code_hash"]:
        return "simserve's code changed"
    return None


def read_json(path: Path) -> dict | None:
    """A JSON object stored by simserve, or None when missing, unreadable or not an object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data) -> None:
    """Write JSON to a temporary sibling, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}{TMP}{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def read_marker(out: Path) -> dict | None:
    return read_json(Path(out) / MARKER)


def marker(kind: str, prov: dict, files: list[str], complete: bool, **extra) -> dict:
    """The marker of a results folder: `kind` (run or sweep), the provenance of what it holds,
    the names simserve wrote there (the only ones it may replace or remove), and whether
    writing finished."""
    return {"format": FORMAT, "written_by": "simserve", "kind": kind, **prov,
            "files": sorted(files), "complete": complete, **extra}
