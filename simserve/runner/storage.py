"""Results on disk: folders written atomically, run records, resolved configs."""
from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

import yaml

from simserve.errors import SimserveError
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
    out = Path(out).absolute()
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
    tmp = _fresh_dir(dest.parent, f".{dest.name}.tmp-")
    try:
        yield tmp
        if dest.exists():
            old = _fresh_dir(dest.parent, f".{dest.name}.old-")
            os.replace(dest, old / "x")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
