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

from simserve.policies.dualpace import controls
from simserve.models import DTYPE_BYTES
from simserve.policies.dualpace.gpu_worker import Assist
from simserve.sim.clock import at

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
        self._post_attn: dict[int, float] = {}
        self._post_layer: dict[int, float] = {}
        self._stage_fns: dict = {}   # CpuCostModel.stage_fn per batch size
        self._routes: dict[int, int] = {}   # π_{P,F}(b) per batch size (P, F are fixed)
        self.next_s = None      # when this batch's CPU side next acts (None: not known / idle)
        self.route_now = None   # the route of the batch in progress
        self.j = 0              # Fused-Assist: assists of layers < j are done
        self.layer = None       # Fused-Assist: (H2D, GPU s, D2H, CPU s after) of layers < N − 1
        self.pending = None     # the kind of assist it waits for on the event path

    def route(self, b: int) -> int:
        r = self._routes.get(b)
        if r is None:
            r = self._routes[b] = int(controls.route(self.p, self.f, b))
        return r

    # -- GPU-side compute of one assist (s), per batch size -----------------------------------
    def gpu_post_attention_s(self, b: int) -> float:
        v = self._post_attn.get(b)
        if v is None:
            ops = self.gpu.ops
            us = sum(float(ops.dense[o](b)) for o in ("o", "gate_up", "down", "elementwise"))
            v = self._post_attn[b] = (us + 2.0 * float(self.gpu.allreduce_us(b))) * 1e-6
        return v

    def gpu_post_layer_s(self, b: int) -> float:
        v = self._post_layer.get(b)
        if v is None:
            v = self._post_layer[b] = float(self.gpu.ops.lm_head(b)) * 1e-6
        return v

    # -- one batch ---------------------------------------------------------------------------
    def _sleep(self, delay: float):
        """Wait `delay` from now; `next_s` is when (what the GPU engine may leap up to)."""
        self.next_s = self.env.now + delay
        return self.env.timeout(delay)

    def run(self, b: int, ctx_sum: int):
        """A process body. While it sleeps, `next_s` is when it next acts and `route`, `j`
        where it stands: the GPU engine may serve assists in closed form meanwhile (a leap),
        advancing `j` and `next_s`; the batch then sleeps on to the new `next_s`."""
        cpu, N = self.cpu, self.N
        r = self.route_now = self.route(b)
        self.route_counts[r] += 1
        try:
            if r == FULL:
                yield self._sleep(cpu.iteration_s(b, ctx_sum))
                return r
            fn = self._stage_fns.get(b)
            if fn is None:
                fn = self._stage_fns[b] = cpu.stage_fn(b)
            s = fn(ctx_sum)                               # cpu.stage_us(b, ctx_sum)
            two_rows = 2 * b * self.act_bytes             # residual + attention output / hidden
            a_w = cpu.copy_us(two_rows)
            if r == SPLIT:
                h_w = cpu.copy_us(b * self.act_bytes)
                local = s["pre_layer"] + N * (s["pre_attention"] + s["attention"]
                                              + s["post_attention"]) + h_w
                yield self._sleep(local * 1e-6)
                yield from self._assist("split_final", b * self.act_bytes,
                                        self.gpu_post_layer_s(b), b * 4, None)
                return r
            a_r = cpu.copy_us(two_rows)
            layer_local = (s["pre_attention"] + s["attention"] + a_w) * 1e-6
            post_attn = self.gpu_post_attention_s(b)
            # per layer j < N − 1: (H2D, GPU s, D2H) of its assist, then the CPU part until the
            # next one (read the result, the next layer's pre-attention and attention)
            self.layer = (two_rows, post_attn, two_rows, a_r * 1e-6 + layer_local)
            self.j = 0
            # CPU work before the first assist (one event)
            yield self._sleep(s["pre_layer"] * 1e-6 + layer_local)
            while self.j < N - 1:
                if self.env.now < self.next_s:    # a GPU leap served some: sleep on
                    yield at(self.env, self.next_s)
                    continue
                self.j += 1
                yield from self._assist("post_attention", *self.layer)
            if self.env.now < self.next_s:
                yield at(self.env, self.next_s)
            yield from self._assist("fused_final", two_rows,
                                    post_attn + self.gpu_post_layer_s(b), b * 4, None)
            return r
        finally:
            self.next_s = self.route_now = None

    def _assist(self, kind: str, h2d_bytes: float, gpu_s: float, d2h_bytes: float, then):
        """One assist, then (unless `then` is None) `then` seconds of CPU work."""
        env, w = self.env, self.worker
        t = w.try_serve(h2d_bytes, gpu_s, d2h_bytes)
        if t is None:
            self.next_s, self.pending = None, kind
            yield w.submit(Assist(env, kind, h2d_bytes, gpu_s, d2h_bytes))
            self.pending = None
            if then is not None and self.next_s is None:   # (else a GPU leap went on)
                yield self._sleep(then)
        else:                                   # served in closed form: wake when it is done
            self.next_s = t if then is None else t + then
            if then is not None and w.chain:
                self._chain(h2d_bytes, gpu_s, d2h_bytes, then)
            yield at(env, self.next_s)

    def _chain(self, h2d_bytes: float, gpu_s: float, d2h_bytes: float, then: float) -> None:
        """Fused-Assist's next post-attention assists, served now in closed form while the
        main batch would serve each at `next_s` (`GpuWorker.serve_at`): one event for the
        whole chain instead of one per assist. Stops where stepping would not serve in
        closed form; the loop in `run` then goes on from there as before."""
        w, last = self.worker, self.N - 1
        if self.j < last:
            m, at_s = w.serve_chain(w.run, self.next_s, h2d_bytes, gpu_s, d2h_bytes, then,
                                    last - self.j)
            if m:
                self.j += m
                self.next_s = at_s
