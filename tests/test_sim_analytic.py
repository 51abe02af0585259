"""Analytic limits the simulator must reproduce (validation ladder step 1)."""
from __future__ import annotations

import numpy as np

from simserve.cost import GpuCostModel, prefill_batch
from simserve.models import get_model
from simserve.sim.cluster import Channel
from simserve.run import simulate_point
from tests.helpers import H100, workload

M8 = get_model("llama-3.1-8b")


def test_isolated_request_latency_is_one_prefill_plus_decode_steps():
    # requests 1000 s apart never overlap: E2E = prefill step + (n-1) decode steps
    prompts, outputs = [700, 3000, 64], [50, 1, 300]
    w = workload([0.0, 1000.0, 2000.0], prompts, outputs)
    res = simulate_point(w, M8, H100, "vllm", max_num_batched_tokens=4096)
    cost = GpuCostModel(M8, H100.gpu, 1, None)
    for i, (p, n) in enumerate(zip(prompts, outputs)):
        expect = cost.step_s(prefill_batch(p))
        expect += sum(cost.decode_only_s(1, p + j + 1) for j in range(n - 1))
        e2e = res.records.finish_s[i] - res.records.arrival_s[i]
        assert abs(e2e - expect) < 1e-9 * max(1.0, expect)


def test_single_prefill_server_matches_md1_waiting_time():
    # one-token outputs and a token budget of one prompt: a FIFO M/D/1 queue with
    # service D = prefill time; mean wait Wq = rho D / (2 (1 - rho)) (Pollaczek-Khinchine)
    p, n = 1024, 20000
    D = GpuCostModel(M8, H100.gpu, 1, None).prefill_only_s(p)
    rho = 0.7
    rng = np.random.default_rng(1)
    arr = np.cumsum(rng.exponential(D / rho, n))
    w = workload(arr, [p] * n, [1] * n)
    res = simulate_point(w, M8, H100, "vllm", max_num_batched_tokens=p)
    ttft = res.records.first_token_s - res.records.arrival_s
    assert np.allclose(ttft.min(), D)
    wq = rho * D / (2 * (1 - rho))
    assert abs((ttft.mean() - D) - wq) / wq < 0.06


def test_decode_step_is_weight_streaming_bound_at_batch_one():
    # roofline: at batch 1 a decode step reads every weight once, so it cannot beat the
    # datasheet bandwidth (3.35 TB/s on an H100), and it is far from compute-bound
    cost = GpuCostModel(M8, H100.gpu, 1, None)
    t = cost.decode_only_s(1, 100)
    stream = M8.weight_bytes / 3.35e12
    assert stream < t < 2 * stream


def test_decode_step_prediction_against_measured_cuda_graph_step():
    # the H200 calibration timed whole 32-layer Llama-3.1-8B decode steps (context 1024)
    # replayed from a CUDA graph; summing separately timed kernels over-predicts them by up
    # to 10 %, which the profile's graph_overlap_us_per_kernel (one parameter fitted to these
    # four steps) takes out: a regression guard on the composition, not an out-of-sample test
    import pandas as pd
    from simserve.hardware.profile import REPO_ROOT, load_profile
    raw = pd.read_csv(REPO_ROOT / "hwprofiles/raw/h200-sxm/launch.csv")
    steps = raw[(raw.op == "decode_step_graph") & (raw.timer == "cuda_events")]
    cost = GpuCostModel(M8, load_profile("h200-sxm"), 1, None)
    for b, measured_us in zip(steps.batch.astype(int), steps.median_us):
        host = cost.iter_us + cost.per_seq_us * b + cost.graph_us
        gpu_us = cost.decode_only_s(b, b * 1025) * 1e6 - host
        assert abs(gpu_us - measured_us) / measured_us < 0.06, (b, gpu_us, measured_us)


def test_tensor_parallelism_shrinks_dense_time_and_adds_allreduce():
    c1 = GpuCostModel(M8, H100.gpu, 1, None)
    c4 = GpuCostModel(M8, H100.gpu, 4, H100.nvlink)
    for tokens in (1, 256, 8192):
        # faster than one GPU, never better than perfect 4-way scaling
        assert c1.dense_layer_us(tokens) / 4 < c4.dense_layer_us(tokens) < c1.dense_layer_us(tokens)
    assert c4.allreduce_us(8192) > c4.allreduce_us(1) > 0


def test_step_time_is_monotone_in_tokens_and_context():
    cost = GpuCostModel(M8, H100.gpu, 1, None)
    ctx = np.arange(0, 2_000_000, 10_000)
    d = cost.decode_only_s(64, ctx)
    assert np.all(np.diff(d) > 0)
    dense = [cost.dense_layer_us(t) for t in range(1, 20000, 97)]
    assert np.all(np.diff(dense) >= 0)


def test_pcie_channel_serialises_concurrent_transfers():
    import simpy
    env = simpy.Environment()
    ch = Channel(env, "h2d", gbps=25.0, latency_us=10.0)
    done = []

    def one(tag):
        yield from ch.transfer(250e6)
        done.append((tag, env.now))

    env.process(one("a"))
    env.process(one("b"))
    env.run()
    d = 10e-6 + 250e6 / 25e9
    assert done[0] == ("a", d)
    assert abs(done[1][1] - 2 * d) < 1e-12
