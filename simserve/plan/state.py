"""The plan's state file: each finished capacity bisection, one JSON line, so an interrupted
plan resumes where it stopped. The first line names the plan's key (its content and
simserve's version, `PlanSpec.key`); a file written for another key is never read back (it
is replaced, being simserve's own), and a half-written last line is ignored."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from simserve.errors import SimserveError

MARKER = "simserve-plan-state"


def task_key(item: dict) -> str:
    blob = json.dumps(item, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class PlanState:
    def __init__(self, path: str | Path | None, plan_key: str):
        self.path = None if path is None else Path(path)
        self.plan_key = plan_key
        self.done: dict[str, dict] = {}
        self.num_reused = 0
        if self.path is None:
            return
        if self.path.exists():
            self._read()
        if not self.done:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({MARKER: 1, "plan_key": plan_key}) + "\n")

    def _read(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            head = {}
        if MARKER not in head:
            raise SimserveError(f"{self.path}: exists and is not a simserve plan state file; "
                                "refusing to replace it (give another --out)")
        if head.get("plan_key") != self.plan_key:
            return   # another plan or simserve version: start afresh
        for ln in lines[1:]:
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError:
                continue   # interrupted while writing
            self.done[rec["key"]] = rec["result"]

    def get(self, key: str) -> dict | None:
        r = self.done.get(key)
        if r is not None:
            self.num_reused += 1
        return r

    def put(self, key: str, result: dict) -> None:
        self.done[key] = result
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"key": key, "result": result}) + "\n")
