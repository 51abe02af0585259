"""Fitted latency of work on the hardware, one module per kind of execution:

- `gpu`: a batch on a GPU under tensor parallelism (`GpuCostModel`, `BatchShape`);
- `cpu`: CPU decode and the Dense Assist routes (`CpuCostModel`);
- `sp`: sequence-parallel (Ulysses) iterations (`SpCostModel`);
- `smshare`: kernels on a share of a GPU's SMs, and co-run slowdowns (`SmShareCost`).

Each reads fitted functions from a hardware profile and schedules nothing."""
from simserve.cost.gpu import BatchShape, GpuCostModel, in_situ_factor, prefill_batch
from simserve.cost.cpu import CpuCostModel, host_copy_gbps
from simserve.cost.sp import PAPER_CONTENTION, SpCostModel
from simserve.cost.smshare import CONTENTION_FIG14A, SmShareCost, contention

__all__ = ["BatchShape", "GpuCostModel", "in_situ_factor", "prefill_batch", "CpuCostModel",
           "host_copy_gbps", "PAPER_CONTENTION", "SpCostModel", "CONTENTION_FIG14A",
           "SmShareCost", "contention"]
