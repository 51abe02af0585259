"""GPU memory accounting: how many KV blocks fit on one rank after weights and reserves.

    KV bytes = HBM × utilisation − weights/rank − activation reserve − non-torch − CUDA graphs

as vLLM's V1 worker computes it (`determine_available_memory`, notes §5). The activation
reserve is the peak of a profiling forward pass at `max_num_batched_tokens`; we estimate it from
the model's shapes (largest intermediate tensors plus fp32 logits for the sampler's rows) and a
fixed workspace allowance. All estimates can be overridden in the policy config.
"""
from __future__ import annotations

from dataclasses import dataclass

from simserve.models import DTYPE_BYTES, ModelSpec

GIB = 2**30
WORKSPACE_GIB = 1.0     # cuBLAS/attention workspaces and allocator slack (assumed)
NON_TORCH_GIB = 0.3     # NCCL buffers, CUDA context extras (vLLM logs: 0.07-0.16 GiB; rounded up)
CUDA_GRAPHS_GIB = 0.3   # vLLM >= 0.21 subtracts its graph estimate (logs: 0.17-0.36 GiB)


def activation_reserve_bytes(model: ModelSpec, tp: int, max_tokens: int, max_seqs: int) -> float:
    ffn = model.ffn // tp
    per_token = (3 * ffn + 4 * model.hidden) * DTYPE_BYTES   # gate_up out + act out + residuals
    logits = min(max_seqs, max_tokens) * model.vocab // tp * 4 * 2  # fp32 logits + softmax copy
    return max_tokens * per_token + logits + WORKSPACE_GIB * GIB


@dataclass(frozen=True, slots=True)
class KVBudget:
    total_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    other_bytes: float
    kv_bytes: float
    num_blocks: int
    block_size: int

    def summary(self) -> dict:
        return {"kv_gib_per_rank": self.kv_bytes / GIB, "num_gpu_blocks": self.num_blocks,
                "kv_capacity_tokens": self.num_blocks * self.block_size,
                "weights_gib_per_rank": self.weight_bytes / GIB,
                "activation_reserve_gib": self.activation_bytes / GIB}


def gpu_kv_budget(model: ModelSpec, gpu_memory_bytes: float, tp: int, utilization: float,
                  block_size: int, max_tokens: int, max_seqs: int, *,
                  activation_reserve_gib: float | None = None, cuda_graphs: bool = True,
                  graphs_counted: bool = True) -> KVBudget:
    usable = gpu_memory_bytes * utilization
    weights = model.weight_bytes_per_rank(tp)
    act = (activation_reserve_gib * GIB if activation_reserve_gib is not None
           else activation_reserve_bytes(model, tp, max_tokens, max_seqs))
    other = NON_TORCH_GIB * GIB + (CUDA_GRAPHS_GIB * GIB if cuda_graphs and graphs_counted else 0)
    kv = usable - weights - act - other
    block_bytes = block_size * model.kv_bytes_per_token_per_rank(tp)
    blocks = int(kv // block_bytes) if kv > 0 else 0
    return KVBudget(gpu_memory_bytes, usable, weights, act, other, max(kv, 0.0), blocks, block_size)
