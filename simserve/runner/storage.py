"""Results on disk: folders written atomically, run records, resolved configs."""
from __future__ import annotations

import json
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


def write_records(path: Path, records: list[dict]) -> None:
    """A list of run records, as `vllm bench` tooling reads them."""
    with open(path, "w") as f:
        json.dump(records, f, indent=1, allow_nan=True)
        f.write("\n")


def write_config(path: Path, resolved: dict, header: str) -> None:
    with open(path, "w") as f:
        f.write(f"# {header}\n")
        yaml.safe_dump(resolved, f, sort_keys=False)
