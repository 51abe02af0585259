"""Policy `dualpace` (DualPace §4–5): a GPU engine and a CPU engine as independent SimPy
processes with their own queues and clocks, no shared iteration barrier, single ownership of
every request, a host KV pool, Prefill-to-CPU, swap-out/in, and GPU Dense Assist served at
stage boundaries. Controls not set in the config are derived from the profiles (§4.3)."""
from __future__ import annotations

from simserve.cost import GpuCostModel
from simserve.cost.cpu import CpuCostModel
from simserve.errors import ConfigError
from simserve.policies.dualpace import controls
from simserve.policies import check_hardware, register
from simserve.policies.base import Deployment, cost_model, deploy, kv_blocks
from simserve.policies.dualpace.assist import CpuBatchExecutor, fit_thresholds
from simserve.policies.dualpace.config import DualPaceConfig
from simserve.policies.dualpace.cpu_engine import CpuEngine
from simserve.policies.dualpace.gpu_engine import GpuEngine
from simserve.policies.dualpace.gpu_schedule import fifo_placement, fifo_swap_in
from simserve.policies.dualpace.gpu_worker import GpuWorker
from simserve.policies.dualpace.state import SharedState
from simserve.sim.kv import BlockPool
from simserve.kv_budget import GIB


def resolve(ctx, cfg: DualPaceConfig) -> dict:
    """Every derived quantity of one build (also used by tests and `simserve` reports)."""
    hw, m = ctx.hardware, ctx.model
    check_hardware(cfg, hw)
    tp = cfg.tp or hw.num_gpus
    if tp != hw.num_gpus:
        raise ConfigError(f"policy.tp: dualpace runs one GPU engine over all {hw.num_gpus} "
                          f"GPU(s); tp={tp} must equal num_gpus")
    big = float(hw.gpu.spec["memory_gib"]) >= 70
    max_seqs = cfg.max_num_seqs or (1024 if big else 256)    # vLLM 0.22.1's defaults
    gcost = cost_model(ctx, lambda: GpuCostModel(m, hw.gpu, tp, hw.nvlink, cfg.cuda_graphs,
                                                 table_tokens=max(cfg.hard_token_limit,
                                                                  max_seqs)), "policy.tp")
    ccost = CpuCostModel(m, hw.cpu, hw.cpu_cores, cfg.cpu_tp)
    token_limit = (cfg.gpu_token_limit or controls.gpu_token_limit_from(hw.gpu, m, tp)) \
        if cfg.profiled_token_limit else cfg.hard_token_limit
    C = cfg.cpu_batch_limit or controls.cpu_batch_limit_from(
        hw.cpu.cpu_ops(m.name, hw.cpu_cores // cfg.cpu_tp))
    host_us = controls.assist_host_us(hw.gpu.name) if cfg.assist_host_us is None \
        else cfg.assist_host_us
    if not cfg.dense_assist:        # Full-CPU for every batch up to C: no assist ever
        P, F = C + 1, C
    elif cfg.assist_p is None:
        P, F = fit_thresholds(ccost, hw.gpu, m, tp, hw.pcie, token_limit, host_us,
                              cfg.assist_eps, cfg.assist_lambda)
    else:
        P, F = cfg.assist_p, cfg.assist_f
    gpu_blocks, kv = kv_blocks(ctx, "policy dualpace", tp, cfg.gpu_memory_utilization,
                               cfg.block_size, cfg.hard_token_limit, max_seqs,
                               cfg.num_gpu_blocks_override,
                               activation_reserve_gib=cfg.activation_reserve_gib,
                               cuda_graphs=cfg.cuda_graphs)
    host_blocks = cfg.num_cpu_blocks_override or int(
        cfg.host_kv_gib * GIB // (cfg.block_size * m.kv_bytes_per_token))
    if host_blocks < 1:
        raise ConfigError("policy.host_kv_gib: too small for one KV block")
    return dict(tp=tp, max_num_seqs=max_seqs, gpu_token_limit=token_limit, cpu_batch_limit=C,
                assist_p=P, assist_f=F, assist_host_us=host_us, staged=not (C <= F),
                num_gpu_blocks=gpu_blocks, num_cpu_blocks=host_blocks,
                staging_tokens=cfg.staging_tokens or cfg.hard_token_limit,
                gpu_cost=gcost, cpu_cost=ccost)


@register("dualpace", DualPaceConfig)
def build(ctx, cfg: DualPaceConfig) -> Deployment:
    return build_dualpace(ctx, cfg)


def build_dualpace(ctx, cfg: DualPaceConfig, *, placement=fifo_placement,
                   swap_in=fifo_swap_in) -> Deployment:
    """DualPace's deployment with the GPU round's placement and swap-in rules given
    (`gpu_schedule`'s hooks; the defaults are the paper's): a variant registers its own
    policy whose build calls this with its rules."""
    r = resolve(ctx, cfg)
    env, cl = ctx.env, ctx.cluster
    gpu_pool = BlockPool("dualpace.gpu_kv", r["num_gpu_blocks"], cfg.block_size)
    host_pool = BlockPool("dualpace.host_kv", r["num_cpu_blocks"], cfg.block_size)
    t = ctx.table
    st = SharedState(env, t, gpu_pool, host_pool)
    st.cpu_batch_limit = r["cpu_batch_limit"]
    t.track_cpu_tokens()
    worker = GpuWorker(env, cl.gpus[0].h2d, cl.gpus[0].d2h, r["assist_host_us"] * 1e-6,
                       r["staged"], closed_form=cfg.leap)
    ex = CpuBatchExecutor(env, r["cpu_cost"], r["gpu_cost"], worker, r["assist_p"],
                          r["assist_f"])
    gpu = GpuEngine(ctx, cfg, st, worker, r["gpu_cost"], max_seqs=r["max_num_seqs"],
                    token_limit=r["gpu_token_limit"], hard_limit=cfg.hard_token_limit,
                    staging_tokens=r["staging_tokens"], poll_s=cfg.boundary_poll_us * 1e-6, tp=r["tp"],
                    placement=placement, swap_in=swap_in)
    cpu = CpuEngine(ctx, st, ex, r["cpu_batch_limit"], cfg.hard_token_limit)
    cpu.gpu_poke = gpu.poke
    gpu.cpu = cpu
    cpu.gpu = gpu

    def fits() -> None:
        if t.n and int(st.peak.max()) > gpu_pool.num_blocks + host_pool.num_blocks:
            raise ConfigError("policy dualpace: a request's KV exceeds both pools; cap the "
                              "workload's context or raise host_kv_gib")
    return deploy(ctx, "dualpace", [gpu, cpu], routes_to=[gpu], fits=fits,
                  engine_stats=[{k: v for k, v in r.items() if not k.endswith("_cost")}],
                  stats={"dualpace": gpu.counts, "dualpace_routes": ex.route_counts})
