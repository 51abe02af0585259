"""`python -m simserve.calibrate.run_all` without a GPU or torch: the measured parts are replaced by
recorders (in a child process, so the stand-in torch never reaches another test), and the run's
own logic is checked: which part gets which grid, skipped and failed parts, meta.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, sys, types
    from unittest import mock
    torch = mock.MagicMock(name="torch")
    torch.__version__ = "stand-in"
    torch.cuda.is_available.return_value = False
    sys.modules["torch"] = torch
    import simserve.calibrate as pkg
    calls = []

    def stand_in(mod, names, **consts):
        m = types.ModuleType("simserve.calibrate." + mod)
        for n in names:
            def rec(*a, _n=mod + "." + n, **k):
                calls.append([_n, [x for x in a if isinstance(x, (int, str, list))], k])
                if _n == "gpu_ops.dense":
                    raise RuntimeError("no kernel")
            setattr(m, n, rec)
        for k, v in consts.items():
            setattr(m, k, v)
        sys.modules[m.__name__] = m
        setattr(pkg, mod, m)

    stand_in("gpu_ops", ["ceilings", "dense", "prefill", "mixed_varlen", "decode"], TOKENS=[1, 2])
    stand_in("links", ["links"])
    stand_in("launch", ["launch"])
    stand_in("cpu_ops", ["cpu_dense", "cpu_attn"], CPU_TOKENS=[7])
    from simserve.calibrate import run_all
    rc = run_all.main(sys.argv[1:])
    print(json.dumps({"rc": rc, "calls": calls}))
""")


def _run(tmp_path, *flags):
    out = tmp_path / "raw"
    p = subprocess.run([sys.executable, "-c", CHILD, "--out", str(out), *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res, json.loads((out / "meta.json").read_text())


def test_parts_run_in_order_and_a_failing_part_does_not_stop_the_rest(tmp_path):
    res, meta = _run(tmp_path, "--device", "cpu", "--smoke", "--parts", "dense,links,decode,cpu",
                     "--cpu-threads", "1,1", "--cpu-attention", "no", "--test-model", "tiny")
    assert res["rc"] == 0
    parts = meta["parts"]
    assert parts["dense"]["status"] == "failed: RuntimeError: no kernel"
    assert parts["links"]["status"] == "skipped: no cuda"
    assert parts["decode"]["status"] == parts["cpu"]["status"] == "ok"
    assert parts["cpu_threads"] == [1, 1]
    names = [c[0] for c in res["calls"]]
    assert names == ["gpu_ops.ceilings", "gpu_ops.dense", "gpu_ops.decode",
                     "cpu_ops.cpu_dense", "cpu_ops.cpu_dense"]
    # --test-model stands in for every model; --smoke picks the small grids
    dense_args = res["calls"][1][1]
    assert [m for m, _ in dense_args[1]] == ["tiny", "tiny"]
    assert dense_args[2] == [1, 16, 256, 1024]
    assert res["calls"][2][1][1] == "tiny"
    assert res["calls"][3][2]["tokens"] == [1, 8, 64]
    assert meta["grid"] == "standard" and meta["smoke"] is True and meta["device_used"] == "cpu"


def test_dense_configs_and_grid_flags_reach_the_parts(tmp_path):
    res, meta = _run(tmp_path, "--device", "cpu", "--parts", "dense,prefill",
                     "--dense-configs", "qwen3-14b:2,llama-3.1-8b:8", "--grid", "dense")
    names = [c[0] for c in res["calls"]]
    # the dense grid measures no mixed varlen batches; the Qwen3 head configs follow Llama's
    assert names == ["gpu_ops.ceilings", "gpu_ops.dense", "gpu_ops.prefill", "gpu_ops.prefill",
                     "gpu_ops.prefill"]
    assert res["calls"][1][1][1] == [["qwen3-14b", 2], ["llama-3.1-8b", 8]]
    assert [c[1][1] for c in res["calls"][2:]] == ["llama-3.1-8b", "qwen3-14b", "qwen3-32b"]
    assert meta["grid"] == "dense"
    # the dense grid doubles each GPU part's own budget
    assert meta["parts"]["prefill"]["budget_s"] == 2 * 55
