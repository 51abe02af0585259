"""The `dualpace` policy end to end: completion, KV accounting, single ownership, isolated
timings against hand sums of cost-model stage times, the GPU-only limit, the KV envelope
(hypothesis) and PCIe traffic of Prefill-to-CPU."""
from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simserve.cost import prefill_batch
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies import get_policy, make_config
from simserve.policies.dualpace.envelope import migration_blocks
from simserve.policies.dualpace.gpu_schedule import gpu_partial
from simserve.policies.dualpace.state import NONE
from simserve.sim.cluster import Cluster
from simserve.sim.context import ArrivalSource, Recorder, SimContext
from simserve.sim.requests import RequestTable
from simserve.run import simulate_point
from tests.helpers import workload

HW = resolve_hardware(HardwareConfig(gpu="rtx4090", cpu="xeon-silver-4510", cpu_cores=12))
LLAMA = get_model("llama-3.1-8b")
N = LLAMA.num_layers
# Llama-3.1-8B KV per token: K and V × 8 KV heads × 128 dims × 2 bytes × 32 layers
KV_TOKEN = 2 * 8 * 128 * 2 * 32
# fast, deterministic controls unless a test says otherwise (no profile fits at build)
FAST = dict(gpu_token_limit=1024, cpu_batch_limit=64, assist_p=32, assist_f=16)


class Sim:
    """A dualpace simulation built by hand so tests can reach its engines."""

    def __init__(self, wl, params, check=None):
        cfg = make_config("dualpace", params)
        _, build = get_policy("dualpace")
        self.env = env = simpy.Environment()
        self.cluster = Cluster.build(env, HW.gpu, HW.num_gpus, HW.pcie, HW.nvlink)
        self.table = RequestTable(wl)
        src = ArrivalSource(env, self.table.arrival)
        self.ctx = SimContext(env=env, model=LLAMA, hardware=HW, cluster=self.cluster,
                              table=self.table, source=src, recorder=Recorder(),
                              rng=np.random.default_rng(0))
        self.dep = dep = build(self.ctx, cfg)
        src.handler = dep.on_arrival
        env.process(src.run())
        self.gpu, self.cpu = dep.engines
        self.st = self.gpu.st
        self.st.log = []
        self.num_events = 0
        last = -1.0
        while True:
            if check is not None and env.peek() > last:
                check(self)
                last = env.peek()
            try:
                env.step()
            except simpy.core.EmptySchedule:
                break
            self.num_events += 1


def _mixed(n=40, seed=1, rate=4.0):
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return workload(arr, rng.integers(200, 2500, n), rng.integers(2, 120, n))


TIGHT = dict(FAST, num_gpu_blocks_override=400, num_cpu_blocks_override=3000)


def test_every_request_finishes_and_pools_drain():
    s = Sim(_mixed(), TIGHT)
    t = s.table
    assert t.num_finished == t.n
    assert np.all(t.generated == t.output)
    assert s.st.gpu_pool.num_used == 0 and s.st.host_pool.num_used == 0
    assert not t.blocks.any() and not s.st.host_blocks.any()
    assert np.all(s.st.owner == NONE)
    assert s.st.gpu_pool.peak_used <= 400 and s.st.host_pool.peak_used <= 3000
    c = s.gpu.counts
    # the tight HBM pool must push work to the host tier, or the test proves nothing
    assert c["prefill_to_cpu"] > 0 and t.token_on_cpu.sum() > 0


def test_single_ownership_no_request_on_both_engines_at_once():
    s = Sim(_mixed(seed=2), TIGHT)
    spans = {}
    for t0, t1, eng, ids in s.st.log:
        for r in ids.tolist():
            spans.setdefault(r, []).append((t0, t1, eng))
    both = 0
    for r, sp in spans.items():
        g = [(a, b) for a, b, e in sp if e == "gpu"]
        c = [(a, b) for a, b, e in sp if e == "cpu"]
        both += bool(g and c)
        for a, b in g:
            for x, y in c:
                assert b <= x + 1e-12 or y <= a + 1e-12, f"request {r} on both engines"
    assert both > 0  # some requests did move between engines


def _gpu_cost():
    from simserve.cost import GpuCostModel
    return GpuCostModel(LLAMA, HW.gpu, 1, None, True, table_tokens=8192)


def test_isolated_gpu_request_matches_cost_model_sums():
    p, o = 700, 6
    s = Sim(workload([0.5], [p], [o]), dict(FAST, cpu_batch_limit=8, assist_p=16, assist_f=8))
    cm = _gpu_cost()   # C <= F: whole-forward GPU path, no boundary polls
    t = [0.5 + cm.step_s(prefill_batch(p))]
    for i in range(1, o):
        t.append(t[-1] + cm.decode_only_s(1, p + i))
    got = s.table.token_times[:o]
    assert got.tolist() == pytest.approx(t, rel=1e-12, abs=1e-12)
    assert not s.table.token_on_cpu.any()


def _pcie(nbytes, direction):
    ln = HW.pcie.link
    return ln["latency_us"] * 1e-6 + nbytes / (ln[f"{direction}_gbps"] * 1e9)


@pytest.mark.parametrize("route", ["full", "split", "fused"])
def test_isolated_cpu_request_matches_stage_sums(route):
    """A prompt too big for HBM goes Prefill-to-CPU: GPU prefill, 32 per-layer D2H copies
    issued as layers finish, then CPU decodes of batch 1 along the chosen route."""
    from simserve.cost.cpu import CpuCostModel
    p, o = 1000, 4
    pf = {"full": (2, 1), "split": (1, 0), "fused": (0, 0)}[route]
    s = Sim(workload([0.0], [p], [o]),
            dict(FAST, assist_p=pf[0], assist_f=pf[1], num_gpu_blocks_override=50,
                 boundary_poll_us=0.0))
    cm, cc = _gpu_cost(), CpuCostModel(LLAMA, HW.cpu, 12, 1)
    total = cm.step_s(prefill_batch(p))
    pre = (cm.iter_us + cm.per_seq_us) * 1e-6
    post = float(cm.ops.lm_head(1)) * 1e-6
    layer = (total - pre - post) / N
    copy = _pcie(p * KV_TOKEN / N, "d2h")
    end = 0.0
    for j in range(N):
        end = max(end, pre + (j + 1) * layer) + copy
    ready = max(end, total)
    # bf16 row; host launch + finalise per assist: DualPace Fig. 12's 30 % of a 0.7 ms-CUDA
    # assist on the 4090 platform, 0.7 x 30 / 70 ms (an assumption taken from the paper)
    h, host = LLAMA.hidden * 2, 0.7e-3 * 30 / 70
    post_attn = sum(float(cm.ops.dense[k](1)) for k in ("o", "gate_up", "down",
                                                        "elementwise")) * 1e-6
    head = float(cm.ops.lm_head(1)) * 1e-6
    times, now = [total], ready
    for i in range(1, o):
        sg = {k: v * 1e-6 for k, v in cc.stage_us(1, p + i).items()}
        if route == "full":
            now += cc.iteration_s(1, p + i)
        elif route == "split":
            now += sg["pre_layer"] + N * (sg["pre_attention"] + sg["attention"]
                                          + sg["post_attention"]) + cc.copy_us(h) * 1e-6
            now += host + head + _pcie(h, "h2d") + _pcie(4, "d2h")
        else:
            a = cc.copy_us(2 * h) * 1e-6
            now += sg["pre_layer"]
            for j in range(N):
                now += sg["pre_attention"] + sg["attention"] + a
                if j < N - 1:
                    now += host + post_attn + _pcie(2 * h, "h2d") + _pcie(2 * h, "d2h") + a
                else:
                    now += host + post_attn + head + _pcie(2 * h, "h2d") + _pcie(4, "d2h")
        times.append(now)
    assert s.table.token_times[:o].tolist() == pytest.approx(times, rel=1e-9)
    assert s.table.token_on_cpu[:o].tolist() == [False] + [True] * (o - 1)
    assert s.gpu.counts["prefill_to_cpu"] == 1


def test_infinite_gpu_pool_keeps_everything_on_the_gpu_like_a_gpu_only_run():
    wl = _mixed(n=30, seed=3, rate=6.0)
    big = dict(FAST, cpu_batch_limit=8, assist_p=16, assist_f=8, gpu_token_limit=10**6,
               num_gpu_blocks_override=10**7, max_num_seqs=256)
    s = Sim(wl, big)
    c = s.gpu.counts
    assert c["prefill_to_cpu"] == c["swap_out"] == c["swap_in"] == c["marks"] == 0
    assert not s.table.token_on_cpu.any() and s.cpu.num_batches == 0
    # a GPU-only engine with whole prompts (budget above every prompt) makes the same batches
    ref = simulate_point(wl, LLAMA, HW, "vllm", max_num_batched_tokens=10**5,
                         max_num_seqs=256, num_gpu_blocks_override=10**7)
    assert s.table.token_times.tolist() == pytest.approx(
        ref.records.token_times_s.tolist(), rel=1e-9)


def _envelope_ok(sim):
    st, t = sim.st, sim.table
    hp = st.host_pool
    assert int(t.blocks.sum()) == st.gpu_pool.num_used
    assert int(st.host_blocks.sum()) == hp.num_used
    assert hp.num_used <= hp.num_blocks and st.gpu_pool.num_used <= st.gpu_pool.num_blocks
    ids = np.asarray(st.cpu_running, dtype=np.int64)
    growth = int(np.maximum(st.peak[ids] - st.host_blocks[ids], 0).sum())
    # Q_G in eviction order: deferred swap-in marks at its head, the youngest at its tail
    # (with chunked prefill, a prompt prefilled in part on the GPU is GPU-owned too)
    q = [int(st.peak[r]) for r in sim.gpu.marks if st.marked[r]] + [
        int(st.peak[r]) for r in sim.gpu.running] + [int(st.peak[r]) for r in gpu_partial(sim.gpu)]
    mig = migration_blocks(q, st.gpu_pool.num_blocks)
    assert hp.num_used + growth + mig <= hp.num_blocks, "Eq. 2 violated"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(3, 30), seed=st.integers(0, 10**6), gpu_blocks=st.integers(90, 300),
       host_blocks=st.integers(100, 500), rate=st.floats(1.0, 30.0), chunked=st.booleans())
def test_envelope_never_violated(n, seed, gpu_blocks, host_blocks, rate, chunked):
    rng = np.random.default_rng(seed)
    wl = workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(16, 1200, n),
                  rng.integers(1, 200, n))
    s = Sim(wl, dict(FAST, num_gpu_blocks_override=gpu_blocks, num_cpu_blocks_override=host_blocks,
                     chunked_prefill=chunked), check=_envelope_ok)
    assert s.table.num_finished == n
    assert s.st.gpu_pool.num_used == 0 and s.st.host_pool.num_used == 0


def test_prefill_to_cpu_pcie_bytes_are_layer_copies_times_layers():
    prompts = [300, 900, 1500, 640]
    wl = workload([0.0, 0.01, 5.0, 5.02], prompts, [3, 3, 3, 3])
    # HBM smaller than any prompt: every prefill goes to the CPU; C <= F: no Dense Assist
    s = Sim(wl, dict(FAST, cpu_batch_limit=8, assist_p=16, assist_f=8,
                     num_gpu_blocks_override=16))
    d2h, h2d = s.cluster.gpus[0].d2h, s.cluster.gpus[0].h2d
    assert s.gpu.counts["prefill_to_cpu"] == 4 and s.gpu.counts["swap_out"] == 0
    assert d2h.bytes_moved == sum(prompts) * KV_TOKEN
    batches = len({round(a, 9) for a, b, e, ids in s.st.log if e == "gpu"})
    assert d2h.num_transfers == N * batches
    assert h2d.bytes_moved == 0 and s.gpu.worker.num_assists == 0


def test_dense_assist_is_served_between_gpu_stages_and_delays_the_main_batch():
    s = Sim(_mixed(n=30, seed=5, rate=8.0), dict(TIGHT, assist_p=0, assist_f=0))
    w = s.gpu.worker
    assert w.num_assists > 0 and s.dep.stats["dualpace_routes"][2] > 0
    # every assist moved activations both ways over PCIe
    assert s.cluster.gpus[0].h2d.num_transfers >= w.num_assists


def test_bad_configs_name_the_field():
    with pytest.raises(ConfigError, match="cpu_tp"):
        make_config("dualpace", {"cpu_tp": 0})
    with pytest.raises(ConfigError, match="assist_p"):
        make_config("dualpace", {"assist_p": 4, "assist_f": 8})
    with pytest.raises(ConfigError, match="host_kv_gib"):
        make_config("dualpace", {"host_kv_gib": -1})
    no_cpu = resolve_hardware(HardwareConfig(gpu="rtx4090"))
    with pytest.raises(ConfigError, match="hardware.cpu"):
        simulate_point(workload([0.0], [10], [2]), LLAMA, no_cpu, "dualpace")


def _controls(**kw):
    return simulate_point(workload([0.0], [10], [2]), LLAMA, HW, "dualpace",
                          **kw).stats["engines"][0]


def test_profile_controls_resolve_to_the_paper_s_4090_values():
    r = _controls()
    assert r["gpu_token_limit"] == 1024 and r["cpu_batch_limit"] == 256   # §4.3
    # the assist host cost is Fig. 12's (30 % of a 0.6-0.8 ms-CUDA assist: 0.3 ms), not a guess
    assert 257 <= r["assist_host_us"] <= 343
    assert r["assist_p"] == 32          # Fig. 7a: P = 32 on this platform
    # Alg. 1's exact minimum, ε = 0: the paper's (32, 0) (§4.3)
    assert _controls(assist_eps=0.0)["assist_f"] == 0


@pytest.mark.xfail(strict=True, reason="F does not match: (32, 2) here, the paper's (32, 16) at "
                   "ε = 0.25 %. On our derived profiles Full-CPU costs 0.9-1.5 % more than "
                   "Split-Final at b = 1-16, beyond the regret tolerance; the paper's chosen "
                   "pair cost +0.070 % over its exact minimum (issue 13 §3)")
def test_profile_controls_f_is_the_paper_s_16():
    assert _controls()["assist_f"] == 16


def test_chunked_prefill_isolated_request_is_the_sum_of_its_chunks():
    from simserve.cost import BatchShape
    p, o = 2500, 3                      # 1024 + 1024 + 452 under the 1024-token limit
    s = Sim(workload([0.0], [p], [o]), dict(FAST, chunked_prefill=True, cpu_batch_limit=8,
                                            assist_p=16, assist_f=8))
    cm = _gpu_cost()
    now = 0.0
    for ctx, n in ((0, 1024), (1024, 1024), (2048, 452)):
        now += cm.step_s(BatchShape(num_tokens=n, prefill_chunks=np.array([n]),
                                    prefill_ctx=np.array([ctx]), num_sample_rows=int(ctx + n == p)))
    times = [now]
    for i in range(1, o):
        times.append(times[-1] + cm.decode_only_s(1, p + i))
    assert s.table.token_times[:o].tolist() == pytest.approx(times, rel=1e-12)


def test_chunked_prefill_to_cpu_copies_every_chunk_once():
    prompts = [3000, 700, 2100]
    s = Sim(workload([0.0, 0.0, 0.0], prompts, [4, 4, 4]),
            dict(FAST, chunked_prefill=True, cpu_batch_limit=8, assist_p=16, assist_f=8,
                 num_gpu_blocks_override=16))
    assert s.table.num_finished == 3 and s.gpu.counts["prefill_to_cpu"] == 3
    assert s.cluster.gpus[0].d2h.bytes_moved == sum(prompts) * KV_TOKEN
    gpu_batches = sum(1 for *_, e, ids in s.st.log if e == "gpu")
    assert gpu_batches == -(-sum(prompts) // 1024)      # full 1024-token chunks, no gaps
    assert s.st.host_pool.num_used == 0 and s.table.token_on_cpu.sum() == 3 * 3


def test_hbm_pressure_swaps_out_from_the_tail_and_the_cpu_continues():
    # four 300-token prompts fit HBM (4 x 19 blocks of 100), but growing to 700 tokens each
    # (44 blocks) they cannot all stay: the youngest are swapped out and decode on the CPU
    s = Sim(workload([0.0, 0.0, 0.0, 0.0], [300] * 4, [400] * 4),
            dict(FAST, num_gpu_blocks_override=100, num_cpu_blocks_override=10_000,
                 cpu_batch_limit=8, assist_p=16, assist_f=8))
    t, c = s.table, s.gpu.counts
    assert c["prefill_to_gpu"] == 4 and c["swap_out"] >= 1
    assert t.num_finished == 4 and s.st.host_pool.num_used == 0
    d2h = s.cluster.gpus[0].d2h
    assert d2h.bytes_moved > 0 and d2h.bytes_moved % KV_TOKEN == 0   # whole tokens of KV
    on_cpu = [t.token_on_cpu[t.offsets[i]:t.offsets[i + 1]].any() for i in range(4)]
    assert not on_cpu[0]                  # the oldest is never the victim
    assert any(on_cpu[1:])
    # a request that moved decodes on one engine, then the other: its CPU tokens come after
    # its GPU tokens, in one contiguous stretch per move
    for i in range(4):
        flags = t.token_on_cpu[t.offsets[i]:t.offsets[i + 1]]
        assert np.count_nonzero(np.diff(flags.astype(int)) == -1) <= c["swap_in"]


def test_host_admission_limit_caps_cpu_owned_requests_at_prefill_to_cpu():
    seen = []

    def cpu_owned(sim):
        seen.append(len(sim.st.cpu_running) + len(sim.st.cpu_waiting))

    wl = workload([0.0] * 12, [500] * 12, [30] * 12)
    s = Sim(wl, dict(FAST, num_gpu_blocks_override=40, host_admission_limit=3,
                     cpu_batch_limit=8, assist_p=16, assist_f=8), check=cpu_owned)
    assert s.table.num_finished == 12 and s.gpu.counts["prefill_to_cpu"] >= 4
    assert max(seen) == 3          # never more than 3 CPU-owned (no swap-outs here)
    assert s.gpu.counts["swap_out"] == 0
