"""Policy `neo`: NEO (MLSys'25), GPU-gated asymmetric CPU offloading (notes/policies.md §1).

`config` holds the parameters, `predictor` NEO's per-layer functions on our cost models (the
oracle) and the pipeline's iteration time, `table` NEO's own profiled and interpolated
predictor (the default for decisions), `mode` the sub-batch construction and mode decision,
`scheduler` one scheduling round (swaps, prefills), `pcie` a round's PCIe transfers in closed
form, `engine` the SimPy process.
"""
from __future__ import annotations

from simserve.cost import GpuCostModel
from simserve.cost.cpu import CpuCostModel
from simserve.cost.swiftllm_host import SwiftLLMHost
from simserve.errors import ConfigError
from simserve.kv_budget import GIB
from simserve.policies import check_hardware, register
from simserve.policies.base import cost_model, deploy, kv_blocks
from simserve.policies.neo.config import NeoConfig
from simserve.policies.neo.engine import NeoEngine
from simserve.policies.neo.predictor import Predictor
from simserve.policies.neo.table import profile


def _graphs(cfg: NeoConfig) -> bool:
    """CUDA graphs: SwiftLLM captures none; the generic host keeps `cuda_graphs`."""
    return cfg.cuda_graphs and cfg.host == "generic"


def _predictors(ctx, cfg: NeoConfig, gpu, cpu, gpu_blocks: int, cpu_blocks: int, host):
    """(deciding predictor, pricing oracle). The oracle prices rounds (with NEO's host path
    per stage); the decisions read NEO's profiled tables unless `predictor: oracle`."""
    g0 = ctx.cluster.gpus[0]
    oracle = Predictor(ctx.model, gpu, cpu, g0.h2d, g0.d2h, cfg.tp, cfg.cpu_launch_ms * 1e3)
    if host is not None:
        oracle.stage_us = host.stage_us
        oracle.pipe_host_us = host.pipeline_extra_us()
    if cfg.predictor == "oracle":
        return oracle, oracle
    bs = cfg.block_size
    # NEO's evaluation server sets max_blocks_per_seq to the token budget in blocks
    # (`evaluation/server.py`), so its longest sequence is the budget rounded up to a block
    max_seq = bs * (-(-cfg.max_tokens_in_batch // bs))
    table = profile(oracle, bs, cfg.max_tokens_in_batch, cfg.max_batch_size, max_seq,
                    bs * gpu_blocks, bs * max(cpu_blocks, 1))
    table.lnch_us = cfg.cpu_launch_ms * 1e3
    return table, oracle


def _pools(ctx, cfg: NeoConfig) -> tuple[int, int, dict]:
    m = ctx.model
    graphs = _graphs(cfg)
    gpu_blocks, kv = kv_blocks(ctx, "policy neo", cfg.tp, cfg.gpu_memory_utilization,
                               cfg.block_size, cfg.max_tokens_in_batch, cfg.max_batch_size,
                               cfg.num_gpu_blocks_override,
                               "lower max_tokens_in_batch or raise the TP degree",
                               activation_reserve_gib=cfg.activation_reserve_gib,
                               cuda_graphs=graphs, graphs_counted=graphs)
    if cfg.use_cpu and cfg.itm_layer and cfg.num_gpu_blocks_override is None:
        # the KV cache gets one more layer for Prefill-to-CPU's staging (NEO's evaluation
        # server: `--extra-layer-for-cprf`, GPU blocks × L // (L + 1))
        L = m.num_layers
        gpu_blocks = gpu_blocks * L // (L + 1)
    # host_kv_gib is the host memory for KV across all TP ranks, as DualPace's (one definition
    # for both): a block of `block_size` tokens holds every rank's share of them.
    # (Until 2026-12-01 NEO read it per rank: TP t held t times DualPace's tokens.)
    block_bytes = cfg.block_size * m.kv_bytes_per_token
    cpu_blocks = cfg.num_cpu_blocks_override or int(cfg.host_kv_gib * GIB // block_bytes)
    return gpu_blocks, cpu_blocks, dict(kv.summary(), num_gpu_blocks=gpu_blocks,
                                        num_cpu_blocks=cpu_blocks)


def _check_workload(ctx, cfg: NeoConfig, gpu_blocks: int, cpu_blocks: int) -> None:
    t = ctx.table
    if not t.n:
        return
    bs = cfg.block_size
    if int(t.prompt.max()) > cfg.max_tokens_in_batch:
        raise ConfigError(f"policy neo.max_tokens_in_batch: NEO never chunks prompts, and the "
                          f"longest prompt has {int(t.prompt.max())} tokens > "
                          f"{cfg.max_tokens_in_batch}")
    need = int(-(-(t.prompt + t.output).max() // bs))
    thr_in = round(cfg.swap_in_ratio * gpu_blocks)
    if need > thr_in:
        raise ConfigError(f"policy neo: a request needs up to {need} KV blocks but only "
                          f"{thr_in} GPU blocks ({cfg.swap_in_ratio} of {gpu_blocks}) can be "
                          "swapped into; cap the workload's context or raise the GPU KV pool")
    if cfg.use_cpu and cpu_blocks - gpu_blocks < need:
        # NEO admits a prefill only while the host keeps room for a full GPU eviction; a
        # request re-prefilled after a recompute can be as long as prompt + output
        raise ConfigError(f"policy neo.host_kv_gib: the host pool ({cpu_blocks} blocks) must hold "
                          f"a full GPU eviction ({gpu_blocks} blocks) plus the longest request "
                          f"({need}); raise host_kv_gib or set use_cpu: false")


@register("neo", NeoConfig)
def build(ctx, cfg: NeoConfig):
    hw = ctx.hardware
    if hw.num_gpus != cfg.tp:
        raise ConfigError(f"policy neo.tp: one NEO engine spans all GPUs; tp={cfg.tp} but "
                          f"hardware.num_gpus={hw.num_gpus}")
    check_hardware(cfg, hw)
    cores = hw.cpu_cores or int(hw.cpu.spec.get("cores", 0))
    gpu_blocks, cpu_blocks, summary = _pools(ctx, cfg)
    host = SwiftLLMHost.from_profile(hw.gpu, cfg.stage_launch_us) \
        if cfg.host == "swiftllm" else None
    gpu = cost_model(ctx, lambda: GpuCostModel(ctx.model, hw.gpu, cfg.tp, hw.nvlink,
                                               _graphs(cfg),
                                               table_tokens=cfg.max_tokens_in_batch,
                                               host=host.engine_host() if host else None),
                     "policy neo")
    cpu = CpuCostModel(ctx.model, hw.cpu, cores, cpu_tp=1)
    pred, pricing = _predictors(ctx, cfg, gpu, cpu, gpu_blocks, cpu_blocks, host)
    eng = NeoEngine(ctx, cfg, gpu, pred, gpu_blocks, cpu_blocks, list(range(cfg.tp)),
                    pricing=pricing, host=host)
    ctx.table.track_cpu_tokens()
    return deploy(ctx, "neo", [eng],
                  fits=lambda: _check_workload(ctx, cfg, gpu_blocks, cpu_blocks),
                  engine_stats=[dict(summary, gpus=eng.gpus)], stats={"neo": eng.stats})
