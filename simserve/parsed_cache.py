"""A disk cache of parsed input files (hardware-profile YAML, trace files), keyed by content.

Parsing is most of what a short `simserve run` does before its first event: PyYAML builds the
~26,000 objects of a GPU profile in Python (~0.1 s each, even with libyaml), and a trace reader
needs pandas (~0.4 s to import) to parse timestamps. The parsed value is stored with `marshal`
(plain ints, floats, strings, bytes, lists, tuples, dicts; it cannot run code when read back,
unlike pickle) under `$XDG_CACHE_HOME/simserve/parsed/` (default `~/.cache`), named by the
sha256 of the file's resolved path and bytes, the parser's and encoder's bytecode, the cache
format and the Python version (marshal's format follows it). An edited file, or an edited
parse function, therefore misses; an unreadable, truncated or foreign cache
entry is ignored and rewritten; a value marshal cannot store (e.g. a YAML date) is not cached;
a cache folder that cannot be written costs nothing but the parse. `SIMSERVE_PARSE_CACHE=0`
turns the cache off. Entries are written to a temporary file and renamed, so concurrent
processes never read half an entry.
"""
from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from simserve import paths

FORMAT = 1  # bump when an encoder's layout changes


def cache_folder() -> Path:
    return paths.cache_dir() / "parsed"


def enabled() -> bool:
    return os.environ.get("SIMSERVE_PARSE_CACHE", "1") != "0"


def _code_id(fn: Callable) -> bytes:
    """The parser's and encoder's own bytecode: a change to how a file is parsed misses."""
    code = getattr(fn, "__code__", None)
    try:
        return marshal.dumps(code) if code is not None else repr(fn).encode()
    except ValueError:
        return repr(fn).encode()


def _key(kind: str, path: Path, data: bytes, *fns: Callable) -> str:
    h = hashlib.sha256()
    h.update(f"{kind}\0{FORMAT}\0{sys.version_info[:2]}\0{path}\0".encode())
    for fn in fns:
        h.update(_code_id(fn))
    h.update(data)
    return h.hexdigest()[:32]


def cached_parse(path: str | Path, kind: str, parse: Callable[[Path], Any],
                 encode: Callable[[Any], Any] = lambda v: v,
                 decode: Callable[[Any], Any] = lambda v: v) -> Any:
    """parse(path), or the value stored for this file's exact bytes. `encode` turns the value
    into marshal-able data and `decode` back (decode(encode(v)) must equal v)."""
    path = Path(path).resolve()
    if not enabled():
        return parse(path)
    try:
        data = path.read_bytes()
    except OSError:
        return parse(path)  # the parser reports the file's problem
    entry = cache_folder() / f"{kind}-{_key(kind, path, data, parse, encode)}.marshal"
    try:
        with open(entry, "rb") as f:
            return decode(marshal.load(f))
    except Exception:  # missing, truncated, foreign: parse and (re)write
        pass
    value = parse(path)
    try:
        blob = marshal.dumps(encode(value))
    except ValueError:  # something marshal cannot store: leave this file uncached
        return value
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, entry)
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return value
