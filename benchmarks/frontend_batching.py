"""The committed real-vLLM runs replayed with the API server's tokenizer batching on
(`tokenizer_batching: true`: the profile's `frontend_batched`, fitted by
`python -m simserve.realcheck.tokenizer_fit --search` on `llama-default` only), scored as
`serve_score` scores the default front end.

    python benchmarks/frontend_batching.py OUT.json [SERVER/PLAN ...]
    python -m simserve.realcheck.tail_bars OUT.json validation/vllm-h200/step_diff/score-tails.json --fit llama-default

Optionally `--frontend JSON` replaces the batched front end's costs (same keys as the
profile's `frontend_batched`), to score another fit of the same structure, or the admission
split around the stage (the keys `pre_delay_us`, `post_us`, `post_per_token_us`,
`pre_interleave`; `python -m simserve.realcheck.tokenizer_fit --split` measures it):

    python benchmarks/frontend_batching.py OUT.json --frontend "$(cat validation/vllm-h200/step_diff/frontend-split.json)"
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import simserve.policies.vllm_engine as VE
    from simserve.cost.host import engine_host, with_batching
    from simserve.realcheck import serve_score
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--frontend", default=None, help="a batched front end as JSON")
    a = ap.parse_args(argv)
    fe = json.loads(a.frontend) if a.frontend else None

    def batched(profile, engine, version=None):
        h = engine_host(profile, engine, version)
        if h is None or h.ideal:
            return h
        if fe is not None:
            h = dataclasses.replace(h, frontend_batched=fe)
        return with_batching(h, True)

    VE.engine_host = batched
    runs = [os.path.join(serve_score.ROOT, r) for r in a.runs] or None
    rows = serve_score.score(serve_score.ROOT, "vllm", runs)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
