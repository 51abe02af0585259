"""The sweep summary is rewritten in batches (its rewrite is O(points)), yet a sweep stopped at
any moment leaves a consistent folder: every point in the summary is stored, the marker counts
what the summary holds, and the resume runs only the points not stored."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from simserve.runner import sweep_store
from simserve.runner.provenance import MARKER
from tests.test_results_trust import counting, proj, sweep

__all__ = ["proj"]  # the fixture, shared

RATES = "sweep.workload.rates=[1,2,3,4,5,6]"


def timed(monkeypatch, point_s: float, write_s: float) -> tuple[list[int], dict]:
    """A clock that moves only as the test says: `point_s` per stored point, `write_s` per
    summary rewrite (both changeable in the returned dict). Returns the record counts of the
    rewrites, in order, and that dict."""
    t, seen = [0.0], []
    speed = {"point_s": point_s, "write_s": write_s}
    write, done = sweep_store.write_summaries, sweep_store.SummaryStore.done

    def timed_write(out, records):
        t[0] += speed["write_s"]
        seen.append(len(records))
        write(out, records)

    def timed_done(self, sp):
        t[0] += speed["point_s"]
        done(self, sp)

    monkeypatch.setattr(sweep_store, "_clock", lambda: t[0])
    monkeypatch.setattr(sweep_store, "write_summaries", timed_write)
    monkeypatch.setattr(sweep_store.SummaryStore, "done", timed_done)
    return seen, speed


def test_fast_points_are_written_in_one_batch_with_the_same_bytes(proj, monkeypatch):
    seen, speed = timed(monkeypatch, point_s=0.01, write_s=0.001)
    assert sweep("--out", "batched", "--set", RATES) == 0
    assert seen == [0, 6]   # the marker first, then once at the end
    speed["point_s"] = 5.0
    assert sweep("--out", "each", "--set", RATES) == 0
    assert seen[2:] == [0, 1, 2, 3, 4, 5, 6, 6]   # points slower than the interval: each
    for name in ("summary.json", "summary.csv"):
        assert (proj / "batched" / name).read_bytes() == (proj / "each" / name).read_bytes()


def test_a_rewrite_waits_for_twenty_times_its_own_cost(proj, monkeypatch):
    """A slow rewrite (a large sweep) is done less often: each takes 1 s here, so the next
    waits for 20 s, while points finish every 3 s: every 7th point."""
    seen, _ = timed(monkeypatch, point_s=3.0, write_s=1.0)
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--set", "sweep.workload.rates=" + str(list(range(1, 21)))) == 0
    assert len(calls) == 20
    assert seen == [0, 7, 14, 20]


KILL_AFTER = """
import os, signal, sys
from simserve.cli import main
from simserve.runner import sweep_store, sweep_task
sweep_store._clock = lambda: 0.0          # never due: the summary lags every point
real, done = sweep_task.run_point, []
def run_point(cfg, pt, *a, **kw):
    if len(done) == 4:
        os.kill(os.getpid(), signal.SIGKILL)   # killed outright: no flush
    done.append(1)
    return real(cfg, pt, *a, **kw)
sweep_task.run_point = run_point
sys.exit(main(["sweep", "sw.yaml", "-q", "--workers", "1", "--out", "s", "--set", %r]))
"""


def test_a_sweep_killed_outright_leaves_a_consistent_resumable_folder(proj, monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", KILL_AFTER % RATES], cwd=proj, env=env,
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    out = proj / "s"
    stored = {p.name for p in (out / "points").iterdir() if not p.name.startswith(".")}
    recs = json.loads((out / "summary.json").read_text())
    m = json.loads((out / MARKER).read_text())
    assert len(stored) == 4 and {r["point"] for r in recs} <= stored
    assert (m["complete"], m["points_done"], m["points_total"]) == (False, len(recs), 6)
    calls = counting(monkeypatch)
    assert sweep("--out", "s", "--set", RATES) == 0
    assert len(calls) == 2   # only the points not stored
    assert len(json.loads((out / "summary.json").read_text())) == 6
    assert json.loads((out / MARKER).read_text())["complete"] is True
