"""Run one simulation: a workload, a model, hardware and a policy in, records out."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import simpy

from simserve.hardware.setup import Hardware, HardwareConfig, resolve_hardware
from simserve.models import ModelSpec, get_model
from simserve.policies import get_policy, make_config
from simserve.sim.cluster import Cluster
from simserve.sim.context import ArrivalSource, Recorder, SimContext
from simserve.sim.records import RequestRecords
from simserve.sim.requests import RequestTable
from simserve.sim.trace_events import TraceEvents
from simserve.workload.spec import Workload


@dataclass
class SimResult:
    records: RequestRecords
    recorder: Recorder
    stats: dict = field(default_factory=dict)
    trace: TraceEvents | None = None   # the timeline, when `trace_events` asked for one


def simulate_point(workload: Workload, model: ModelSpec | str, hardware: Hardware | HardwareConfig,
                   policy: str, policy_config=None, seed: int = 0, gpu_cost_hook=None,
                   stream=None, progress=None, trace_events=None,
                   **policy_params) -> SimResult:
    """Simulate `workload` under `policy` until every request has finished.

    `policy_config` is the policy's config dataclass; or pass its fields as keyword arguments.
    `gpu_cost_hook(cost_model) -> cost_model` replaces engines' GPU cost models (validation).
    `stream` (e.g. `simserve.metrics_stream.RecordStream`) takes finished requests in chunks
    as the run goes, so token times are not held for the whole run; `records` is then None.
    `progress`: True for a bar of finished requests (tqdm.auto), or a tqdm-like object.
    `trace_events`: a file path to write a Chrome / Perfetto trace of every iteration and
    transfer to (with each request's spans), or a `TraceEvents` to fill; `result.trace`.
    """
    if isinstance(model, str):
        model = get_model(model)
    if isinstance(hardware, HardwareConfig):
        hardware = resolve_hardware(hardware)
    cfg = policy_config if policy_config is not None else make_config(policy, policy_params)
    _, build = get_policy(policy)
    wall0 = time.perf_counter()
    env = simpy.Environment()
    cluster = Cluster.build(env, hardware.gpu, hardware.num_gpus, hardware.pcie, hardware.nvlink)
    if stream is not None:
        table = RequestTable(workload, token_window=stream.token_window,
                             retire_chunk=stream.chunk)
        stream.attach(table)
    else:
        table = RequestTable(workload)
    limit = getattr(workload, "max_concurrency", None)
    source = ArrivalSource(env, table.scheduled, limit, sent_s=table.arrival)
    if limit is not None:
        table.on_finish = source.release
    ctx = SimContext(env=env, model=model, hardware=hardware, cluster=cluster, table=table,
                     source=source, recorder=Recorder(), rng=np.random.default_rng(seed),
                     gpu_cost_hook=gpu_cost_hook)
    trace = None
    if trace_events is not None:
        trace = trace_events if isinstance(trace_events, TraceEvents) else \
            TraceEvents(requests=True)
        ctx.recorder.trace = trace
        for ch in cluster.channels:
            ch.trace = trace
    dep = build(ctx, cfg)  # a policies.base.Deployment: engines started, router, stats
    source.handler = dep.on_arrival
    env.process(source.run())
    bar = _progress_bar(progress, table.n, policy)
    if bar is not None:
        env.process(_tick(env, table, bar, table.scheduled))
    try:
        env.run()
    finally:
        if bar is not None and progress is True:
            bar.close()
    rec = ctx.recorder
    stats = _stats(ctx, dep, wall0)
    if table.num_finished != table.n:
        left = np.flatnonzero(np.isnan(table.finish[table.num_retired:])) + table.num_retired
        r = int(left[0]) if len(left) else -1
        raise RuntimeError(f"simulation ended with {table.n - table.num_finished} unfinished "
                           f"requests (a policy stalled); the first, request {r}, has "
                           f"{int(table.generated[r])} of {int(table.output[r])} tokens")
    if trace is not None:
        if stream is None:
            trace.request_spans(table)
        if not isinstance(trace_events, TraceEvents):
            trace.write(trace_events)
    if stream is not None:
        table.retire(table.n)
        return SimResult(None, rec, stats, trace)
    return SimResult(table.records(), rec, stats, trace)


def _stats(ctx: SimContext, dep, wall0: float) -> dict:
    """The run's stats: the engines' and the policy's, counts, KV pools, counters."""
    env, table, rec = ctx.env, ctx.table, ctx.recorder
    stats = dict(ctx.stats)
    stats["engines"] = dep.engine_stats
    stats.update(dep.stats)
    pools = dep.kv_pools
    stats.update(
        wall_s=time.perf_counter() - wall0,
        sim_end_s=float(env.now),
        num_iterations=rec.num_iterations,
        num_iterations_stepped=rec.num_steps_scheduled,
        num_preemptions=int(table.preemptions.sum()),
        num_finished=table.num_finished,
        peak_kv_blocks=[p.peak_used for p in pools],
        kv_blocks_in_use_at_end=[p.num_used for p in pools],
        kv_capacity_blocks=[p.num_blocks for p in pools],
        counters=collect_counters(dep.engines, table.num_emitted),
    )
    pts = [e.prefill_tokens for e in dep.engines if e.prefill_tokens is not None]
    if pts:
        stats["prefill_tokens_computed"] = int(sum(pts))
    pcs = [s for e in dep.engines for s in [e.prefix_cache_stats()] if s is not None]
    if pcs:
        from simserve.sim.prefix_cache import summarize_prefix_cache
        stats["prefix_cache"] = pcs
        stats["prefix_cache_summary"] = summarize_prefix_cache(pcs)
    return stats


def collect_counters(engines, num_output_tokens: int) -> dict:
    """Every engine's `counters()` (policies.base.Engine) summed per key, keys in first-seen
    order, plus `cpu_token_share`, the share of output tokens decoded on a CPU tier, where
    engines report `num_cpu_tokens`."""
    out: dict = {}
    for e in engines:
        for k, v in e.counters().items():
            out[k] = out.get(k, 0) + v
    if "num_cpu_tokens" in out:
        out["cpu_token_share"] = out["num_cpu_tokens"] / num_output_tokens \
            if num_output_tokens else 0.0
    return out


def _progress_bar(progress, n: int, desc: str):
    if progress is None or progress is False:
        return None
    if progress is True:
        import sys

        from tqdm.auto import tqdm
        return tqdm(total=n, desc=desc, unit="req", leave=False, file=sys.stderr,
                    mininterval=0.5, dynamic_ncols=True)
    return progress


def _tick(env: simpy.Environment, table: RequestTable, bar, scheduled: np.ndarray):
    """Moves the bar to the number of finished requests every ~1/2000 of the arrival span of
    simulated time; it touches no simulation state, and stops when nothing else is pending
    (so a stalled policy still ends the run)."""
    span = float(scheduled[-1] - scheduled[0]) if len(scheduled) else 0.0
    dt = max(span / 2000, 0.05)
    shown = 0
    while table.num_finished < table.n and env.peek() < float("inf"):
        yield env.timeout(dt)
        if table.num_finished != shown:
            bar.update(table.num_finished - shown)
            shown = table.num_finished
            bar.set_postfix_str(f"t={env.now:.0f}s", refresh=False)
