"""The engine-core probe of `simserve.realcheck.vllm_probe` without vLLM or a GPU: stand-ins for
torch's CUDA events and for vLLM's engine core, scheduler and executor (in a child process, so
the stand-in torch never reaches another test) are instrumented and driven through a few
engine steps; the test checks what gets patched and every row the probe writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "simserve" / "realcheck" / "vllm_probe.py"

CHILD = textwrap.dedent("""
    import importlib.util, inspect, json, os, sys, types
    from types import SimpleNamespace as NS
    log = []

    class Event:
        n = 0

        def __init__(self, enable_timing=False):
            self.timing, self.at = enable_timing, None

        def record(self):
            Event.n += 1
            self.at = Event.n
            log.append(["record", self.at])

        def elapsed_time(self, end):
            log.append(["elapsed_time", self.at, end.at])
            return 1.5 * (end.at - self.at)

    torch = types.ModuleType("torch")
    torch.cuda = NS(Event=Event, synchronize=lambda: log.append(["synchronize"]))
    sys.modules["torch"] = torch
    spec = importlib.util.spec_from_file_location("probe_under_test", sys.argv[1])
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    clock = [0.0]

    def now():
        clock[0] += 1.0
        return clock[0]

    probe._now = now
    probe.atexit = NS(register=lambda f: log.append(["atexit", f.__name__]))
    out_dir = os.environ["SIMSERVE_PROBE_DIR"]

    def files():
        snap = {}
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as f:
                snap[name.replace(str(os.getpid()), "PID")] = f.read()
        return snap

    def new(req_id, prompt, computed):
        return NS(req_id=req_id, prompt_token_ids=prompt, num_computed_tokens=computed)

    def batch(new_reqs, cached, computed, sched, preempted=None, finished=(), resumed=()):
        return NS(scheduled_new_reqs=new_reqs, total_num_scheduled_tokens=sum(sched.values()),
                  num_scheduled_tokens=sched, finished_req_ids=set(finished),
                  preempted_req_ids=preempted,
                  scheduled_cached_reqs=NS(req_ids=cached, num_computed_tokens=computed,
                                           resumed_req_ids=set(resumed)))

    class Scheduler:
        def __init__(self, plan):
            self.plan, self.waiting, self.running, self.requests = plan, [1], [1, 2], {}
            self.busy = True        # whether requests are left after this step

        def schedule(self):
            log.append(["schedule"])
            return self.plan.pop(0)

        def update_from_output(self, so, model_output):
            log.append(["update_from_output", model_output])
            return {0: NS(outputs=[1, 2]), 1: NS(outputs=[3])} if model_output else {}

        def has_requests(self):
            return self.busy

    class Executor:
        def execute_model(self, so, non_block=False):
            log.append(["execute_model", non_block])
            return "out"

        def sample_tokens(self, grammar_output, non_block=False):
            log.append(["sample_tokens", grammar_output, non_block])
            return "sampled" if grammar_output is None else None

    class Core:
        def __init__(self, sched, backends):
            self.scheduler, self.model_executor, self.batch_queue_size = sched, Executor(), 2
            if backends:
                backend = lambda n: NS(backend=NS(get_name=lambda: n))
                self.model_executor.driver_worker = NS(worker=NS(model_runner=NS(
                    attn_groups=[[backend(b) for b in backends]])))
            self.vllm_config = NS(
                scheduler_config=NS(async_scheduling=False, max_num_batched_tokens=2048,
                                    max_num_seqs=64),
                cache_config=NS(enable_prefix_caching=True, num_gpu_blocks=100, block_size=16),
                compilation_config=NS(cudagraph_mode="FULL_AND_PIECEWISE",
                                      cudagraph_capture_sizes=(1, 2, 4),
                                      max_cudagraph_capture_size=4))

        def _process_engine_step(self):
            so = self.scheduler.schedule()
            out = self.model_executor.execute_model(so, non_block=True)
            self.model_executor.sample_tokens(None)
            self.model_executor.sample_tokens("no event left")
            self.scheduler.update_from_output(so, out if so.num_scheduled_tokens else None)
            return True

    class CoreWithWork(Core):
        def has_work(self):
            return self.scheduler.busy

    def attrs(o):
        return dict(vars(o))

    def patched(core):
        before = [attrs(core), attrs(core.scheduler), attrs(core.model_executor)]
        probe._instrument_core(core)
        after = [attrs(core), attrs(core.scheduler), attrs(core.model_executor)]
        return [{k: str(inspect.signature(v)) for k, v in a.items() if b.get(k) is not v}
                for b, a in zip(before, after)]

    result = {}
    plan = [batch([new("a", [1] * 5, 0), new("b", [1] * 3, 2), new("c", None, 0)], [], [],
                  {"a": 5, "b": 1, "c": 4}),
            batch([], ["a", "b"], [5, 3], {"a": 1, "b": 1}, preempted={"c"}, finished=["c"]),
            batch([], ["a", "b"], [6, 4], {"a": 1, "b": 1}, resumed=["a"]),
            batch([], ["a", "b"], [7, 5], {"a": 1, "b": 1}),
            batch([], [], [], {})]
    sched = Scheduler(plan)
    core = CoreWithWork(sched, ["FLASH_ATTN", "FLASHINFER", "FLASH_ATTN"])
    result["patched"] = patched(core)
    result["at_patch"] = log[:]
    del log[:]
    result["steps"] = []
    for step in range(5):
        if step == 2:
            sched.requests, sched.busy = {"b": object()}, False
        core._process_engine_step()
        result["steps"].append({"log": log[:], "files": files()})
        del log[:]
    sched = Scheduler([batch([new("d", [1, 2], 0)], [], [], {"d": 2})])
    sched.busy = False
    core = Core(sched, None)
    result["patched_without_has_work"] = patched(core)
    del log[:]
    core._process_engine_step()
    result["without_has_work"] = {"log": log[:], "files": files()}
    print(json.dumps(result))
""")


def transcript(tmp_path: Path, probe: Path = PROBE) -> dict:
    """What the probe in file `probe` patches and writes, step by step, for the scripted run."""
    env = {**os.environ, "SIMSERVE_PROBE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", CHILD, str(probe)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _rows(text: str) -> list:
    return [json.loads(line) for line in text.splitlines()]


def test_the_engine_core_probe_patches_and_writes_each_call(tmp_path):
    t = transcript(tmp_path)
    core, sched, ex = t["patched"]
    assert core == {"_process_engine_step": "()"}
    assert sched == {"schedule": "()", "update_from_output": "(so, model_output)"}
    assert ex == {"execute_model": "(so, non_block=False)",
                  "sample_tokens": "(grammar_output, non_block=False)"}
    s0, s1, s2, s3, s4 = t["steps"]
    assert t["at_patch"] == [["atexit", "flush"]]
    # the original methods still run, with their arguments; a CUDA event is recorded before
    # execute_model and after the first sample_tokens that follows it
    assert s0["log"] == [["schedule"], ["record", 1], ["execute_model", True],
                         ["sample_tokens", None, False], ["record", 2],
                         ["sample_tokens", "no event left", False], ["update_from_output", "out"]]
    # nothing is written while the engine has work; rows land when it has none
    assert list(s0["files"]) == ["meta-engine-PID.json"] and s1["files"] == s0["files"]
    meta = json.loads(s0["files"]["meta-engine-PID.json"])
    assert meta["attention_backend"] == "FLASHINFER,FLASH_ATTN"
    assert meta["cudagraph_capture_sizes"] == [1, 2, 4] and meta["batch_queue_size"] == 2
    assert meta["block_size"] == 16 and meta["max_num_seqs"] == 64
    assert ["synchronize"] not in s1["log"]
    assert s2["log"][-4:] == [["synchronize"], ["elapsed_time", 1, 2], ["elapsed_time", 3, 4],
                              ["elapsed_time", 5, 6]]
    assert s3["log"][-2:] == [["synchronize"], ["elapsed_time", 7, 8]]  # each event read once
    calls = _rows(s2["files"]["calls-PID.jsonl"])
    assert [(c["call"], c["batch"]) for c in calls] == [
        (name, b) for b in range(3) for name in
        ("schedule", "execute_model", "sample_tokens", "update_from_output", "step")]
    # one clock: each call's interval lies inside its step's, steps follow one another
    for b in range(3):
        step = calls[5 * b + 4]
        assert all(step["t0"] < c["t0"] < c["t1"] < step["t1"] for c in calls[5 * b:5 * b + 4])
    assert [c.get("outputs") for c in calls[3::5]] == [3, 3, 3]
    batches = _rows(s2["files"]["batches-PID.jsonl"])
    assert [r["batch"] for r in batches] == [0, 1, 2]
    assert [r["gpu_ms"] for r in batches] == [1.5, 1.5, 1.5]
    b0, b1, b2 = batches
    assert (b0["ids"], b0["n"], b0["prompt_len"], b0["tokens"]) == ([0, 1, 2], [5, 1, 4],
                                                                    [5, 3, -1], 10)
    assert b0["new"] == [[0, 5, 0], [1, 3, 2], [2, -1, 0]]
    assert (b1["cached_ids"], b1["cached_computed"], b1["preempted"], b1["finished"]) == (
        [0, 1], [5, 3], 1, 1)
    assert (b2["resumed"], b2["waiting"], b2["running"]) == (1, 1, 2)
    # prompt lengths of requests the scheduler no longer holds are dropped at a flush
    b3 = _rows(s3["files"]["batches-PID.jsonl"])[3]
    assert (b3["batch"], b3["ids"], b3["prompt_len"]) == (3, [0, 1], [-1, 3])
    c4 = _rows(s4["files"]["calls-PID.jsonl"])[20:]
    assert [c["call"] for c in c4] == ["schedule", "execute_model", "sample_tokens",
                                       "update_from_output", "step"]
    assert c4[3]["outputs"] == 0
    b4 = _rows(s4["files"]["batches-PID.jsonl"])[4]
    assert (b4["batch"], b4["ids"], b4["prompt_len"], b4["tokens"]) == (4, [], [], 0)


def test_without_has_work_the_scheduler_decides_when_to_write(tmp_path):
    t = transcript(tmp_path)
    assert t["patched_without_has_work"] == t["patched"]
    files = t["without_has_work"]["files"]
    assert json.loads(files["meta-engine-PID.json"])["attention_backend"] is None
    # a second core numbers its own batches and requests from 0
    b = _rows(files["batches-PID.jsonl"])[-1]
    assert (b["batch"], b["prompt_len"], b["new"]) == (0, [2], [[0, 2, 0]])
