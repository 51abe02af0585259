"""Whole-process start-up and end-to-end times of the command line (issue 14, bar 1).

    python benchmarks/bench_startup.py [--repeat N] [--exe PATH]

Times, as fresh processes (wall seconds and the child's CPU seconds, median of N runs,
default 5), from the repository root:
- `python -c pass`: the interpreter alone (the floor under everything below);
- `python -c "import simserve"`;
- `simserve --help` (`python -m simserve --help`, or the console script given with --exe);
- `simserve run` of issue 14's point: vllm, Llama-3.1-8B on 1x H100, the first 2,000
  Azure-Conversation requests at 4 req/s (quickstart with the trace and
  rate overridden, --no-save -q): imports, profile loading, trace reading, the simulation,
  metrics and the table.
The machine's load average is printed with the table; under load, compare CPU seconds.
simserve's modules are byte-compiled first (`compileall`, as `pip install` leaves them; this
machine sets PYTHONDONTWRITEBYTECODE, so a checkout would otherwise recompile every module in
every process); `--no-compile` skips that.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POINT = ["run", "quickstart", "--set", "workload.trace=azure-conv",
         "--set", "workload.rates=[4]", "--no-save", "-q"]


def timed(cmd: list[str]) -> tuple[float, float]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per command (median shown)")
    ap.add_argument("--exe", help="a `simserve` console script to time instead of "
                                  "`python -m simserve`")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile simserve first (time a cold checkout)")
    args = ap.parse_args()
    py = sys.executable
    if not args.no_compile:
        subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "simserve")], check=True)
    cli = [args.exe] if args.exe else [py, "-m", "simserve"]
    name = "simserve" if args.exe else "python -m simserve"
    cases = [("python -c pass", [py, "-c", "pass"]),
             ('python -c "import simserve"', [py, "-c", "import simserve"]),
             (f"{name} --help", cli + ["--help"]),
             (f"{name} run (2,000-request point)", cli + POINT)]
    load0 = os.getloadavg()
    print(f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs; "
          f"median of {args.repeat} fresh processes each; simserve "
          f"{'not ' if args.no_compile else ''}byte-compiled")
    print(f"{'command':44} {'wall s':>7} {'CPU s':>6}   (min wall, max wall)")
    for label, cmd in cases:
        runs = [timed(cmd) for _ in range(max(args.repeat, 1))]
        walls = [w for w, _ in runs]
        print(f"{label:44} {statistics.median(walls):7.3f} "
              f"{statistics.median(c for _, c in runs):6.3f}   ({min(walls):.3f}, {max(walls):.3f})",
              flush=True)
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
