"""Named public traces (`simserve/data/traces/manifest.yaml`, shipped with the package): where
to find them and how to fetch them.

Search order for a named trace's file (`trace_dirs()`):
1. every directory in `$SIMSERVE_TRACE_DIR` (one path, or several joined by os.pathsep);
2. the user cache, `$XDG_CACHE_HOME/simserve/traces` (default `~/.cache/simserve/traces`),
   where `simserve traces fetch` stores downloads;
3. in a source checkout only, and only while `$SIMSERVE_TRACE_DIR` is not set,
   `../shared/traces` relative to the repository root (the parent of the `simserve` package
   directory), where the project's shared copies live. Setting `$SIMSERVE_TRACE_DIR` (to an
   empty folder, say) hides them: tests that need a trace then skip.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from simserve import paths
from simserve.errors import ConfigError, SimserveError, did_you_mean

MANIFEST_PATH = paths.data_dir("traces") / "manifest.yaml"
DOWNLOAD_TIMEOUT_S = 60
_CHUNK = 1 << 20


def _network_errors() -> tuple:
    """What a failed download raises (urllib and http.client are imported only to fetch)."""
    import http.client
    import urllib.error
    return (urllib.error.URLError, http.client.HTTPException, TimeoutError, OSError)


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One manifest entry; size_bytes and requests are None where unknown."""

    name: str
    file: str
    url: str
    sha256: str
    format: str
    license: str
    citation: str
    size_bytes: int | None = None
    requests: int | None = None


_REQUIRED = ("file", "url", "sha256", "format", "license", "citation")
_OPTIONAL = ("size_bytes", "requests")
_FORMATS = ("azure-csv", "mooncake-jsonl", "plain-csv")


def _entry(path: Path, name: str, raw) -> TraceEntry:
    where = f"{path}: traces.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    for key in raw:
        if key not in _REQUIRED + _OPTIONAL:
            raise ConfigError(f"{where}.{key}: unknown key"
                              f"{did_you_mean(key, _REQUIRED + _OPTIONAL)}")
    for key in _REQUIRED:
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ConfigError(f"{where}.{key}: expected a non-empty string, got {raw.get(key)!r}")
    for key in _OPTIONAL:
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{where}.{key}: expected a positive integer, got {v!r}")
    sha = raw["sha256"].lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ConfigError(f"{where}.sha256: expected 64 hex digits, got {raw['sha256']!r}")
    if raw["format"] not in _FORMATS:
        raise ConfigError(f"{where}.format: expected one of {', '.join(_FORMATS)}, "
                          f"got {raw['format']!r}{did_you_mean(raw['format'], _FORMATS)}")
    return TraceEntry(name=name, **{**raw, "sha256": sha})


def load_manifest(path: str | Path | None = None) -> dict[str, TraceEntry]:
    """Entries of the manifest (default: the one shipped in the package) by name."""
    path = Path(path) if path is not None else MANIFEST_PATH
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the trace manifest ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traces"), dict):
        raise ConfigError(f"{path}: expected a top-level mapping 'traces:'")
    extra = [k for k in doc if k != "traces"]
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown key{did_you_mean(extra[0], ['traces'])}")
    return {str(name): _entry(path, str(name), raw) for name, raw in doc["traces"].items()}


def cache_dir() -> Path:
    """Where `fetch_trace` stores downloads by default."""
    return paths.cache_dir() / "traces"


def trace_dirs() -> list[Path]:
    """Directories searched for named traces, in order (see the module docstring)."""
    env = os.environ.get("SIMSERVE_TRACE_DIR", "")
    dirs = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    shared = [paths.REPO_ROOT.parent / "shared" / "traces"] \
        if paths.in_checkout() and not env else []
    return dirs + [cache_dir()] + shared


def find_local(entry: TraceEntry) -> Path | None:
    """The first copy of the entry's file in `trace_dirs()`, or None."""
    for d in trace_dirs():
        if (d / entry.file).is_file():
            return d / entry.file
    return None


def resolve_trace(name_or_path: str | Path, *, also_known=()) -> Path:
    """A manifest name found in `trace_dirs()`, or an existing file path.

    `also_known` adds names (e.g. synthetic workloads) to the list an unknown name prints.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if (path.suffix or "/" in text or os.sep in text) and path.is_file():
        return path  # an explicit file path works even without the manifest
    manifest = load_manifest()
    dirs = trace_dirs()
    if text in manifest:
        entry = manifest[text]
        found = find_local(entry)
        if found:
            return found
        raise SimserveError(
            f"trace {text!r} ({entry.file}) is not in any of: {', '.join(map(str, dirs))}; "
            f"download it with `simserve traces fetch {text}` or set SIMSERVE_TRACE_DIR")
    if path.is_file():
        return path
    if path.name == text:  # a bare file name: look in the trace directories too
        for d in dirs:
            if (d / text).is_file():
                return d / text
    if os.sep in text or "/" in text or path.suffix:
        raise SimserveError(f"{text}: no such trace file")
    known = sorted(manifest) + sorted(also_known)
    raise SimserveError(f"unknown trace {text!r}{did_you_mean(text, known)}; known: "
                        f"{', '.join(known)}; or give the path of a trace file")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _offline(entry: TraceEntry, exc: BaseException) -> SimserveError:
    reason = getattr(exc, "reason", None) or exc
    return SimserveError(
        f"could not download trace {entry.name!r} from {entry.url}: {reason}. Are you "
        f"offline? Fetch it on a connected machine and copy {entry.file} into one of: "
        f"{', '.join(map(str, trace_dirs()))} (or set SIMSERVE_TRACE_DIR)")


def _download(entry: TraceEntry, out, opener) -> tuple[str, int]:
    """Stream entry.url into the open file `out`; returns (sha256, bytes).

    Only the network side is wrapped, so a local write error stays an OSError."""
    h, size = hashlib.sha256(), 0
    network_errors = _network_errors()
    try:
        resp = opener(entry.url, timeout=DOWNLOAD_TIMEOUT_S)
    except network_errors as exc:
        raise _offline(entry, exc) from None
    with resp:
        while True:
            try:
                chunk = resp.read(_CHUNK)
            except network_errors as exc:
                raise _offline(entry, exc) from None
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return h.hexdigest(), size


def fetch_trace(name: str, dest: str | Path | None = None, *,
                opener=None) -> Path:
    """Download the manifest trace `name` into `dest` (default: the user cache), verify its
    sha256, and move it into place atomically. An existing verified copy is kept as is."""
    if opener is None:
        import urllib.request
        opener = urllib.request.urlopen
    manifest = load_manifest()
    if name not in manifest:
        raise SimserveError(f"unknown trace {name!r}{did_you_mean(name, manifest)}; "
                            f"known: {', '.join(sorted(manifest))}")
    entry = manifest[name]
    dest = Path(dest).expanduser() if dest is not None else cache_dir()
    target = dest / entry.file
    try:
        dest.mkdir(parents=True, exist_ok=True)
        if target.is_file() and file_sha256(target) == entry.sha256:
            return target
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{entry.file}.", suffix=".part")
        os.fchmod(fd, paths.umask_mode())  # mkstemp's 0600 would survive the rename
    except OSError as exc:
        raise SimserveError(f"{dest}: cannot write there ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as out:
            sha, size = _download(entry, out, opener)
        if sha != entry.sha256:
            raise SimserveError(
                f"downloaded {entry.file} ({size} bytes) has sha256 {sha}, expected "
                f"{entry.sha256}" + (f" ({entry.size_bytes} bytes)" if entry.size_bytes else "")
                + "; the download was discarded")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
