"""`--trace-events`: a Chrome / Perfetto trace of every policy's iterations and transfers.
The file is trace-event JSON; every engine, rank and link gets its own track; the iteration
events cover exactly the iterations the recorder counted, end where the recorder sampled, never
overlap on one track, and a leap's event lasts exactly as long as the steps it stands for."""
from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
import yaml

from simserve.hardware.setup import resolve_hardware
from simserve.run import simulate_point
from simserve.runner.config import parse_experiment
from simserve.runner.point import make_workload

HW = {"one": "{gpu: h100-sxm, num_gpus: 1}", "four": "{gpu: h100-sxm, num_gpus: 4}",
      "cpu": "{gpu: rtx4090, num_gpus: 1, cpu: xeon-silver-4510, cpu_cores: 12, "
             "pcie: pcie4-x16}"}
# policy -> (hardware, rate, tracks that must exist (regexes), a link track must exist)
CASES = {
    "vllm": ("one", 8.0, [r"^engine 0$"], False),
    "sarathi": ("one", 8.0, [r"^engine 0$"], False),
    "chunked": ("four", 8.0, [r"^engine 0$"], False),
    "muxwise": ("four", 8.0, [r"^engine 0 prefill stream$", r"^engine 0 decode stream$"],
                False),
    "distserve": ("four", 8.0, [r"^prefill instance .*GPU 0,1", r"^decode instance .*GPU 2,3"],
                  True),
    "loongserve": ("four", 8.0, [rf"^instance 0 rank {r} \(GPU {r}\)$" for r in range(4)],
                   True),
    "conflux": ("four", 8.0, [rf"^instance 0 rank {r} \(GPU {r}\)$" for r in range(4)], True),
    "neo": ("cpu", 2.0, [r"^engine 0$"], True),
    "dualpace": ("cpu", 2.0, [r"^GPU engine 0$", r"^CPU engine 1$"], True),
}


def _simulate(policy, tmp_path, n=60, options="", trace=True):
    hw, rate, _, _ = CASES[policy]
    cfg = parse_experiment(yaml.safe_load(f"""\
name: t
model: llama-3.1-8b
hardware: {HW[hw]}
workload: {{trace: synthetic-conversation, num_requests: {n}, arrival: poisson, rates: [{rate}], seed: 0}}
policies:
  - {{name: {policy}{options}}}
slo: {{ttft_ms: 5000, tbt_ms: 1500}}
"""), "t.yaml")
    pol = cfg.policies[0]
    path = tmp_path / f"{policy}.json"
    res = simulate_point(make_workload(cfg, rate, 0), cfg.model, resolve_hardware(cfg.hardware),
                         pol.name, pol.config, trace_events=path if trace else None)
    return res, (json.loads(path.read_text()) if trace else None)


def _tracks(doc):
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    by = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by[names[(e["pid"], e["tid"])]].append(e)
    return names, by


@pytest.mark.parametrize("policy", sorted(CASES))
def test_trace_file_per_policy(policy, tmp_path):
    res, doc = _simulate(policy, tmp_path)
    _, _, want, links = CASES[policy]
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    for e in ev:  # the trace-event schema's fields, by phase
        assert e["ph"] in ("X", "M", "b", "e")
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["dur"] >= 0 and e["ts"] >= 0
        if e["ph"] in ("b", "e"):
            assert "id" in e and "cat" in e
    names, by = _tracks(doc)
    assert len(set(names.values())) == len(names)   # one track per name
    for pat in want:
        assert any(re.search(pat, n) for n in by), (pat, sorted(by))
    link_tracks = [n for n in by if by[n][0]["cat"] == "transfer"]
    assert bool(link_tracks) == links, link_tracks
    iters = {n: es for n, es in by.items() if es[0]["cat"] == "iteration"}
    # every iteration the recorder counted, once (an SP instance's step is drawn on each
    # rank and counted on rank 0)
    counted = sum(e["args"]["steps"] for n, es in iters.items()
                  if not re.search(r"rank [1-9]", n) for e in es)
    assert counted == res.recorder.num_iterations == res.trace.num_steps
    for n, es in iters.items():  # one batch at a time per track
        es = sorted(es, key=lambda e: e["ts"])
        for a, b in zip(es, es[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (n, a, b)
        for e in es:
            assert {"prefill_tokens", "decodes", "steps"} <= set(e["args"])
            assert any(k.endswith("kv_blocks_used") for k in e["args"])
    # the recorder samples at the end of an iteration: each sample is some event's end
    ends = sorted(e["ts"] + e["dur"] for es in iters.values() for e in es)
    import bisect
    for t in res.recorder.t:
        i = bisect.bisect_left(ends, t * 1e6 - 1e-3)
        assert i < len(ends) and abs(ends[i] - t * 1e6) <= 1e-3, (policy, t)
    spans = [e for e in ev if e["ph"] in ("b", "e")]
    assert len(spans) == 4 * res.records.num_requests


def test_leap_event_lasts_as_long_as_its_steps(tmp_path):
    leapt, doc_leapt = _simulate("vllm", tmp_path, n=40)
    stepped, doc_stepped = _simulate("vllm", tmp_path / "..", n=40, options=", leap: false")
    busy = [sum(e["dur"] for es in _tracks(d)[1].values() for e in es)
            for d in (doc_leapt, doc_stepped)]
    assert leapt.recorder.num_steps_scheduled < stepped.recorder.num_steps_scheduled
    assert busy[0] == pytest.approx(busy[1], rel=1e-9)
    n_leapt = len(_tracks(doc_leapt)[1]["engine 0"])
    assert n_leapt < len(_tracks(doc_stepped)[1]["engine 0"]) == stepped.recorder.num_iterations


def test_no_trace_by_default(tmp_path):
    res, _ = _simulate("vllm", tmp_path, n=10, trace=False)
    assert res.trace is None and res.recorder.trace is None
    assert not list(tmp_path.iterdir())


def test_run_command_writes_one_trace_per_point(tmp_path, capsys):
    from simserve.cli import main
    base = ["run", "quickstart", "--no-save", "-q", "--set", "workload.num_requests=30"]
    assert main([*base, "--set", "workload.rates=[4]", "--trace-events",
                 str(tmp_path / "one.json")]) == 0
    doc = json.loads((tmp_path / "one.json").read_text())
    assert "engine 0" in _tracks(doc)[1]
    assert main([*base, "--set", "workload.rates=[4,8]", "--trace-events",
                 str(tmp_path / "t.json")]) == 0
    assert sorted(p.name for p in tmp_path.glob("t-*.json")) == [
        "t-vllm-4req_s-seed0.json", "t-vllm-8req_s-seed0.json"]
    capsys.readouterr()
    assert main([*base, "--trace-events", str(tmp_path / "missing" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace-events" in err
