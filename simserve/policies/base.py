"""The policy contract: what a serving policy gives the runner, and the one builder all use.

A policy is two things, registered together by `@register(name, ConfigClass)` on its build
function (`simserve.policies`; third-party packages through the entry-point group
`simserve.policies`, see docs/how-to/add-a-policy.md):

- a frozen config dataclass: its YAML parameters, with defaults (an optional `validate()`
  raises ValueError("field: why") for values that cannot work);
- `build(ctx, cfg) -> Deployment`: creates its engines on the simulation context
  (`simserve.sim.context.SimContext`: environment, model, hardware, cluster, request table,
  recorder, rng, `gpu_cost_hook`) and hands them to `deploy`.

Every build goes through the same steps, each a function here:

1. `kv_blocks`: the KV blocks one rank holds after weights and reserves (vLLM's accounting,
   `simserve.kv_budget`), or the configured override; a ConfigError when none are left.
2. `cost_model`: the engine's GPU cost model (`GpuCostModel`, `SpCostModel`, ...) built and
   passed through `ctx.gpu_cost_hook` (`executed`; the validation replay swaps in a real
   executor there). Every GPU cost model an engine executes with comes through `executed`, so
   the hook applies to every policy (tests/test_policy_contract.py runs each with a hook).
3. The policy constructs its engines (objects with the `Engine` members below).
4. `deploy`: checks that the longest request fits (`fits_one_pool` unless the policy gives its
   own check), starts every engine's process in order, builds the router (least-loaded among
   the engines arrivals go to, lowest index on ties, unless the policy gives a key) and
   returns the `Deployment` the runner reads.

`simserve.run.simulate_point` reads only `Deployment` members and the `Engine` members below:
no attribute probing, so what it reports is what this file says.
"""
from __future__ import annotations

import operator

from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Generator, Mapping, Protocol, Sequence,
                    TypeVar, cast, runtime_checkable)

from simserve.errors import ConfigError
from simserve.kv_budget import KVBudget, gpu_kv_budget

if TYPE_CHECKING:
    from simserve.sim.context import SimContext

T = TypeVar("T")


@runtime_checkable
class KvPool(Protocol):
    """A paged KV pool as the runner reports it (`simserve.sim.kv.BlockPool` is one)."""

    name: str
    block_size: int
    num_blocks: int     # capacity in blocks: `kv_capacity_blocks`
    peak_used: int      # most blocks ever in use: `peak_kv_blocks`

    @property
    def num_used(self) -> int:   # blocks in use now: `kv_blocks_in_use_at_end`
        ...

    @property
    def capacity_tokens(self) -> int:  # num_blocks * block_size: what the fits check uses
        ...


@runtime_checkable
class Engine(Protocol):
    """What every engine (a SimPy process owning requests and KV) gives the runner.
    `EngineBase` supplies the defaults of the optional members."""

    # prompt (and recomputed) tokens it computed, prefix-cache hits excluded; summed into
    # `stats["prefill_tokens_computed"]`; None when the engine does not count them (optional)
    prefill_tokens: int | None

    def run(self) -> Generator:
        """The engine's SimPy process; `deploy` starts it."""
        ...

    def kv_pools(self) -> Sequence[KvPool]:
        """The KV pools it owns, reported in this order (default: `(self.pool,)`)."""
        ...

    def counters(self) -> Mapping[str, float]:
        """Mechanism counters (e.g. swap-outs, CPU-decoded tokens), read once the run has
        ended; the runner sums them per key over all engines into `stats["counters"]`.
        Default: none."""
        ...

    def prefix_cache_stats(self) -> dict | None:
        """Prefix-cache hit statistics (`simserve.sim.prefix_cache`), or None when it has no
        prefix cache (optional; default None)."""
        ...


@runtime_checkable
class Replica(Engine, Protocol):
    """An engine arrivals can be routed to (the default router and its stats read these)."""

    gpus: Sequence[int]     # the GPU indices it runs on
    kv_summary: dict        # how its KV budget came out (`KVBudget.summary()` plus options)

    def load(self) -> int:
        """Requests it holds (running + waiting): the default router's key."""
        ...

    def enqueue(self, rid: int) -> None:
        """Take request `rid` (an index into `ctx.table`) now."""
        ...


class EngineBase:
    """Defaults of the optional `Engine` members; engines inherit it and override."""

    prefill_tokens: int | None = None
    pool: KvPool  # the engine's one pool, where it has one (`kv_pools`' default)

    def kv_pools(self) -> Sequence[KvPool]:
        return (self.pool,)

    def counters(self) -> Mapping[str, float]:
        return {}

    def prefix_cache_stats(self) -> dict | None:
        return None


@dataclass
class Deployment:
    """What `build(ctx, cfg)` returns (made by `deploy`) and all the runner reads of a policy.

    - `engines`: every engine, its process started, in start order; the runner sums their
      `counters()` into `stats["counters"]`, their `prefill_tokens` into
      `stats["prefill_tokens_computed"]` and lists their `prefix_cache_stats()`.
    - `on_arrival(rid)`: the router; the arrival source calls it with each request id.
    - `kv_pools`: the pools reported, in order: `stats["peak_kv_blocks"]`,
      `["kv_blocks_in_use_at_end"]`, `["kv_capacity_blocks"]` hold one entry per pool.
    - `engine_stats`: `stats["engines"]`, one dict per engine (or per rank) saying how its
      KV budget and options came out.
    - `stats`: policy-specific entries merged into the result's stats (e.g. `stats["neo"]`);
      live objects are fine, they are read when the run has ended.
    """

    engines: Sequence[Engine]
    on_arrival: Callable[[int], None]
    kv_pools: Sequence[KvPool]
    engine_stats: list[dict]
    stats: dict = field(default_factory=dict)


def kv_blocks(ctx: SimContext, where: str, tp: int, utilization: float, block_size: int,
              max_tokens: int, max_seqs: int, override: int | None = None, hint: str = "",
              **budget_kw) -> tuple[int, KVBudget]:
    """Step 1: KV blocks per rank (`override` when given) and the budget they came from.
    `where` opens the error ("policy vllm"); `hint` ends it with what to change."""
    hw = ctx.hardware
    kv = gpu_kv_budget(ctx.model, hw.gpu_memory_bytes, tp, utilization, block_size,
                       max_tokens, max_seqs, **budget_kw)
    blocks = override or kv.num_blocks
    if blocks < 1:
        raise ConfigError(f"{where}: no memory left for KV on {hw.gpu.name} at TP{tp} "
                          f"({kv.summary()}){'; ' + hint if hint else ''}")
    return blocks, kv


def cost_model(ctx: SimContext, make: Callable[[], T], where: str) -> T:
    """Step 2: the GPU cost model an engine executes with: `fitted_model(make)` through
    `executed` (the context's hook)."""
    return executed(ctx, fitted_model(make, where))


def fitted_model(make: Callable[[], T], where: str) -> T:
    """`make()`, the model fitted to the profile, with no hook: for a scheduler's own
    predictions fixed before serving (ConfluxServe's estimator), never to execute with. A
    ValueError from the profile (an unmeasured TP degree, ...) becomes a ConfigError opened by
    `where`."""
    try:
        return make()
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def executed(ctx: SimContext, model: T) -> T:
    """The one place `ctx.gpu_cost_hook` applies: `hook(model)` when set (it returns an object
    with the same interface, e.g. the validation replay's real executor), else `model`."""
    hook = ctx.gpu_cost_hook
    return hook(model) if hook is not None else model


def fits_one_pool(ctx: SimContext, pool: KvPool, kind: str) -> None:
    """The default fits check: the longest request (prompt + output) fits one replica's pool."""
    t = ctx.table
    if not t.n:
        return
    need = int((t.prompt + t.output).max())
    cap = pool.capacity_tokens
    if need > cap:
        num = int(((t.prompt + t.output) > cap).sum())
        raise ConfigError(
            f"policy {kind}: {num} request(s) need up to {need} tokens of KV but one replica "
            f"holds {cap}; cap the workload's context, raise gpu_memory_utilization or the "
            "TP degree")


def deploy(ctx: SimContext, kind: str, engines: Sequence[Engine], *,
           routes_to: Sequence[Replica] | None = None,
           route_key: Callable[[Any], Any] | None = None,
           fits: Callable[[], None] | None = None,
           engine_stats: list[dict] | None = None,
           stats: dict | None = None,
           also_run: Sequence[Generator] = ()) -> Deployment:
    """Step 4: check fits, start the engines, build the router.

    `routes_to`: the engines arrivals go to (default: all). `route_key(engine)`: the router
    sends an arrival to the engine with the least key, the first (lowest index) on ties
    (default: `load()`); a single target gets arrivals directly. `fits()`: the policy's own
    check that every request fits (default `fits_one_pool` on the first target's first pool).
    `engine_stats`: default one `dict(kv_summary, gpus=gpus)` per engine. `stats`: extra
    entries for the result's stats. `also_run`: further processes (e.g. a KV hand-off) started
    after the engines.
    """
    targets = list(engines if routes_to is None else routes_to)
    if fits is not None:
        fits()
    else:
        fits_one_pool(ctx, targets[0].kv_pools()[0], kind)
    for e in engines:
        ctx.env.process(e.run())
    for p in also_run:
        ctx.env.process(p)
    if engine_stats is None:
        engine_stats = [dict(r.kv_summary, gpus=r.gpus)
                        for r in (cast(Replica, e) for e in engines)]
    return Deployment(engines=list(engines), on_arrival=_router(targets, route_key),
                      kv_pools=[p for e in engines for p in e.kv_pools()],
                      engine_stats=engine_stats, stats=dict(stats or {}))


def _router(targets: list, key: Callable | None) -> Callable[[int], None]:
    if len(targets) == 1:
        return targets[0].enqueue
    key = key or operator.methodcaller("load")  # no Python frame per engine and arrival

    def on_arrival(rid: int) -> None:
        min(targets, key=key).enqueue(rid)
    return on_arrival
