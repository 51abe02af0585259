"""`simserve.calibrate.smshare` without a GPU: stand-in torch, executor, partitions and timers (in a
child process, so the stand-ins never reach another test); the run's own logic is checked: which
rows it writes, ratios against the whole-GPU baselines, refused partitions, uncovered co-runs."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import sys, types
    from unittest import mock
    torch = mock.MagicMock(name="torch")
    torch.__version__ = "stand-in"
    torch.cuda.get_device_properties.return_value.multi_processor_count = 132
    torch.cuda.get_device_name.return_value = "stand-in GPU"
    torch.cuda.Stream.return_value = "whole"
    sys.modules["torch"] = torch
    ex_mod = types.ModuleType("simserve.calibrate.executor")

    class ExecBatch:
        def __init__(self, **k):
            self.k = k

    class GpuExecutor:
        def __init__(self, *a, **k):
            pass

        def prepare(self, b):
            return f"decode{b.k['decode_ctx'][0]}" if "decode_ctx" in b.k else "prefill"

        def forward(self, inp):
            pass

    ex_mod.ExecBatch, ex_mod.GpuExecutor = ExecBatch, GpuExecutor
    sys.modules[ex_mod.__name__] = ex_mod
    from simserve.calibrate import smshare as S

    class Partition:
        def __init__(self, s):
            if s == 24:
                raise RuntimeError("driver refused")
            self.sms, self.streams = (s, 132 - s), ("small", "rest")

    # alone: 100 us on the whole GPU, 400 on the small group, 150 on the rest
    S.Partition = Partition
    S.alone_us = lambda ex, inp, stream, n, reps, cover: {"whole": 100.0, "small": 400.0,
                                                          "rest": 150.0}[stream]

    def corun(ex, dinp, pinp, ds, ps, n_dec, n_pre, cover):
        return {"prefill_us": 300.0, "decode_inside": [500.0, 520.0], "start_gap_us": 2.0,
                "covered": dinp != "decode200"}
    S.corun = corun
    S.main(sys.argv[1:])
""")


def test_rows_ratios_and_refused_partitions(tmp_path):
    out = tmp_path / "raw"
    p = subprocess.run([sys.executable, "-c", CHILD, "--out", str(out), "--decode-sms", "16,24",
                        "--alone-sms", "8", "--decodes", "4x100,2x200", "--prefills", "512x0",
                        "--reps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "smshare.csv")))
    kinds = [(r["kind"], r["decode_sms"], r["prefill_sms"]) for r in rows]
    d, p_ = ("decode_alone", "{}", ""), ("prefill_alone", "", "{}")
    fill = lambda k, n: (k[0], k[1].format(n), k[2].format(n))  # noqa: E731
    assert kinds == [fill(d, 132), fill(d, 132), fill(p_, 132),  # whole GPU
                     fill(d, 8), fill(d, 8), fill(p_, 8),        # the 8-SM curve
                     fill(d, 16), fill(d, 16), fill(p_, 16),     # the 16-SM curve
                     fill(p_, 116),                              # prefill on the rest of 16
                     ("corun_decode", "16", "116"), ("corun_prefill", "16", "116"),
                     ("corun", "16", "116")]                     # 2x200: no covered run
    dec, pre, none = rows[-3], rows[-2], rows[-1]
    assert float(rows[3]["ratio"]) == 4.0 and float(rows[9]["ratio"]) == 1.5
    assert none["decode_batch"] == "2" and none["note"].startswith("no covered run: 0/3")
    assert none["corun_us"] == "" and dec["decode_batch"] == "4"
    assert float(dec["corun_us"]) == 510.0 and float(dec["ratio"]) == 510.0 / 400.0
    assert float(pre["corun_us"]) == 300.0 and float(pre["ratio"]) == 2.0
    assert dec["n"] == "3" and dec["note"].startswith("3/3 runs covered")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["partitions"] == {"8": [8, 124], "16": [16, 116]}  # 24 was refused
    assert meta["device_sms"] == 132 and set(meta["host_queue_ms_per_pass"]) == {
        "('d', (4, 100))", "('d', (2, 200))", "('p', (512, 0))"}
