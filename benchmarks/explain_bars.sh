#!/bin/sh
# `simserve explain` on DualPace Fig. 9a (RTX 4090: DualPace vs NEO and vs vLLM, NEO vs vLLM) and ConfluxServe
# Fig. 12 (Qwen3-14B, vs the best "++" baseline), the outputs written to
# benchmarks/results/explain/ with the command, wall time and load average in each .txt.
#   sh benchmarks/explain_bars.sh [STEM [NAME-PREFIX]]   (a prefix runs only the matching bars)
set -eu
out=benchmarks/results/explain
stem=${1:-$(date -u +%Y%m%d)}
only=${2:-}
mkdir -p "$out"
run() {  # NAME FILE DESIGN BASELINE EXTRA...
    name=$1; shift
    case $name in "$only"*) ;; *) return 0 ;; esac
    f=$out/$name-$stem
    cmd="python -m simserve explain $* --plot $f.png --csv $f.csv --json $f.json --force"
    { echo "\$ $cmd"; echo "# $(date -u +%FT%TZ), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)";
      /usr/bin/time -f "# wall %e s, user %U s" sh -c "$cmd" 2>&1; } > "$f.txt"
}
run dualpace-fig9a-vs-neo experiments/dualpace/fig09a-10a-14a-conv-llama8b-rtx4090.yaml \
    --design dualpace --baseline neo --num-requests 1000 --tol 0.02
run dualpace-fig9a-vs-vllm experiments/dualpace/fig09a-10a-14a-conv-llama8b-rtx4090.yaml \
    --design dualpace --baseline vllm --num-requests 1000 --tol 0.02
run neo-fig9a-vs-vllm experiments/dualpace/fig09a-10a-14a-conv-llama8b-rtx4090.yaml \
    --design neo --baseline vllm --num-requests 1000 --tol 0.02
run conflux-fig12-qwen14b experiments/conflux/fig12-qwen14b.yaml \
    --design confluxserve --baseline chunked++-4096 --num-requests 1000 --tol 0.02 --sensitivity
