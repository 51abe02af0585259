"""vLLM variants written as a researcher would, from the documented scheduler interface only
(`simserve.policies.vllm_scheduler`, docs/how-to/add-a-policy.md): shortest prompt first, and
priority classes from a trace column with preemption for a waiting higher class. Each passes
`simserve check-policy`; the priority variant, which does not declare how it leaps, runs
stepped (one warning) with the results of stepping."""
from __future__ import annotations

import heapq
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from simserve.hardware.setup import HardwareConfig
from simserve.policies import register
from simserve.policies.queues import make_queue
from simserve.policies.vllm import VllmScheduler
from simserve.policies.vllm_engine import chunked_replicas
from simserve.policies.vllm_engine_config import ChunkedConfig
from simserve.policy_check import check
from simserve.run import simulate_point
from simserve.workload.build import load_trace
from simserve.workload.spec import Workload


# -- shortest prompt first (the whole variant) ---------------------------------------------
class ShortestPromptFirst(VllmScheduler):
    kind = "spf-example"

    def waiting_queue(self, table):
        return make_queue("srpt", table)  # fewest prompt tokens to compute first


@register("spf-example", ChunkedConfig)
def build_spf(ctx, cfg):
    return chunked_replicas(ctx, cfg, ShortestPromptFirst)


# -- priority classes, preempting a lower class for a waiting higher one -------------------
class ByPriority:
    """Waiting requests by (priority, id); lower priority values are served first."""

    def __init__(self, prio):
        self.prio, self.heap = prio, []

    def append(self, rid):
        heapq.heappush(self.heap, (self.prio[rid], rid))

    appendleft = append

    def popleft(self):
        return heapq.heappop(self.heap)[1]

    def __getitem__(self, i):
        return self.heap[0][1]

    def __len__(self):
        return len(self.heap)

    def __iter__(self):
        return (rid for _, rid in sorted(self.heap))


class Priority(VllmScheduler):
    kind = "priority-example"

    def waiting_queue(self, table):
        return ByPriority(table.attrs["priority"])

    def victim(self, s):  # the lowest class, newest first
        prio = s.table.attrs["priority"]
        return max(reversed(s.running), key=lambda r: prio[r])

    def admits(self, s, rid, blocks):
        prio = s.table.attrs["priority"]
        while not s.kv.pool.can_allocate(blocks) and s.running:
            victim = self.victim(s)
            if prio[victim] <= prio[rid]:
                return False
            s.preempt(victim)
        return s.kv.pool.can_allocate(blocks)


@register("priority-example", ChunkedConfig)
def build_priority(ctx, cfg):
    return chunked_replicas(ctx, cfg, Priority)


class FreshPriority(Priority):  # the same decisions, a class not yet warned about
    kind = "priority-example-fresh"


@register("priority-example-fresh", ChunkedConfig)
def build_fresh(ctx, cfg):
    return chunked_replicas(ctx, cfg, FreshPriority)


def _priority_trace(tmp_path, n=400, seed=3):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.1, n))
    rows = ["arrival_s,prompt_tokens,output_tokens,priority"]
    rows += [f"{float(a)!r},{int(p)},{int(o)},{int(c)}" for a, p, o, c in zip(
        t, rng.integers(100, 2000, n), rng.integers(20, 400, n), rng.integers(0, 3, n))]
    path = tmp_path / "prio.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


SMALL_POOL = {"num_gpu_blocks_override": 1000, "max_num_batched_tokens": 2048}


def test_shortest_prompt_first_admits_by_prompt_length_and_passes_check_policy():
    w = Workload(np.zeros(6), np.array([900, 50, 400, 20, 700, 200]), np.full(6, 8))
    r = simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h100-sxm"), "spf-example",
                       max_num_seqs=1).records
    assert list(np.argsort(r.first_token_s)) == list(np.argsort(w.prompt_tokens))
    assert check("spf-example", {"num_gpu_blocks_override": 400}, n=200, compiled=False) == []


def test_priority_preempts_a_lower_class_for_a_waiting_higher_one(tmp_path):
    path = _priority_trace(tmp_path)
    prio = load_trace(path).attrs["priority"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = simulate_point(load_trace(path), "llama-3.1-8b", HardwareConfig(gpu="h100-sxm"),
                           "priority-example", **SMALL_POOL).records
    fcfs = simulate_point(load_trace(path), "llama-3.1-8b", HardwareConfig(gpu="h100-sxm"),
                          "vllm", **SMALL_POOL).records
    pre = r.num_preemptions
    assert pre[prio == 0].sum() == 0 < pre[prio == 2].sum()  # the top class is never a victim
    ttft = [(x.first_token_s - x.arrival_s)[prio == 0].mean() for x in (r, fcfs)]
    assert ttft[0] < ttft[1] / 10  # ... and waits far less than under vLLM's FCFS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert check("priority-example", SMALL_POOL, trace=str(path), compiled=False) == []


def test_a_scheduler_without_a_declared_leap_runs_stepped_with_stepping_results(tmp_path):
    w = load_trace(_priority_trace(tmp_path))
    hw = HardwareConfig(gpu="h100-sxm")
    with pytest.warns(UserWarning, match="FreshPriority overrides a decision without "
                                         "defining leap_bound") as seen:
        a = simulate_point(w, "llama-3.1-8b", hw, "priority-example-fresh", **SMALL_POOL)
        simulate_point(w, "llama-3.1-8b", hw, "priority-example-fresh", **SMALL_POOL)
    assert len([x for x in seen if "leap_bound" in str(x.message)]) == 1  # once per class
    b = simulate_point(w, "llama-3.1-8b", hw, "priority-example", leap=False, **SMALL_POOL)
    assert np.array_equal(a.records.token_times_s, b.records.token_times_s)
    assert a.stats["num_iterations"] == a.stats["num_iterations_stepped"]


def test_numeric_trace_columns_reach_the_request_table_and_others_are_left_out(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,priority,weight,note\n"
                    "0.0,10,2,1,0.5,a\n0.1,20,3,0,1.5,b\n")
    w = load_trace(path)
    assert set(w.attrs) == {"priority", "weight"}
    assert w.attrs["priority"].tolist() == [1, 0] and w.attrs["weight"].tolist() == [0.5, 1.5]
    assert load_trace(path).attrs["priority"].dtype == np.int64  # the parse cache keeps them


def test_the_guides_vllm_variant_leaps_and_passes_check_policy():
    guide = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "add-a-policy.md"
    code = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)[1]
    exec(compile(code, "vllm_spf.py", "exec"), {"__name__": "vllm_spf"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it declares nothing and needs nothing: no warning
        assert check("vllm-spf", {"num_gpu_blocks_override": 400}, n=200, compiled=False) == []


def test_numeric_jsonl_keys_reach_the_workload(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "priority": 2,'
                    ' "tag": "x"}\n{"timestamp": 5, "input_length": 20, "output_length": 3,'
                    ' "priority": 0, "tag": "y"}\n')
    w = load_trace(path)
    assert set(w.attrs) == {"priority"} and w.attrs["priority"].tolist() == [2, 0]


def test_check_policy_claims_leaping_only_for_a_policy_that_leaps(capsys):
    from simserve.cli import main
    assert main(["check-policy", "loongserve", "-n", "40", "--num-gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "no leap switch: stepped only" in out and "leaping = stepping" not in out
    assert main(["check-policy", "vllm", "-n", "40", "--no-compiled"]) == 0
    assert "leaping = stepping" in capsys.readouterr().out
