"""A disk cache of parsed input files (hardware-profile YAML, trace files), keyed by content.

Parsing is most of what a short `simserve run` does before its first event: PyYAML builds the
~26,000 objects of a GPU profile in Python (~0.1 s each, even with libyaml), and a trace reader
needs pandas (~0.4 s to import) to parse timestamps. The parsed value is stored with `marshal`
(plain ints, floats, strings, bytes, lists, tuples, dicts; it cannot run code when read back,
unlike pickle) under `$XDG_CACHE_HOME/simserve/parsed/` (default `~/.cache`), named by the
sha256 of the file's resolved path and bytes, the parser's and encoder's bytecode, the whole
source of the modules that define them and of every simserve module those import (directly or
through others, `source_closure`), the cache format and the Python version (marshal's format
follows it). An edited file, or an edit anywhere in the reader's code (a helper included),
therefore misses; an unreadable, truncated or foreign cache entry is ignored and rewritten; a
value marshal cannot store (e.g. a YAML date) is not cached; a cache folder that cannot be
written costs nothing but the parse. `SIMSERVE_PARSE_CACHE=0` turns the cache off. Entries are
written to a temporary file and renamed, so concurrent processes never read half an entry.

The folder is kept under a size cap, `SIMSERVE_PARSE_CACHE_MAX_MB` (MiB; default 1024; a
parsed trace holds three arrays, about 24 bytes a request; a parsed hardware profile tens of KB):
after each new entry the least recently used entries (by last use: a hit refreshes it) are
removed until the folder fits.
`simserve cache info` shows the folder and its size, `simserve cache clear` empties it.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import marshal
import os
import sys
import tempfile
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Callable

from simserve import paths

FORMAT = 2  # bump when an encoder's layout or the key changes
DEFAULT_MAX_MB = 1024
ENTRY_SUFFIX = ".marshal"
MEMO_SUFFIX = ".closure"  # a reader's closure digest and the stats it was read at


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


def _module_file(name: str) -> Path | None:
    """The source file of module `name` (None when it has none: a builtin, a namespace)."""
    mod = sys.modules.get(name)
    if name == "simserve" or name.startswith("simserve."):  # the .py, even when compiled
        rel = Path(*name.split(".")[1:]) if name != "simserve" else None
        for cand in ((paths.PACKAGE_DIR / "__init__.py",) if rel is None else
                     (paths.PACKAGE_DIR / rel.with_suffix(".py"),
                      paths.PACKAGE_DIR / rel / "__init__.py")):
            if cand.is_file():
                return cand
    f = getattr(mod, "__file__", None)
    if f is None and mod is None and not name.startswith("simserve."):
        # a plugin's module not imported yet: found on its package's path, importing nothing
        parent, _, last = name.rpartition(".")
        where = getattr(sys.modules.get(parent), "__path__", None) if parent else None
        if where is not None or not parent:
            spec = PathFinder.find_spec(last, where)
            f = spec.origin if spec is not None and spec.has_location else None
    return Path(f) if f else None


def _imports(name: str, source: bytes, is_package: bool,
             tops: tuple[str, ...] = ("simserve",)) -> set[str]:
    """The modules of the packages `tops` (simserve's by default) that a module's source
    imports (anywhere in it, relative ones too)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    pkg = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if m.split(".")[0] in tops}


def closure_sources(name: str) -> tuple[tuple[str, Path | None, bytes], ...]:
    """(module, its file, its source) for module `name` and every simserve module it imports,
    directly or through others, sorted by module (names that are not modules, e.g. imported
    functions, have no file and an empty source). A module outside simserve (a plugin's) also
    brings the modules of its own top-level package that it imports. Read anew at each call."""
    return _closure(name)[0]


def _closure(name: str):
    """`closure_sources(name)`, and each file's stat (`_stat`) taken just before it was read
    (None where it could not be)."""
    tops = tuple(sorted({"simserve", name.split(".")[0]}))
    seen: dict[str, tuple[Path | None, bytes]] = {}
    stats: list = []
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        f = _module_file(mod)
        try:
            if f is not None:
                stats.append(_stat(f))
            src = f.read_bytes() if f is not None else b""
        except OSError:
            src = b""
        seen[mod] = (f, src)
        if f is not None and f.suffix == ".py":
            todo.extend(_imports(mod, src, f.name == "__init__.py", tops) - set(seen))
    return tuple((mod, *seen[mod]) for mod in sorted(seen)), stats


def _stat(f: Path) -> tuple[str, int, int, int] | None:
    try:
        st = f.stat()
    except OSError:
        return None
    return (str(f), st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=64)
def source_closure(name: str) -> str:
    """sha256 over the source of module `name` and of every simserve module it imports,
    directly or through others (`closure_sources`).

    Walking the closure parses every module in it (tens of ms per process), so the digest is
    remembered in the cache folder beside the stat (mtime in ns, size, inode) of each file it
    read, taken before the read: while every one of those files stats the same, the digest is
    reused without reading them, the rule Python's own bytecode cache applies to a module
    (mtime and size). An edited file stats differently, and a changed import list can only
    come from an edited file, so the walk runs again."""
    tag = repr((name, sys.version_info[:2], str(paths.PACKAGE_DIR), FORMAT)).encode()
    memo = cache_folder() / f"closure-{hashlib.sha256(tag).hexdigest()[:24]}{MEMO_SUFFIX}"
    if enabled():
        try:
            with open(memo, "rb") as f:
                stats, digest = marshal.load(f)
            if all(_stat(Path(st[0])) == tuple(st) for st in stats):
                return digest
        except Exception:  # missing, truncated, foreign: walk the closure
            pass
    sources, stats = _closure(name)
    h = hashlib.sha256()
    for mod, _, src in sources:
        if src or mod == name:
            h.update(mod.encode() + b"\0" + src + b"\0")
    digest = h.hexdigest()
    if enabled() and None not in stats and all(_stat(Path(st[0])) == st for st in stats):
        _write(memo, marshal.dumps(([list(st) for st in stats], digest)))
    return digest


def _write(entry: Path, blob: bytes) -> bool:
    """Write a cache entry atomically (a temporary file, then rename); never raises. Whether
    it was written."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, entry)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _key(kind: str, path: Path, data: bytes, *fns: Callable) -> str:
    h = hashlib.sha256()
    h.update(f"{kind}\0{FORMAT}\0{sys.version_info[:2]}\0{path}\0".encode())
    for fn in fns:
        h.update(_code_id(fn))
        mod = getattr(fn, "__module__", None)
        if mod:
            h.update(source_closure(mod).encode())
    h.update(data)
    return h.hexdigest()[:32]


def max_bytes() -> int:
    """The folder's size cap: `SIMSERVE_PARSE_CACHE_MAX_MB` (MB), else DEFAULT_MAX_MB."""
    raw = os.environ.get("SIMSERVE_PARSE_CACHE_MAX_MB", "")
    try:
        mb = float(raw) if raw else DEFAULT_MAX_MB
    except ValueError:
        mb = DEFAULT_MAX_MB
    return max(0, int(mb * 1024 * 1024))


def entries(folder: Path | None = None) -> list[tuple[Path, int, float]]:
    """(path, size, last use) of each cache entry, least recently used first."""
    folder = cache_folder() if folder is None else folder
    out = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(ENTRY_SUFFIX) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    out.append((Path(e.path), st.st_size, max(st.st_atime, st.st_mtime)))
    except OSError:
        return []
    return sorted(out, key=lambda t: t[2])


def prune(cap: int | None = None, folder: Path | None = None) -> list[Path]:
    """Remove least recently used entries until the folder holds at most `cap` bytes."""
    cap = max_bytes() if cap is None else cap
    found = entries(folder)
    total = sum(size for _, size, _ in found)
    gone = []
    for path, size, _ in found:
        if total <= cap:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        gone.append(path)
    return gone


def clear(folder: Path | None = None) -> tuple[int, int]:
    """Remove every entry (and leftover temporary files and closure memos): (files removed,
    bytes freed)."""
    folder = cache_folder() if folder is None else folder
    n = freed = 0
    for path, size, _ in entries(folder):
        try:
            path.unlink()
            n, freed = n + 1, freed + size
        except OSError:
            pass
    for tmp in [*folder.glob(".tmp-*"), *folder.glob(f"closure-*{MEMO_SUFFIX}")]:
        try:
            size = tmp.stat().st_size
            tmp.unlink()
            n, freed = n + 1, freed + size
        except OSError:
            pass
    return n, freed


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
    entry = cache_folder() / f"{kind}-{_key(kind, path, data, parse, encode, decode)}" \
        f"{ENTRY_SUFFIX}"
    try:
        with open(entry, "rb") as f:
            value = decode(marshal.load(f))
        try:
            os.utime(entry)  # its last use, for pruning (atime alone may not be kept)
        except OSError:
            pass
        return value
    except Exception:  # missing, truncated, foreign: parse and (re)write
        pass
    value = parse(path)
    try:
        blob = marshal.dumps(encode(value))
    except ValueError:  # something marshal cannot store: leave this file uncached
        return value
    if _write(entry, blob):
        prune()
    return value
