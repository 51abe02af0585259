"""Results on disk: folders written atomically, run records, resolved configs."""
from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

import yaml

from simserve.errors import ConfigError, SimserveError
from simserve.runner.provenance import MARKER, OLD, TMP, read_marker, write_json_atomic
from simserve.strict_json import from_strict_json, strict_json  # noqa: F401 (re-exported)

try:
    import fcntl
except ImportError:  # not POSIX: no lock (a second writer is then not detected)
    fcntl = None


def _fresh_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named folder created with the user's umask (tempfile.mkdtemp makes
    0700 folders, which would leave results unreadable to the group once renamed)."""
    while True:
        tmp = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextmanager
def out_lock(out: Path):
    """Hold an exclusive lock on the results folder `out` (a lock file beside it,
    `.NAME.lock`) while a run or sweep writes there; a second writer gets a one-line error
    instead of silently replacing (or mixing into) the first one's results."""
    if fcntl is None:
        yield
        return
    out = Path(os.path.realpath(out))  # two names of one folder (a symlink) share one lock
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimserveError(f"--out {out}: cannot create its folder ({exc.strerror})") from None
    path = out.parent / f".{out.name}.lock"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise SimserveError(f"--out {out}: cannot write there ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SimserveError(f"--out {out}: another simserve run (pid {holder}) is writing "
                                "there; refusing to run into the same folder (wait for it to "
                                "finish, or choose another --out)") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: again
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


@contextmanager
def atomic_folder(dest: Path):
    """Yield a temporary sibling of `dest` to fill; on success it replaces `dest` (so a folder
    that exists is complete), on any error it is removed and `dest` is left as it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_dir(dest.parent, f".{dest.name}{TMP}")
    try:
        yield tmp
        if dest.exists():
            old = _fresh_dir(dest.parent, f".{dest.name}{OLD}")
            os.replace(dest, old / "x")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def claim_out(out: Path, kind: str, overwrite: bool = False, adopt: bool = False) -> dict | None:
    """Check that simserve may write a `kind` ("run" or "sweep") results folder at `out`, and
    return its marker (None for a new or empty folder, or one taken over with `overwrite`).
    A non-empty folder without simserve's marker, or one holding the other kind's results, is
    refused unless `overwrite`; even then only the files simserve writes are replaced. A
    folder an older simserve wrote (its layout alone, `adopt.older_results`) is taken over
    with `adopt`, its marker then `adopt.adopted_marker`."""
    from simserve.runner.adopt import adopted_marker, older_results
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    try:
        empty = not out.is_dir() or not any(out.iterdir())
    except OSError as exc:
        raise SimserveError(f"--out {out}: cannot read the folder ({exc.strerror})") from None
    if empty:
        return None
    found = read_marker(out)
    hint = "choose another --out, or add --overwrite to replace simserve's files there and " \
        "leave every other file as it is"
    if found is None or found.get("written_by") != "simserve":
        if overwrite:
            return None
        old_kind, why = older_results(out) if found is None else (None, f"{MARKER} is not "
                                                                   "simserve's")
        if old_kind == kind and adopt:
            return adopted_marker(out, kind)
        if old_kind == kind:
            also = " or --reuse-stale (keeps its points as they are)" if kind == "sweep" else ""
            raise SimserveError(f"--out {out}: holds a {kind}'s results from a simserve older "
                                f"than its {MARKER} marker; add --adopt to take it over "
                                f"(stale points are rerun, nothing else is touched){also}")
        if adopt:
            what = f"holds a {old_kind}'s results" if old_kind else f"not simserve's ({why})"
            raise SimserveError(f"--out {out}: {what}; refusing to adopt it as a {kind} ({hint})")
        raise SimserveError(f"--out {out}: folder is not empty and simserve did not make it "
                            f"(no {MARKER}); refusing to write into it ({hint})")
    if found.get("kind") != kind and not overwrite:
        raise SimserveError(f"--out {out}: holds the results of a simserve "
                            f"{found.get('kind')}, not a {kind}; refusing to replace them "
                            f"({hint})")
    return found


def clean_stale_temp(out: Path) -> list[Path]:
    """Remove what a killed run left beside and in `out`: `.NAME.simserve-tmp-*` /
    `.NAME.simserve-old-*` folders and `.FILE.simserve-tmp-*` files (names no user file has by
    chance: a user's `.notes.tmp-1` stays). Call it holding `out_lock(out)` (no live run owns
    them)."""
    out = Path(os.path.realpath(out))
    gone = [p for pat in (f".{out.name}{TMP}*", f".{out.name}{OLD}*")
            for p in out.parent.glob(pat)]
    if out.is_dir():
        gone += [p for p in out.glob(f".*{TMP}*") if p.is_file()]
    for p in gone:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone


@contextmanager
def staging(out: Path):
    """A temporary sibling folder of `out` to write results into (removed afterwards)."""
    out = Path(os.path.realpath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_dir(out.parent, f".{out.name}{TMP}")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_path(path: Path) -> None:
    """Remove a file, link or folder (a link is removed, never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def install(tmp: Path, out: Path, new_marker: dict, old_marker: dict | None) -> None:
    """Move the files written in `tmp` into `out`, each by a rename, and write the marker.
    Of what `out` held, only the names the old marker lists (simserve's own files) are
    replaced or removed; everything else stays. While files move the marker says
    `complete: false` and lists old and new names."""
    out = Path(os.path.realpath(out))
    names = sorted(p.name for p in tmp.iterdir())
    if (old_marker or {}).get("written_by") != "simserve":
        old_marker = None  # a file of that name simserve did not write lists nothing
    old = [n for n in (old_marker or {}).get("files", []) if plain_name(n)]
    for name in names:
        if name not in old and (out / name).is_dir() and not (out / name).is_symlink():
            raise SimserveError(f"--out {out}: {out / name} is a folder simserve did not "
                                "write; refusing to replace it")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / MARKER, {**new_marker, "complete": False,
                                     "files": sorted(set(names) | set(old))})
    for name in old:
        if name not in names:
            remove_path(out / name)
    for name in names:
        if (out / name).is_dir() and not (out / name).is_symlink():
            remove_path(out / name)
        os.replace(tmp / name, out / name)
    write_json_atomic(out / MARKER, {**new_marker, "files": names, "complete": True})


def plain_name(name) -> bool:
    """A name inside the folder (a marker edited by hand cannot point elsewhere)."""
    return isinstance(name, str) and name not in ("", ".", "..", MARKER) and "/" not in name \
        and "\\" not in name


def os_error(out, exc: OSError) -> SimserveError:
    """An OSError while reading or writing results as a one-line error naming the file."""
    what = exc.filename or out
    return SimserveError(f"--out {out}: cannot write {what}: "
                         f"{exc.strerror or exc or type(exc).__name__}; nothing was left "
                         "half-written")


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
