"""Workloads: trace readers, synthetic generators, arrival normalisation, caps."""
from simserve.workload.build import ARRIVALS, build_workload, clear_trace_cache, load_trace
from simserve.workload.manifest import (TraceEntry, cache_dir, fetch_trace, load_manifest,
                                        resolve_trace, trace_dirs)
from simserve.workload.readers import (read_azure_csv, read_mooncake_jsonl, read_plain_csv,
                                       read_trace)
from simserve.workload.spec import Workload
from simserve.workload.stats import format_stats, trace_stats
from simserve.workload.synthetic import (SYNTHETIC, SyntheticSpec, gamma_arrivals,
                                         lognormal_from_quantiles, poisson_arrivals,
                                         resample_lengths, synthetic_workload)
from simserve.workload.transform import (OVERLONG, cap_context, drop_overlong, first_n, normalize_exponential,
                                         normalize_gamma, scale_gaps, trace_arrivals)

__all__ = [
    "ARRIVALS", "SYNTHETIC", "SyntheticSpec", "TraceEntry", "Workload", "build_workload",
    "OVERLONG", "cache_dir", "cap_context", "drop_overlong", "clear_trace_cache", "fetch_trace", "first_n", "format_stats",
    "gamma_arrivals", "load_manifest", "load_trace", "lognormal_from_quantiles",
    "normalize_exponential", "normalize_gamma", "poisson_arrivals", "read_azure_csv",
    "read_mooncake_jsonl", "read_plain_csv", "read_trace", "resample_lengths", "resolve_trace",
    "scale_gaps", "synthetic_workload", "trace_arrivals", "trace_dirs", "trace_stats",
]
