"""One focused test per scheduler rule of `../shared/notes/policies.md` that no other test pins.

Each test sets up the state in which the rule decides, runs one scheduling step (or a tiny
simulation) and asserts what the rule prescribes; each was checked to fail when its rule is
deleted from the policy (issue 13 §7).
"""
from __future__ import annotations

import numpy as np
import simpy

from simserve.models import get_model
from simserve.policies import get_policy, make_config
from simserve.sim.cluster import Cluster
from simserve.sim.context import ArrivalSource, Recorder, SimContext
from simserve.sim.requests import RequestTable
from tests.helpers import H100, workload


def _ints(x) -> list[int]:
    """A batch field (an int array, or a list for a small batch) as plain ints."""
    return [int(v) for v in x]


def engines_for(w, policy, hardware=H100, model="llama-3.1-8b", **params):
    """Build `policy`'s engines on `w` without running the simulation: (table, engines)."""
    cfg = make_config(policy, params)
    _, build = get_policy(policy)
    env = simpy.Environment()
    hw = hardware
    cluster = Cluster.build(env, hw.gpu, hw.num_gpus, hw.pcie, hw.nvlink)
    table = RequestTable(w)
    ctx = SimContext(env=env, model=get_model(model), hardware=hw, cluster=cluster, table=table,
                     source=ArrivalSource(env, table.arrival), recorder=Recorder(),
                     rng=np.random.default_rng(0))
    return table, build(ctx, cfg).engines


def _as_running(table, e, rid, generated, computed=None):
    """Put `rid` in `e`'s running list with `generated` outputs and `computed` tokens of KV
    (default: a decode, all but the newest token computed)."""
    table.generated[rid] = generated
    table.num_tokens[rid] = table.prompt[rid] + generated
    if computed is None:
        computed = int(table.num_tokens[rid]) - 1
    table.computed[rid] = computed
    nb = -(-computed // e.pool.block_size)
    e.pool.allocate(nb)
    table.blocks[rid] = nb
    e.running.append(rid)


# -- vLLM V1 (policies.md §2) ----------------------------------------------------------------

def test_vllm_admits_no_waiting_request_in_a_step_that_preempted():
    # 0 and 1 decode at a block boundary in a full pool: 0's next token preempts 1 (newest).
    # 1's recompute chunk (31 tokens under a 32-token budget) would fit in the blocks it freed,
    # but vLLM V1 schedules WAITING only if nothing was preempted in this step.
    w = workload([0, 0, 0], [64, 64, 16], [10, 10, 2])
    t, (e,) = engines_for(w, "vllm", enable_prefix_caching=False, max_num_batched_tokens=32, num_gpu_blocks_override=20)
    _as_running(t, e, 0, 1)   # 4 blocks full: the next token needs a fifth
    _as_running(t, e, 1, 1)
    e.pool.allocate(e.pool.num_free)  # nothing else free
    e.waiting.append(2)
    ids, n = e._schedule()
    assert _ints(ids) == [0] and _ints(n) == [1]
    assert list(e.waiting) == [1, 2] and e.running == [0]   # victim to the FRONT of waiting
    # the next step, with no preemption, admits from the head of waiting again (FCFS)
    ids, n = e._schedule()
    assert _ints(ids) == [0, 1] and _ints(n) == [1, 31]


def test_vllm_waiting_queue_is_strict_fcfs_head_of_line_blocking():
    # the head (a 200-token prompt) does not fit the free blocks; the small one behind it would,
    # but vLLM stops at the first request it cannot allocate
    w = workload([0, 0, 0], [33, 200, 16], [10, 2, 2])
    t, (e,) = engines_for(w, "vllm", enable_prefix_caching=False, max_num_batched_tokens=2048, num_gpu_blocks_override=20)
    _as_running(t, e, 0, 1)   # 3 blocks, room for its next token
    e.pool.allocate(e.pool.num_free - 5)  # 5 free: 2's prompt fits, 1's does not
    e.waiting.extend([1, 2])
    ids, _ = e._schedule()
    assert _ints(ids) == [0] and list(e.waiting) == [1, 2]


def test_vllm_allocates_only_the_first_chunk_of_a_prompt():
    # incremental allocation: a 1000-token prompt under a 256-token budget takes 16 blocks, not 63
    w = workload([0], [1000], [2])
    t, (e,) = engines_for(w, "vllm", enable_prefix_caching=False, max_num_batched_tokens=256, num_gpu_blocks_override=200)
    e.waiting.append(0)
    ids, n = e._schedule()
    assert _ints(n) == [256] and e.pool.num_used == 16


# -- Sarathi-Serve (policies.md §3) ----------------------------------------------------------

def test_sarathi_reserves_the_whole_prompt_at_admission():
    w = workload([0], [1000], [2])
    t, (e,) = engines_for(w, "sarathi", max_num_batched_tokens=256, num_gpu_blocks_override=200)
    e.waiting.append(0)
    ids, n = e._schedule()
    assert _ints(n) == [256] and e.pool.num_used == 63   # ceil(1000 / 16)


def test_sarathi_decodes_go_before_partial_prefills_in_the_budget():
    # 0 is mid-prefill (admitted first), 1 is a decode: with a 64-token budget the decode keeps
    # its token and the prefill gets the remaining 63 (stall-free batching)
    w = workload([0, 0], [1000, 32], [2, 10])
    t, (e,) = engines_for(w, "sarathi", max_num_batched_tokens=64, num_gpu_blocks_override=200)
    _as_running(t, e, 0, 0, computed=128)
    t.blocks[0] = 63                                 # whole prompt reserved at admission
    e.pool.allocate(63 - 8)
    _as_running(t, e, 1, 1)
    ids, n = e._schedule()
    assert dict(zip(_ints(ids), _ints(n))) == {1: 1, 0: 63}


# -- NEO (policies.md §1.2 step 4) -------------------------------------------------------------

def test_neo_once_a_prefill_goes_to_the_cpu_every_later_one_does():
    # GPU pool 100 blocks, 80 held by a decode (1279 KV tokens, 80 blocks after this step).
    # Waiting: a 500-token prompt (32 blocks: 112 > 100, Prefill-to-CPU), then a 100-token one
    # (7 blocks: 87 would fit the GPU). NEO's fairness rule sends the second to the CPU too.
    from tests.test_neo import _engine, _place
    from simserve.policies.neo.scheduler import next_round
    w = workload([0, 0, 0], [1200, 500, 100], [300, 5, 5])
    e = _engine(w, num_gpu_blocks_override=100, num_cpu_blocks_override=1000)
    _place(e, 0, 1279, "gpu")
    e.waiting.extend([1, 2])
    r = next_round(e)
    assert 2 not in r.pref_gpu.tolist() and 2 not in e.gpu_q
    assert r.pref_gpu.size == 0


# -- LoongServe (policies.md §4: `max_wait_tokens`) ---------------------------------------------

def test_loongserve_forms_a_prefill_only_after_max_wait_tokens_decode_iterations():
    # request 0 decodes alone; request 1 arrives during its first decode iterations. LoongServe
    # tries a prefill batch only when no decode runs or after max_wait_tokens (10) decode
    # iterations since the last prefill: 1's first token comes after 0's 11th token (the
    # prefill's token plus 10 decode iterations), not at the next iteration after it arrived
    from tests.sp_hand import HW4
    from simserve.run import simulate_point
    w = workload([0.0, 0.05], [2000, 500], [40, 5])
    rec = simulate_point(w, "qwen3-14b", HW4, "loongserve", scheduler="fcfs").records
    t0 = rec.token_times(0)
    assert t0[1] > 0.05 or t0[2] > 0.05            # 1 arrives while 0 is decoding
    assert rec.first_token_s[1] > t0[10]
    # and then it is not kept waiting longer: its SP prefill (two decode steps long here; 0
    # keeps decoding on another instance meanwhile) starts right after 0's 11th token
    assert rec.first_token_s[1] <= t0[12] + 1e-9
