"""Scale: wall time, µs per request and peak memory of one point at 10k, 100k and 1M requests.

    python benchmarks/bench_scale.py [--sizes 10000 100000 1000000] [--cases conv azure]

Each case runs in a fresh process, as `simserve run --stream` does: the workload is built,
simulated with per-request records streamed to a requests.csv in chunks (in a temporary
folder), and the run summary computed. Cases:

- `conv`: synthetic conversation lengths (Azure 2023 conversation shape), Poisson arrivals at
  60 req/s, vllm on 8x H200 as eight TP1 replicas behind the least-loaded router, each with
  its own API server (one TP8 replica's single front end no longer keeps up at 60 req/s once
  vLLM's measured host path is priced);
- `azure`: the Azure 2023 conversation trace tiled in time (`tile`) to the size asked for,
  its own gaps scaled (`arrival: scale`) to 60 req/s, same cluster.

The replicas leap independently: an arrival routed to one replica does not stop the others'
leaps (docs/architecture.md, Event leaping): each replica leaps about as far as it would
alone.

Reported per case: wall s, CPU s (the process's own; on a shared machine wall time also
counts waiting for a core), the CPU s of its child (from 100k requests on a machine with a
spare core, the streamed records are digested and written by a child process:
`simserve/runner/record_sink.py`), µs per request (wall), peak RSS (MB, `resource.getrusage`;
the child's beside it), and the machine's load average (`os.getloadavg`) before and after.
Cost per request should be flat from 10k to 1M and memory bounded.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RATE = 60.0
HARDWARE = {"gpu": "h200-sxm", "num_gpus": 8}
POLICY = {"name": "vllm", "tp": 1, "max_num_batched_tokens": 8192}
AZURE_CONV_REQUESTS = 19366


def experiment(case: str, n: int) -> dict:
    if case == "conv":
        wl = {"trace": "synthetic-conversation", "num_requests": n, "arrival": "poisson"}
    else:
        wl = {"trace": "azure-conv", "num_requests": n, "arrival": "scale",
              "tile": -(-n // AZURE_CONV_REQUESTS)}
    return {"name": f"scale-{case}-{n}", "model": "llama-3.1-8b", "hardware": HARDWARE,
            "workload": {**wl, "rates": [RATE], "seed": 0}, "policies": [POLICY],
            "slo": {"ttft_ms": 1000, "tbt_ms": 100}}


def one(case: str, n: int, progress: bool) -> dict:
    import resource
    import tempfile

    from simserve.runner.config import parse_experiment
    from simserve.runner.point import run_experiment_config

    cfg = parse_experiment(experiment(case, n))
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_experiment_config(cfg, out=Path(d) / "out", progress=progress, stream=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        csv_mb = (Path(d) / "out" / "requests.csv").stat().st_size / 2**20
    s = res[0].summary
    return {"case": case, "requests": n, "wall_s": wall, "cpu_s": cpu,
            "us_per_request": wall / n * 1e6, "cpu_us_per_request": cpu / n * 1e6,
            "child_cpu_s": child.ru_utime + child.ru_stime,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "child_peak_rss_mb": child.ru_maxrss / 1024,
            "requests_csv_mb": csv_mb, "sim_s": res[0].stats["sim_end_s"],
            "iterations": res[0].stats["num_iterations"],
            "mean_ttft_ms": s["mean_ttft_ms"], "p99_itl_ms": s["p99_itl_ms"],
            "load_before": load0, "load_after": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--cases", nargs="+", default=["conv", "azure"], choices=["conv", "azure"])
    ap.add_argument("--progress", action="store_true", help="show the point's bar")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.progress)), flush=True)
        return 0
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print(f"vllm, 8 TP1 replicas on 8x H200, Llama-3.1-8B, {RATE:g} req/s, streamed records; "
          f"{os.cpu_count()} CPUs", flush=True)
    print(f"{'case':6} {'requests':>9} {'wall s':>8} {'CPU s':>8} {'child CPU s':>11} "
          f"{'us/req':>7} {'CPU us/req':>10} {'peak MB':>8} {'child MB':>8} {'csv MB':>7} "
          f"{'load':>10}", flush=True)
    for case in args.cases:
        for n in args.sizes:
            cmd = [sys.executable, __file__, "--one", case, str(n)] + \
                (["--progress"] if args.progress else [])
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
            if out.returncode:
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{r['case']:6} {r['requests']:9d} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} "
                  f"{r['child_cpu_s']:11.1f} {r['us_per_request']:7.0f} "
                  f"{r['cpu_us_per_request']:10.0f} {r['peak_rss_mb']:8.0f} "
                  f"{r['child_peak_rss_mb']:8.0f} {r['requests_csv_mb']:7.0f} "
                  f"{r['load_before']:4.1f}-{r['load_after']:4.1f}", flush=True)
            print("  " + json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
