"""The mechanisms `simserve explain` can switch off, per policy: each one a documented policy
option (its default is the design as the paper describes it) with the value that switches it
off, and the counters that show whether it engaged in a run.

`explain` knows a policy only through this table, the policy's config fields (`simserve
policies show NAME`) and the counters its engines report (`summary.json` → `counters`).
A mechanism whose option the policy does not have (yet) is reported as unavailable, not run.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# engaged(counters, options) -> (True | False | None, what the counters say); None: no
# counter can tell
Check = Callable[[dict, dict], tuple]


def _positive(key: str, what: str) -> Check:
    def check(c: dict, _opts: dict) -> tuple:
        if key not in c:
            return None, f"no counter {key}"
        v = c[key]
        return v > 0, f"{v:g} {what}"
    return check


def _host_kv(c: dict, opts: dict) -> tuple:
    """The host pool matters where its peak use passed what the smaller pool would hold."""
    peak, blocks = c.get("host_kv_peak_blocks"), c.get("num_cpu_blocks")
    if peak is None or not blocks:
        return None, "no host KV counters"
    on = float(opts.get("host_kv_gib", 120.0))
    small = blocks * SMALL_HOST_KV_GIB / on
    return peak > small, (f"host KV peak {peak:g} blocks; {SMALL_HOST_KV_GIB:g} GiB holds "
                          f"{small:.0f}")


def _ranks(c: dict, _opts: dict) -> tuple:
    n = c.get("conflux_num_ranks")
    if n is None:
        return None, "no counter conflux_num_ranks"
    return n > 1, f"{n:g} logical ranks per instance"


def _ranks_and(key: str, what: str) -> Check:
    pos = _positive(key, what)

    def check(c: dict, opts: dict) -> tuple:
        ok, text = _ranks(c, opts)
        if ok is False:
            return False, text
        ok2, text2 = pos(c, opts)
        return (None if ok is None or ok2 is None else ok2), f"{text}, {text2}"
    return check


def _always(c: dict, _opts: dict) -> tuple:
    return None, "always in use (an alternative, not a switch)"


# DualPace Fig. 11b's smallest host pool: the "off" value of the host-KV-size mechanism
SMALL_HOST_KV_GIB = 30.0


# Table order is the cumulative order (`--mechanisms` reorders): the papers' own ablations
# remove the cheapest-to-explain parts first and the design's premise last.
@dataclass(frozen=True)
class Mechanism:
    key: str                 # short name (the CSV's and `--mechanisms`')
    title: str               # as the paper names it
    off: dict                # policy options that switch it off (or to the alternative)
    engaged: Check = field(repr=False)
    meaning: str = ""        # what "off" runs
    what_if: bool = False    # an alternative design choice rather than a mechanism removed


MECHANISMS: dict[str, tuple[Mechanism, ...]] = {
    "dualpace": (
        Mechanism("dense_assist", "Dense Assist", {"dense_assist": False},
                  _positive("num_dense_assist_calls", "assist calls"),
                  "every CPU batch Full-CPU"),
        Mechanism("prefill_to_cpu", "Prefill-to-CPU", {"prefill_to_cpu": False},
                  _positive("num_prefill_to_cpu", "Prefill-to-CPU requests"),
                  "a prompt is admitted only where its KV fits HBM"),
        Mechanism("token_limit", "profiled GPU token limit", {"profiled_token_limit": False},
                  _positive("num_token_limited_rounds", "rounds whose admission stopped "
                            "at the token limit"),
                  "the hard token limit (vLLM 0.22.1's budget) for every round"),
        Mechanism("host_kv", "host KV size", {"host_kv_gib": SMALL_HOST_KV_GIB}, _host_kv,
                  f"a {SMALL_HOST_KV_GIB:g} GiB host KV pool (Fig. 11b's smallest)"),
        Mechanism("decoupled", "decoupled scheduling", {"decoupled": False},
                  _positive("num_cpu_tokens", "tokens decoded on the CPU"),
                  "an iteration barrier between the GPU and CPU engines (lockstep without NEO's "
                  "gating; removed last, since it dominates whatever is removed after it)"),
    ),
    "conflux": (
        Mechanism("admission", "Moore–Hodgson admission", {"scheduler": "fcfs"},
                  _positive("conflux_num_admission_rejections",
                            "requests Moore–Hodgson dropped at least once"),
                  "FCFS order, no admission (ConfluxServe-FCFS)"),
        Mechanism("placement", "dual-mode placement", {"placement": "first-fit"},
                  _ranks_and("conflux_num_kv_transfers", "KV moves to a decode rank"),
                  "first-fit decode placement (blind to decode load)"),
        Mechanism("waterfill", "waterfill dispatch", {"waterfill": False},
                  _ranks_and("conflux_num_prefill_iterations", "prefill iterations"),
                  "each chunk split evenly over the ranks"),
        Mechanism("overlap", "attention overlap", {"overlap": False},
                  _positive("conflux_num_prefill_iterations", "prefill iterations"),
                  "prefill and decode attention one after the other"),
        Mechanism("sequence_parallel", "SP execution", {"sequence_parallel": False}, _ranks,
                  "one TP rank per instance (no sequence parallelism)"),
        Mechanism("estimator", "paper's estimator (vs oracle)", {"estimator": "oracle"},
                  _always, "the oracle estimator (a what-if: knowledge the system lacks)",
                  what_if=True),
    ),
    "neo": (
        Mechanism("gpu_gating", "GPU gating", {"gpu_gating": False},
                  _positive("num_gpu_only_iterations", "GPU-only iterations"),
                  "the CPU tier runs every iteration (no GPU-only mode)"),
    ),
}

# Printed sensitivity of the headline ratio: option overrides applied to every run that has
# the options (ConfluxServe's contention α, β: no contention, the H200 SP2 measurement, the
# paper's Fig. 14a value, a pessimistic edge), and `COLLECTIVES`, the GPU-GPU link at either
# edge of its multi-rank band (`simserve.hardware.collective_band`: collectives over more ranks
# than were measured), applied to the hardware of every run
COLLECTIVES = "@collectives"
SENSITIVITY: dict[str, tuple[tuple[str, dict], ...]] = {
    "conflux": (
        ("alpha=beta=1.0 (no contention)", {"alpha": 1.0, "beta": 1.0}),
        ("alpha=1.0, beta=1.72 (H200 SP2 measurement)", {"alpha": 1.0, "beta": 1.72}),
        ("alpha=beta=1.28 (paper Fig. 14a)", {"alpha": 1.28, "beta": 1.28}),
        ("alpha=beta=2.0 (pessimistic)", {"alpha": 2.0, "beta": 2.0}),
        ("collectives at the slow edge of their band", {COLLECTIVES: "slow"}),
        ("collectives at the fast edge of their band", {COLLECTIVES: "fast"}),
    ),
}


def mechanisms_of(policy: str) -> tuple[Mechanism, ...]:
    """The mechanisms registered for a policy name (empty when none are)."""
    return MECHANISMS.get(policy, ())


def option_names(policy: str) -> set[str]:
    """The option names a registered policy's config accepts."""
    import dataclasses

    from simserve.policies import get_policy
    cls, _ = get_policy(policy)
    return {f.name for f in dataclasses.fields(cls)}
