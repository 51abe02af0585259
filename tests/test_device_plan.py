"""The device plan (docs/device-plan.md) runs on a GPU day only; its dry runs run here, so a
broken plan (a plan file without a field, a post-processing command that no longer exists, a
payload part over a call's limit, output a call would not bring back) fails CI first."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from simserve import device_check as D
from simserve.realcheck import sglang_steps as S

ROOT = Path(__file__).resolve().parent.parent


# -- every dry run ----------------------------------------------------------------------------
def _dry(module: str, argv: list[str]) -> int:
    import importlib
    return importlib.import_module(module).main(argv)


@pytest.mark.parametrize("module,argv", [
    ("benchmarks.sglang_device_plan", ["--dry-run"]),
    ("benchmarks.inprocess_vllm", ["--dry-run"]),
    ("benchmarks.neo_host_probe", ["--dry-run"]),
    ("benchmarks.nccl_sweep", ["--dry-run"]),
    ("simserve.calibrate.amx_probe", ["--dry-run"]),
])
def test_dry_run_passes(module, argv, capsys):
    assert _dry(module, argv) == 0, capsys.readouterr().out
    assert "dry run: ok" in capsys.readouterr().out


def test_sglang_dry_run_fails_on_a_plan_without_its_fields(monkeypatch, tmp_path):
    import benchmarks.sglang_device_plan as P
    plans = tmp_path / "validation" / "vllm-h200" / "plans"
    plans.mkdir(parents=True)
    for model in P.PLANS_BY_MODEL:
        for name in P.plans_for(model):
            (plans / f"{name}.json").write_text(json.dumps({"requests": [{"t": 0.0, "p": 8}]}))
    monkeypatch.setattr(P, "REPO", str(tmp_path))
    assert P.dry_run(480.0, payload=False) == 1, "a plan without the output field passed"
    for model in P.PLANS_BY_MODEL:
        for name in P.plans_for(model):
            (plans / f"{name}.json").write_text(json.dumps({"requests": [{"t": 0.0, "p": 8,
                                                                           "o": 2}]}))
    assert P.dry_run(480.0, payload=False) == 0   # the same plans with every field pass


def test_sglang_dry_run_fails_past_the_budget():
    import benchmarks.sglang_device_plan as P
    assert P.dry_run(budget_s=60.0, payload=False) == 1


def test_nccl_dry_run_fails_on_a_starved_rank_count():
    import benchmarks.nccl_sweep as N
    assert N.dry_run(200.0, [4, 8]) == 1


def test_built_payload_parts_fit_a_call():
    """Where the SGLang payload is built (benchmarks/sglang_payload/build.sh), every part fits
    one call beside the tree; skipped where it is not."""
    parts = sorted(p for p in (ROOT / ".sglang").glob("p[0-9]*") if p.is_dir())
    if not parts:
        pytest.skip("SGLang payload not built")
    assert D.parts_problems([str(p) for p in parts], D.tree_bytes(str(ROOT))) == []
    assert (ROOT / ".sglang" / "site.sha256").is_file()
    # the plan document's call table names as many parts as the build made
    assert f"`.sglang/p1`..`p{len(parts)}`" in (ROOT / "docs" / "device-plan.md").read_text()


def test_sglang_probe_counts_a_decode_from_the_batch_lengths():
    """Under the overlap schedule a request's output_ids can lag a step: the batch's own
    lengths say what the step computes."""
    from benchmarks.sglang_device_plan import _Batch, _batch_reqs, _Req
    b = _Batch(True, [_Req("p-0", 128, 0), _Req("p-1", 64, 5)])
    b.seq_lens_cpu = [129, 70]
    assert _batch_reqs(b) == [("p-0", 1, 128, 128), ("p-1", 1, 69, 64)]
    del b.seq_lens_cpu
    assert _batch_reqs(b)[1] == ("p-1", 1, 68, 64)
    e = _Batch(False, [_Req("p-2", 300, 0)], ext=[256], pre=[0])
    assert _batch_reqs(e) == [("p-2", 256, 0, 300)]


def test_import_closure_follows_load_time_imports_only(tmp_path):
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks" / "sglang_payload"))
    import import_closure as I
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text(
        "import foo\ntry:\n    import bar\nexcept ImportError:\n    pass\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import baz\n")
    (site / "sglang" / "engine.py").write_text(
        "import numpy\nfrom .x import y\nimport mini\n\ndef f():\n    import inner\n")
    (site / "sglang" / "x.py").write_text("import qux\n")
    (site / "mini").mkdir()
    (site / "mini" / "__init__.py").write_text("import deep\n")
    found = I.hard_imports(str(site), starts=("sglang.engine",))
    assert set(found) == {"foo", "numpy", "qux", "deep"} and found["qux"] == "sglang.x"
    assert set(I.missing(str(site), starts=("sglang.engine",))) == {"foo", "qux", "deep"}


# -- the call limits --------------------------------------------------------------------------
def test_return_problems_names_what_would_not_come_back(tmp_path):
    assert D.return_problems(str(tmp_path)) == []
    for i in range(9):
        (tmp_path / f"f{i}.txt").write_text("x")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "g.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    probs = " | ".join(D.return_problems(str(tmp_path)))
    assert "11 files" in probs and "more than 2 folders down" in probs
    assert "bad name.txt" in probs


def test_parts_problems_part_over_the_limit_and_missing(tmp_path):
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "x.00").write_bytes(b"0" * 2000)
    probs = D.parts_problems([str(tmp_path / "p1"), str(tmp_path / "p2")], tree=0, part_bytes=1000)
    assert any("over the part limit" in p for p in probs)
    assert any("p2: missing" in p for p in probs)
    assert D.parts_problems([str(tmp_path / "p1")], tree=D.CARRY_BYTES - 1000) != []


def test_pack_round_trip(tmp_path):
    raw = tmp_path / "raw" / "sub"
    raw.mkdir(parents=True)
    (raw / "a.json").write_text("{}")
    D.pack(str(tmp_path / "raw"), str(tmp_path / "OUT"), "x")
    assert os.listdir(tmp_path / "OUT") == ["x.tar.xz"]
    back = D.unpack(str(tmp_path / "OUT" / "x.tar.xz"), str(tmp_path / "back"))
    assert (Path(back) / "sub" / "a.json").read_text() == "{}"


# -- SGLang's step log reader -----------------------------------------------------------------
def _log(tmp_path, rows, reqs=None):
    with open(tmp_path / "steps-42.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for plan, rr in (reqs or {}).items():
        with open(tmp_path / f"requests-{plan}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rr)
    (tmp_path / "meta.json").write_text(json.dumps({"model": "llama-3.1-8b"}))


def _row(t0, gpu, reqs, mode="ForwardMode.EXTEND"):
    from benchmarks.sglang_device_plan import step_row
    return step_row(t0, t0 + 0.0005, gpu, mode, reqs)


def test_sglang_reader_builds_steps_by_plan_index(tmp_path):
    rows = [_row(9.0, 5.0, [("warmup-0", 1, 40, 32)], "ForwardMode.DECODE"),
            _row(10.0, 8.0, [("p-1", 256, 0, 300), ("p-0", 1, 500, 400)], "ForwardMode.MIXED"),
            _row(10.010, 6.0, [("p-1", 44, 256, 300), ("warmup-3", 8, 0, 32)]),
            _row(10.017, 5.0, [("p-1", 1, 300, 300), ("p-0", 1, 501, 400)], "ForwardMode.DECODE"),
            _row(20.0, 5.0, [("p-0", 1, 502, 400)], "ForwardMode.DECODE")]
    _log(tmp_path, rows)
    steps = S.plan_steps(S.load_steps(str(tmp_path)), "p", origin=10.0)
    assert len(steps) == 4                                  # the warm-up-only step is left out
    assert steps[0].reqs == {1: (256, 0), 0: (1, 500)} and steps[0].kind == "mixed"
    assert steps[1].kind == "prefill" and S.FOREIGN in steps[1].reqs
    assert steps[2].kind == "decode" and steps[2].prompt == {1: 300, 0: 400}
    assert steps[0].t0 == pytest.approx(0.0) and steps[0].sched_ms == pytest.approx(0.5)
    # periods where the scheduler ran back to back; the 10 s idle gap gets none
    assert steps[0].period_ms == pytest.approx(10.0) and steps[1].period_ms == pytest.approx(7.0)
    assert steps[2].period_ms is None


def test_sglang_reader_does_not_take_a_prefix_of_another_plan(tmp_path):
    _log(tmp_path, [_row(1.0, 5.0, [("p-x-0", 8, 0, 8)]), _row(2.0, 5.0, [("p-3", 8, 0, 8)])])
    steps = S.plan_steps(S.load_steps(str(tmp_path)), "p")
    assert len(steps) == 1 and list(steps[0].reqs) == [3]


def test_sglang_reader_names_file_and_line_of_a_bad_row(tmp_path, capsys):
    row = _row(1.0, 5.0, [("p-0", 8, 0, 8)])
    del row["computed"]
    _log(tmp_path, [_row(0.5, 5.0, [("p-0", 8, 0, 8)]), row])
    with pytest.raises(ValueError, match=r"steps-42\.jsonl:2: step row lacks computed"):
        S.load_steps(str(tmp_path))
    assert S.main([str(tmp_path)]) == 2
    assert "steps-42.jsonl:2" in capsys.readouterr().err


def test_sglang_scoring_prices_steps_and_reads_client_times(tmp_path):
    rows = [_row(1.0 + 0.01 * k, 6.0, [("p-0", 1, 100 + k, 100), ("p-1", 1, 90 + k, 90)],
                 "ForwardMode.DECODE") for k in range(5)]
    sends = {"p": [{"i": 0, "send": 0.98, "chunks": [1.0, 1.01, 1.02]},
                   {"i": 1, "send": 0.99, "chunks": [1.0, 1.01, 1.05]}]}
    _log(tmp_path, rows, sends)
    (d,) = S.score(str(tmp_path))
    assert d["kinds"] == {"mixed": 0, "decode": 5, "prefill": 0}
    g = d["step_time"]["decode"]["gpu"]
    assert g["n"] == 5 and g["real_mean_ms"] == pytest.approx(6.0) and g["pred_mean_ms"] > 0
    assert d["client"]["mean_ttft_ms"] == pytest.approx(15.0)
    assert d["client"]["p99_itl_ms"] == pytest.approx(40.0, rel=0.05)


def test_tp_campaign_names_existing_plans_and_tp_servers():
    steps = json.loads((ROOT / "benchmarks" / "vllm_tp_campaign.json").read_text())
    assert steps[0] == {"do": "setup"}
    tps = [s["args"][s["args"].index("--tensor-parallel-size") + 1]
           for s in steps if s["do"] == "server"]
    assert tps == ["2", "4"]
    for s in steps:
        if s["do"] == "plan":
            assert (ROOT / s["file"]).is_file(), s["file"]


# -- the plan document ------------------------------------------------------------------------
def test_plan_document_names_existing_scripts_and_fits_the_budget():
    text = (ROOT / "docs" / "device-plan.md").read_text()
    for path in set(re.findall(r"`((?:benchmarks|simserve)/[\w/.-]+\.(?:py|sh))", text)):
        assert (ROOT / path).exists(), path
    for mod in set(re.findall(r"python3? -m (simserve(?:\.\w+)+)", text)):
        assert (ROOT / (mod.replace(".", "/") + ".py")).exists(), mod
    sessions = text.split("\n## Session ")[1:]
    assert len(sessions) >= 4
    for sec in sessions:
        start = int(re.search(r"Machine start \(counted\): (\d+) s", sec).group(1))
        calls = []
        for row in sec.split("\n## ")[0].splitlines():
            if re.match(r"\| \d+(-\d+)? \|", row):
                n, _, each = row.split("|")[4].strip().partition(" × ")
                calls.append((int(n) if each else 1, int(each or n)))
        assert calls and all(each <= 600 for _, each in calls), sec[:40]   # one call's limit
        total = start + sum(n * each for n, each in calls)
        assert total <= 30 * 60, f"session {sec[:1]}: {total} s of device time"
    assert "docs/device-plan.md" in (ROOT / "README.md").read_text()
