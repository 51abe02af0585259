#!/usr/bin/env bash
# Issue 14's speed figures in one run, as the README's Speed section reports them:
#   bash benchmarks/speed_all.sh [OUTFILE]     (default: benchmarks/results/speed-<date>.txt)
# start-up (5 fresh processes per command), the loop of every policy at its paper's setting
# (median of 3 in-process runs), and scale (10k, 100k, 1M requests: conversation lengths 3
# times at 1M, the tiled Azure trace once). About 40 minutes on a quiet 2-core machine; run
# it with nothing else on the machine (the load average is printed before and after each).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/speed-$(date -u +%Y%m%d).txt}
mkdir -p "$(dirname "$out")"
{
    echo "# simserve $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs"
    python benchmarks/bench_startup.py --repeat 5
    python -m simserve --version
    python benchmarks/bench_loop.py --repeat 3
    # the same loop from the Python source (simserve/compiled.py): the compiled copies' gain
    SIMSERVE_PURE_PYTHON=1 python benchmarks/bench_loop.py --repeat 3
    python benchmarks/bench_scale.py --sizes 10000 100000 1000000 --cases conv
    python benchmarks/bench_scale.py --sizes 1000000 1000000 --cases conv
    python benchmarks/bench_scale.py --sizes 1000000 --cases azure
} 2>&1 | tee "$out"
