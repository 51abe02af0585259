"""Dense Assist (DualPace §4.2, Eq. 5, App. B): how one CPU decode batch is executed.

    π_{P,F}(b) = Full-CPU (b ≤ F) | Split-Final (F < b ≤ P) | Fused-Assist (b > P)

Full-CPU: every stage on the CPU. Split-Final: all layers on the CPU, then one assist for the
post-layer (final norm, LM head, sampling). Fused-Assist: pre-layer and, per layer,
pre-attention and attention on the CPU; each post-attention stage is an assist, the last one
also runs the post-layer. The CPU side of an assist writes its inputs to the Assist Buffer
(a_w, h_w) and reads the result (a_r) at host copy bandwidth; the GPU side (launch/finalise,
CUDA compute, H2D and D2H over the PCIe channels) is served by the `GpuWorker` at its next
stage boundary. Thresholds come from Algorithm 1 over the profiles (`fit_thresholds`).
"""
from __future__ import annotations

import numpy as np

from simserve.hardware import controls
from simserve.models import DTYPE_BYTES
from simserve.policies.dualpace.gpu_worker import Assist

FULL, SPLIT, FUSED = 0, 1, 2
ROUTE_NAMES = ("full_cpu", "split_final", "fused_assist")


def fit_thresholds(cpu_cost, gpu_profile, model, gpu_tp: int, pcie, token_limit: int,
                   host_us: float, eps: float, lam: float) -> tuple[int, int]:
    """Algorithm 1 on the App. B route scores, with the stage-boundary wait q_x taken as half
    a GPU layer at the batched-token limit (`controls.stage_wait_us`), as `simserve profiles
    controls` does."""
    batches = np.array(controls.CPU_BATCHES)
    wait = controls.stage_wait_us(gpu_profile, model, gpu_tp, token_limit)
    rt = cpu_cost.assist_route_times(gpu_profile.ops(model.name, gpu_tp), pcie, batches,
                                     host_us=host_us, wait_us=wait)
    scores = controls.route_scores(rt, model.num_layers, lam)
    return controls.assist_thresholds(batches, scores, model.num_layers, eps)


class CpuBatchExecutor:
    """Runs one CPU decode batch (a SimPy process body) along its Dense Assist route."""

    def __init__(self, env, cpu_cost, gpu_cost, worker, p: int, f: int):
        self.env, self.cpu, self.gpu, self.worker = env, cpu_cost, gpu_cost, worker
        self.p, self.f = p, f
        m = cpu_cost.model
        self.N = m.num_layers
        self.act_bytes = m.hidden * DTYPE_BYTES          # one bf16 hidden row
        self.route_counts = [0, 0, 0]

    def route(self, b: int) -> int:
        return int(controls.route(self.p, self.f, b))

    # -- GPU-side compute of one assist (s) -------------------------------------------------
    def gpu_post_attention_s(self, b: int) -> float:
        ops = self.gpu.ops
        us = sum(float(ops.dense[o](b)) for o in ("o", "gate_up", "down", "elementwise"))
        return (us + 2.0 * float(self.gpu.allreduce_us(b))) * 1e-6

    def gpu_post_layer_s(self, b: int) -> float:
        return float(self.gpu.ops.lm_head(b)) * 1e-6

    # -- one batch ---------------------------------------------------------------------------
    def run(self, b: int, ctx_sum: int):
        env, cpu, N = self.env, self.cpu, self.N
        r = self.route(b)
        self.route_counts[r] += 1
        if r == FULL:
            yield env.timeout(cpu.iteration_s(b, ctx_sum))
            return r
        s = cpu.stage_us(b, ctx_sum)
        two_rows = 2 * b * self.act_bytes                 # residual + attention output / hidden
        a_w = cpu.copy_us(two_rows)
        if r == SPLIT:
            h_w = cpu.copy_us(b * self.act_bytes)
            local = s["pre_layer"] + N * (s["pre_attention"] + s["attention"]
                                          + s["post_attention"]) + h_w
            yield env.timeout(local * 1e-6)
            yield self.worker.submit(Assist(env, "split_final", b * self.act_bytes,
                                            self.gpu_post_layer_s(b), b * 4))
            return r
        a_r = cpu.copy_us(two_rows)
        layer_local = (s["pre_attention"] + s["attention"] + a_w) * 1e-6
        post_attn = self.gpu_post_attention_s(b)
        carry = s["pre_layer"] * 1e-6          # CPU work before the next assist (one event)
        for j in range(N):
            yield env.timeout(carry + layer_local)
            if j < N - 1:
                yield self.worker.submit(Assist(env, "post_attention", two_rows, post_attn,
                                                two_rows))
                carry = a_r * 1e-6              # read the result, then the next layer
            else:
                yield self.worker.submit(Assist(env, "fused_final", two_rows,
                                                post_attn + self.gpu_post_layer_s(b), b * 4))
        return r
