"""Results folders written by a simserve older than the `.simserve.json` marker: recognised by
their layout alone, and taken over (`--adopt`; a sweep's `--reuse-stale` too) only when every
entry is one simserve writes there. A run folder holds `summary.json`, `config.yaml` (headed
"# resolved config of ...") and optionally `summary.csv`, `requests.csv`, `config.sha256`; a
sweep folder holds `points/` and optionally `summary.json`, `summary.csv`, each point a folder
named by its 16-hex config hash holding `config.yaml` (headed "# resolved config of one sweep
point"), its record (`record.json`, or `summary.json` before that name) and `requests.csv`.
Half-written temporary entries (`.NAME.simserve-tmp-*`, and `.NAME.tmp-*` from older builds)
count as simserve's; adopting deletes none of them. Anything else, a link included, is the
user's: such a folder is not adopted.
"""
from __future__ import annotations

import re
from pathlib import Path

from simserve.runner.provenance import FORMAT, TMP

RUN_FILES = ("summary.json", "summary.csv", "requests.csv", "config.yaml", "config.sha256")
SWEEP_TOP = ("summary.json", "summary.csv", "points")
POINT_NAMES = ("record.json", "summary.json", "requests.csv", "config.yaml", "provenance.json")
RUN_HEADER = "# resolved config of "
POINT_HEADER = "# resolved config of one sweep point"
_KEY = re.compile(r"[0-9a-f]{16}")


def _temp(name: str) -> bool:
    return name.startswith(".") and (TMP in name or ".tmp-" in name)  # (older builds: .tmp-)


def _file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _headed(p: Path, header: str) -> bool:
    try:
        with open(p, encoding="utf-8") as f:
            return f.readline().startswith(header)
    except (OSError, UnicodeDecodeError):
        return False


def _point_problem(folder: Path) -> str | None:
    if folder.is_symlink() or not folder.is_dir() or not _KEY.fullmatch(folder.name):
        return f"{folder.name} in points/ is not a point folder simserve writes"
    for q in folder.iterdir():
        if not _temp(q.name) and (q.name not in POINT_NAMES or not _file(q)):
            return f"points/{folder.name}/{q.name} is not a file simserve writes there"
    if not _headed(folder / "config.yaml", POINT_HEADER):
        return f"points/{folder.name}/config.yaml is not a sweep point's resolved config"
    return None


def older_results(out: Path) -> tuple[str | None, str]:
    """("run" or "sweep", "") when `out` holds exactly an older simserve's results of that
    kind, else (None, why not: the first entry that is not simserve's)."""
    entries = sorted(p for p in out.iterdir() if not _temp(p.name))
    names = [p.name for p in entries]
    if "points" in names:
        for p in entries:
            if p.name not in SWEEP_TOP:
                return None, f"{p.name} is not a file simserve writes there"
            if p.name != "points" and not _file(p):
                return None, f"{p.name} is not a plain file"
        pdir = out / "points"
        if pdir.is_symlink() or not pdir.is_dir():
            return None, "points is not a folder"
        for folder in sorted(pdir.iterdir()):
            if not _temp(folder.name):
                why = _point_problem(folder)
                if why:
                    return None, why
        return "sweep", ""
    for p in entries:
        if p.name not in RUN_FILES or not _file(p):
            return None, f"{p.name} is not a file simserve writes there"
    if "summary.json" not in names or not _headed(out / "config.yaml", RUN_HEADER):
        return None, "it has no summary.json and resolved config.yaml"
    return "run", ""


def adopted_marker(out: Path, kind: str) -> dict:
    """The marker an adopted folder is treated as having: simserve's, listing what it holds
    (the only names a run or sweep may then replace or remove)."""
    names = RUN_FILES if kind == "run" else SWEEP_TOP
    return {"format": FORMAT, "written_by": "simserve", "kind": kind, "adopted": True,
            "files": sorted(n for n in names if (out / n).exists()), "complete": False}
