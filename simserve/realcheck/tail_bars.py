"""The tail bars on the scored real-vLLM runs: P99 ITL within 10 % and mean TTFT within 5 %,
or within the real engine's own re-run spread for that plan where it is larger.

    python -m simserve.realcheck.tail_bars AFTER.json [BEFORE.json] [--fit llama-default ...]

AFTER/BEFORE are `serve_score --out` files. The re-run spread of a plan is the largest
|difference| between its `*-default` run and a `*-rerun` run of it (same flags;
`serve_score --spread`). Mooncake r4 is left out (it re-sent r2's prompts: the real prefix
cache was warm, a cold replay cannot match). Runs on `--fit` servers are those the host
path was fitted on; the rest are held out.
"""
from __future__ import annotations

import argparse
import json

from simserve.realcheck.serve_score import ROOT, spread

BARS = {"p99_itl_ms": 10.0, "mean_ttft_ms": 5.0}
LEFT_OUT = ("llama-3.1-8b-mooncake-r4",)


def rerun_spread(root: str = ROOT) -> dict:
    """{(plan, metric): largest |re-run difference| in %} over the `*-rerun` servers."""
    out: dict = {}
    for r in spread(root):
        if not r["server"].endswith("-rerun"):
            continue
        for k in BARS:
            out[(r["plan"], k)] = max(out.get((r["plan"], k), 0.0), abs(r[k]))
    return out


def bars(rows: list[dict], sp: dict) -> list[dict]:
    out = []
    for r in rows:
        if r["plan"] in LEFT_OUT:
            continue
        d = {"server": r["server"], "plan": r["plan"]}
        for k, lim in BARS.items():
            e = r[f"err_{k}"]
            d[k] = e
            d[f"ok_{k}"] = abs(e) <= max(lim, sp.get((r["plan"], k), 0.0))
        d["ok"] = all(d[f"ok_{k}"] for k in BARS)
        out.append(d)
    return out


def held_groups(held: list[dict]) -> list[tuple[str, list[dict]]]:
    """The held-out runs by what differs from the fitted ones (` ` + name, runs)."""
    short = [x for x in held if "-short-" in x["plan"]]
    return [(" " + name, [x for x in held if x["server"].endswith(suffix) and x not in short])
            for name, suffix in (("defaults", "-default"), ("async off", "-sync"),
                                 ("prefix off", "-noprefix"), ("re-runs", "-rerun"))] + \
        [(" short", short)]


def summary(b: list[dict], fit: tuple) -> str:
    lines = []
    held = [x for x in b if x["server"] not in fit]
    for name, sel in (("all", b), ("fitted", [x for x in b if x["server"] in fit]),
                      ("held out", held), *held_groups(held)):
        if not sel:
            continue
        n = len(sel)
        lines.append(f"{name:10s} {n:3d} runs: P99 ITL ok {sum(x['ok_p99_itl_ms'] for x in sel):3d}, "
                     f"mean TTFT ok {sum(x['ok_mean_ttft_ms'] for x in sel):3d}, both "
                     f"{sum(x['ok'] for x in sel):3d} ({sum(x['ok'] for x in sel) / n * 100:.0f} %); "
                     f"mean |err| P99 ITL {sum(abs(x['p99_itl_ms']) for x in sel) / n:.1f} %, "
                     f"mean TTFT {sum(abs(x['mean_ttft_ms']) for x in sel) / n:.1f} %")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("after")
    ap.add_argument("before", nargs="?")
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--fit", nargs="+", default=["llama-default", "llama-rerun"])
    a = ap.parse_args(argv)
    sp = rerun_spread(a.root)
    after = bars(json.load(open(a.after)), sp)
    before = bars(json.load(open(a.before)), sp) if a.before else None
    print(f"{'server':15s} {'plan':28s} " + (f"{'P99 ITL before':>15s} {'TTFT before':>12s} "
                                             if before else "") + f"{'P99 ITL':>8s} {'TTFT':>7s}")
    for i, x in enumerate(after):
        b = ""
        if before:
            y = before[i]
            b = f"{y['p99_itl_ms']:+14.1f}{'' if y['ok_p99_itl_ms'] else '*'} " \
                f"{y['mean_ttft_ms']:+11.1f}{'' if y['ok_mean_ttft_ms'] else '*'} "
        print(f"{x['server']:15s} {x['plan']:28s} {b}{x['p99_itl_ms']:+7.1f}"
              f"{'' if x['ok_p99_itl_ms'] else '*'} {x['mean_ttft_ms']:+6.1f}"
              f"{'' if x['ok_mean_ttft_ms'] else '*'}")
    print("(* misses the bar: 10 % P99 ITL, 5 % mean TTFT, or the plan's re-run spread)")
    if before:
        print("before:\n" + summary(before, tuple(a.fit)))
    print(("after:\n" if before else "") + summary(after, tuple(a.fit)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
