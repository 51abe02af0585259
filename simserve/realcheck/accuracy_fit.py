"""Regenerate `simserve/data/accuracy/vllm-h200.yaml` (what `simserve run` prints beside its
tables) from the committed real-vLLM runs:

    python -m simserve.realcheck.accuracy_fit [--write]
"""
from __future__ import annotations

import argparse
import os

from simserve.accuracy import FILE, SHORT, load


def summarize(root: str | None = None) -> dict:
    """The file's content from the committed runs (vLLM's defaults, Mooncake r4 left out)."""
    import numpy as np

    from simserve.realcheck.serve_score import ROOT, score
    root = root or ROOT
    out = {}
    for engine in ("vllm", "generic", "ideal"):
        rows = [r for r in score(root, engine) if r["server"].endswith("-default")
                and "mooncake-r4" not in r["plan"]]
        out[engine] = {"mean_abs_err_pct": {
            k: round(float(np.mean([abs(r[f"err_{k}"]) for r in rows])), 1) for k, _ in SHORT}}
        runs = len(rows)
    return {"runs": runs, "engines": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the shipped file")
    a = ap.parse_args(argv)
    import yaml

    from simserve.paths import data_dir
    cur = load()
    cur.update(summarize())
    text = yaml.safe_dump(cur, sort_keys=False, width=100)
    if a.write:
        with open(os.path.join(data_dir(FILE[0]), FILE[1]), "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
