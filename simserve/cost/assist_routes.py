"""Costs of DualPace's three Dense Assist routes (App. B) from the profiles: CPU stages from
the CPU tables, GPU stages from the GPU tables, activations over the PCIe link. The controls
that choose among the routes are `simserve.policies.dualpace.controls`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ASSIST_HOST_US = 300.0  # host launch + finalise per assist, ASSUMED from DualPace Fig. 12 (the
#                         RTX 4090 platform's 30 % beside a 0.7 ms CUDA segment); per platform:
#                         `policies.dualpace.controls.assist_host_us`


@dataclass(frozen=True, slots=True)
class RouteTimes:
    """Per-batch-size costs (ms) of App. B, arrays over the profiled batch sizes.

    t_p: CPU post-attention stage of one layer; t_l: CPU post-layer;
    tw_p, tw_ls, tw_la: waits of a GPU post-attention assist, a Split-Final post-layer assist,
    and a Fused-Assist final assist (launch + queue + GPU time + return);
    d_p, d_ls, d_la: GPU disturbance of each (host launch/finalise + CUDA time)."""

    t_p: np.ndarray
    t_l: np.ndarray
    tw_p: np.ndarray
    tw_ls: np.ndarray
    tw_la: np.ndarray
    d_p: np.ndarray
    d_ls: np.ndarray
    d_la: np.ndarray


def route_times_from(gpu_ops, cpu_ops, pcie, model, batches, host_us: float = ASSIST_HOST_US,
                     wait_us: float = 0.0):
    """App. B costs (ms) of the three Dense Assist routes from the profiles: CPU stages from
    the CPU tables, GPU stages from the GPU tables, activations over the PCIe link. `wait_us`
    is q_x, the mean wait of an assist for the GPU worker's next stage boundary, which depends
    on the GPU-main load (App. B measures it; here it is an input)."""
    h = model.hidden
    ln = pcie.link

    def h2d(nbytes):
        return ln["h2d_latency_us" if "h2d_latency_us" in ln else "latency_us"] + nbytes / (
            ln["h2d_gbps"] * 1e3)

    def d2h(nbytes):
        return ln["d2h_latency_us" if "d2h_latency_us" in ln else "latency_us"] + nbytes / (
            ln["d2h_gbps"] * 1e3)

    def arr(f):
        return np.array([f(b) for b in batches]) / 1e3

    post_cpu = lambda b: sum(float(cpu_ops.dense[o](b)) for o in ("o", "gate_up", "down"))
    post_gpu = lambda b: sum(float(gpu_ops.dense[o](b)) for o in ("o", "gate_up", "down",
                                                                  "elementwise"))
    head_cpu = lambda b: float(cpu_ops.lm_head(b))
    head_gpu = lambda b: float(gpu_ops.lm_head(b))
    act = lambda b: b * h * 2  # bf16 activations of b rows
    return RouteTimes(
        t_p=arr(post_cpu), t_l=arr(head_cpu),
        tw_p=arr(lambda b: host_us + wait_us + h2d(act(b)) + post_gpu(b) + d2h(act(b))),
        tw_ls=arr(lambda b: host_us + wait_us + h2d(act(b)) + head_gpu(b) + d2h(b * 4)),
        tw_la=arr(lambda b: host_us + wait_us + h2d(act(b)) + post_gpu(b) + head_gpu(b)
                  + d2h(b * 4)),
        d_p=arr(lambda b: host_us + post_gpu(b)), d_ls=arr(lambda b: host_us + head_gpu(b)),
        d_la=arr(lambda b: host_us + post_gpu(b) + head_gpu(b)),
    )
