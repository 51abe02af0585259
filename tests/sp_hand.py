"""Hand composition of an SP prefill iteration from the profiles' primitives, written
independently of `simserve.cost.sp` (shared by the conflux and loongserve tests)."""
from __future__ import annotations

import numpy as np

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model

HW4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
QWEN14 = get_model("qwen3-14b")


def alltoall_us(nbytes: float, ranks: int) -> float:
    ln = HW4.nvlink.link  # fitted latency + bus bandwidth (nccl-tests: busbw = (n-1)/n · bytes/t)
    return ln["alltoall_latency_us"] + (ranks - 1) / ranks * nbytes / (ln["alltoall_busbw_gbps"] * 1e3)


def lone_prefill_s(prompt: int, ranks: int, model=QWEN14, with_comm: bool = True,
                   comm_us_per_layer: float = 0.0) -> float:
    """One prompt split evenly over `ranks` TP1 ranks (prompt divisible by ranks), no decodes."""
    gpu = HW4.gpu
    ops1 = gpu.ops(model.name, 1)
    shard = prompt // ranks
    dense = sum(float(c(shard)) for c in ops1.dense.values())  # TP1: no all-reduce
    attn = float(gpu.ops(model.name, ranks).prefill_attn.us(np.array([prompt]), np.array([0])))
    comm = 0.0
    if ranks > 1 and with_comm:
        hd = model.head_dim * 2  # bytes per head per token
        comm = (alltoall_us(shard * (model.num_heads + 2 * model.num_kv_heads) * hd, ranks)
                + alltoall_us(shard * model.num_heads * hd, ranks))
    layer = dense + attn + comm + comm_us_per_layer
    oh = gpu.overheads
    assert shard > oh["graph_max_tokens"]  # eager launches: a layer is max(GPU, launch time)
    launch = oh["launch_us_per_kernel"] * oh["kernels_per_layer"]
    fwd = model.num_layers * max(layer, launch) + float(ops1.lm_head(1))
    situ = oh.get("in_situ")  # whole forwards over summed kernels, by the busiest rank's tokens
    if situ:
        fwd *= float(np.interp(np.log2(shard), np.log2(situ["tokens"]), situ["factor"]))
    return (oh["iteration_us"] + oh["per_seq_us"] + fwd) * 1e-6
