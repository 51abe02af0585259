"""Prefix caching off vs on for an experiment YAML (default: the Mooncake conversation one):
per point, the preemptions, the prefill recompute ratio (prompt tokens computed, recomputes
included, / prompt tokens), the prefix-cache hit rate (vLLM's: first lookups), the saved
tokens and TTFT. `--set` overrides as for `simserve run`, e.g. --set workload.overlong=cap.

    python benchmarks/prefix_table.py [YAML] [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simserve.runner.config import load_experiment  # noqa: E402
from simserve.runner.point import run_experiment_config  # noqa: E402

HERE = Path(__file__).resolve().parents[1] / "experiments" / "prefix"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("yaml", nargs="?", default=str(HERE / "mooncake-conv-llama8b-rtx4090.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    cfg = load_experiment(a.yaml, a.set)
    results = run_experiment_config(cfg, out=None, progress=False)
    print(f"{cfg.name} (overlong: {cfg.workload.overlong})")
    print("| policy | rate | requests | dropped | capped | preemptions | prefill recompute | "
          "hit rate | saved tokens | TTFT mean s | TTFT p99 s | SLO att. |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results:
        s, st = r.summary, r.stats
        prompt = int(r.requests["prompt_tokens"].sum())
        hit = s.get("prefix_cache_hit_rate")
        print(f"| {s['policy']} | {s['request_rate']:g} | {s['num_requests']:,} | "
              f"{s['num_dropped']} | {s['num_capped']} | {st['num_preemptions']:,} | "
              f"{st['prefill_tokens_computed'] / prompt:.2f}x | "
              f"{'-' if hit is None else f'{hit:.1%}'} | "
              f"{s.get('prefix_cache_saved_tokens', 0):,} | {s['mean_ttft_ms'] / 1e3:,.2f} | "
              f"{s['p99_ttft_ms'] / 1e3:,.2f} | {s['slo_attainment']:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
