"""`simserve.calibrate.collectives` without torch or GPUs: one rank with a stand-in process group
and recorded parts (in a child process, so the stand-in torch never reaches another test); the
worker's own logic is checked: the part order, `--parts`, the time reserves, failures, meta.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, os, sys
    from unittest import mock
    torch = mock.MagicMock(name="torch")
    torch.__version__ = "stand-in"
    dist = mock.MagicMock(name="torch.distributed")
    torch.distributed = dist
    sys.modules["torch"], sys.modules["torch.distributed"] = torch, dist
    from simserve.calibrate import collectives as C
    calls = []

    def recorder(name):
        def part(ctx, sizes, reserve_s, *a, **k):
            calls.append([name, sorted(sizes)[:3], len(sizes), round(reserve_s, 6), list(a), k,
                          max(sizes)])
            if name == "part_p2p":
                raise OSError("no peer")
        return part

    for n in ("part_allreduce", "part_alltoall", "part_p2p", "part_gather_scatter", "part_graph"):
        setattr(C, n, recorder(n))
    os.environ.update(RANK="0", WORLD_SIZE="1")
    rc = C.main(sys.argv[1:])
    print(json.dumps({"rc": rc, "calls": calls,
                      "nvls": os.environ["NCCL_NVLS_ENABLE"]}))
""")


def _run(tmp_path, *flags):
    out = tmp_path / "raw"
    p = subprocess.run([sys.executable, "-c", CHILD, "--out", str(out), "--backend", "gloo", *flags],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "NCCL_NVLS_ENABLE": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res, json.loads((out / "meta.json").read_text())


def test_every_part_in_order_with_its_reserve_and_a_failure_recorded(tmp_path):
    res, meta = _run(tmp_path, "--total-s", "150", "--max-bytes", str(1 << 20),
                     "--p2p-max-bytes", str(1 << 14))
    assert res["rc"] == 0
    assert res["nvls"] == "0"  # multicast forced off whatever the caller's environment says
    calls = res["calls"]
    assert [c[0] for c in calls] == ["part_allreduce", "part_alltoall", "part_p2p",
                                     "part_gather_scatter", "part_gather_scatter", "part_graph",
                                     "part_allreduce"]
    # reserves are of a 300 s run, scaled to --total-s
    assert [c[3] for c in calls] == [65.0, 50.0, 30.0, 22.5, 15.0, 7.5, 1.5]
    assert [c[4] for c in calls[3:5]] == [["allgather"], ["reducescatter"]]
    assert calls[-1][5] == {"second": True}
    assert calls[1][1] == [4096, 8192, 16384] and calls[2][2] == 3  # 4 KiB .. 16 KiB
    assert calls[0][1][0] == 2048 and calls[0][6] == 1 << 20
    assert set(meta["parts"]) == {"allreduce", "alltoall", "p2p", "allgather", "reducescatter",
                                  "graph", "allreduce2"}
    assert meta["parts"]["p2p"]["status"] == "failed: OSError: no peer"
    assert meta["parts"]["graph"]["status"] == "ok"
    assert meta["env"]["backend"] == "gloo" and meta["env"]["world_size"] == 1
    assert meta["method"].startswith("Collectives between GPUs")


def test_parts_flag_keeps_the_order_of_the_plan(tmp_path):
    res, meta = _run(tmp_path, "--parts", "graph,alltoall", "--max-bytes", str(4 << 20))
    assert [c[0] for c in res["calls"]] == ["part_alltoall", "part_graph"]
    assert list(meta["parts"]) == ["alltoall", "graph"]
    # the graph part gets the reduce sizes up to 1 MiB only
    assert res["calls"][0][6] == 4 << 20 and res["calls"][1][6] == 1 << 20
