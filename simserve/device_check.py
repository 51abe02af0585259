"""Checks a device script's dry run makes before a GPU day: what a `run` call may carry and
bring back (the limits of `/work/.library/device/README.md`, restated here as numbers).

- `tree_bytes`: the working tree that travels with every call (tracked files and untracked
  files git does not ignore);
- `parts_problems`: payload parts listed for a call exist and each fits beside the tree;
- `return_problems`: what a command leaves under $OUT comes back (at most 8 files, 16 MiB
  each, 64 MiB together, no deeper than two folders, plain names);
- `pack`: the plan's way to bring back many files, one `tar cJf $OUT/NAME.tar.xz -C RAW .`.
"""
from __future__ import annotations

import os
import re
import subprocess
import tarfile

CARRY_BYTES = 64 * 2**20          # the working tree and carried paths, per call
PART_BYTES = 34_000_000           # one payload part (build.sh's PART_BYTES)
RETURN_FILES = 8
RETURN_FILE_BYTES = 16 * 2**20
RETURN_BYTES = 64 * 2**20
RETURN_DEPTH = 2                  # $OUT/a/b/file comes back, $OUT/a/b/c/file does not
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_bytes(root: str | None = None) -> int | None:
    """Bytes of the tree a call sends (None where git is unavailable)."""
    root = root or repo_root()
    try:
        names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                               capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for n in names.split(b"\0"):
        p = os.path.join(root, n.decode())
        if n and os.path.isfile(p) and not os.path.islink(p):
            total += os.path.getsize(p)
    return total


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def parts_problems(dirs: list[str], tree: int | None, part_bytes: int = PART_BYTES) -> list[str]:
    """Each carried folder exists, is not empty, and fits one call beside the tree."""
    out = []
    for d in dirs:
        if not os.path.isdir(d) or not os.listdir(d):
            out.append(f"{d}: missing or empty")
            continue
        size = folder_bytes(d)
        if size > part_bytes:
            out.append(f"{d}: {size} bytes, over the part limit {part_bytes}")
        if tree is not None and tree + size > CARRY_BYTES:
            out.append(f"{d}: {size} bytes + tree {tree} exceed one call's {CARRY_BYTES}")
    return out


def return_problems(out_dir: str) -> list[str]:
    """Why some of `out_dir` would not come back from a `run` call (empty: all of it does)."""
    probs, files, total = [], 0, 0
    for d, subdirs, fs in os.walk(out_dir):
        rel = os.path.relpath(d, out_dir)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        for name in subdirs + fs:
            if not _NAME.match(name):
                probs.append(f"{os.path.join(rel, name)}: name has characters outside [A-Za-z0-9._-]")
        for f in fs:
            p = os.path.join(d, f)
            files += 1
            total += os.path.getsize(p)
            if depth > RETURN_DEPTH:
                probs.append(f"{os.path.join(rel, f)}: more than {RETURN_DEPTH} folders down")
            if os.path.getsize(p) > RETURN_FILE_BYTES:
                probs.append(f"{os.path.join(rel, f)}: over {RETURN_FILE_BYTES} bytes")
    if files > RETURN_FILES:
        probs.append(f"{files} files: at most {RETURN_FILES} come back (pack them)")
    if total > RETURN_BYTES:
        probs.append(f"{total} bytes: at most {RETURN_BYTES} come back")
    return probs


def pack(raw: str, out_dir: str, name: str) -> str:
    """`tar cJf OUT/NAME.tar.xz -C RAW .`, as the plan's commands end."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.tar.xz")
    with tarfile.open(path, "w:xz") as t:
        t.add(raw, arcname=".")
    return path


def unpack(path: str, dest: str) -> str:
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(path, "r:xz") as t:
        t.extractall(dest, filter="data")
    return dest


def report(name: str, problems: list[str]) -> int:
    """Print the dry run's verdict; exit status 0 when nothing is wrong, else 1."""
    for p in problems:
        print(f"{name} dry run: {p}")
    print(f"{name} dry run: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0
