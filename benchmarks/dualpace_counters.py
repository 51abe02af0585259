"""The CPU tier at work in a DualPace / NEO results folder: each point's mechanism counters
(`summary.json` → `counters`, summed over the engines by simserve/run.py) at a policy's knee
and over the whole rate grid, for the README's figure tables (issue 13 §1).

    python benchmarks/dualpace_counters.py results/dualpace-paper/<stem> [--policy dualpace]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

# what each column shows: (header, counters key)
COLUMNS = (("CPU tokens", "cpu_token_share"), ("CPU batches", "num_cpu_batches"),
           ("P2C", "num_prefill_to_cpu"), ("swap-out", "num_swap_out"),
           ("swap-in", "num_swap_in"), ("assists", "num_dense_assist_calls"))


def by_rate(records: list[dict], policy: str) -> dict[float, dict]:
    """{rate: counters} of one policy label (points without counters are left out)."""
    return {float(r["request_rate"]): r["counters"] for r in records
            if r.get("policy") == policy and r.get("counters")}


def knee_rate(rates, cap) -> float | None:
    """The first measured rate at or above a sustainable rate (the last rate when the curve
    never crossed, the first when it failed at once)."""
    rates = sorted(rates)
    if not rates or cap is None:
        return None
    lo, hi = cap.bounds
    if lo == 0:
        return rates[0]
    if hi == math.inf:
        return rates[-1]
    return next((x for x in rates if x >= lo), rates[-1])


def short(c: dict | None) -> str:
    """'CPU 23.1 %, 510 b, P2C 115, swaps 10/74': the share of output tokens decoded on the
    CPU, CPU batches, Prefill-to-CPU requests, swap-outs / swap-ins."""
    if not c:
        return "—"
    share = c.get("cpu_token_share", 0.0)
    return (f"CPU {100 * share:.1f} %, {c.get('num_cpu_batches', 0)} b, "
            f"P2C {c.get('num_prefill_to_cpu', 0)}, swaps {c.get('num_swap_out', 0)}/"
            f"{c.get('num_swap_in', 0)}")


def at_knee(records: list[dict], policy: str, cap) -> str:
    per = by_rate(records, policy)
    k = knee_rate(per, cap)
    return "—" if k is None else f"{short(per[k])} at {k:g}"


def grid_max(records: list[dict], policy: str) -> dict:
    """Each counter's largest value over the policy's rate grid."""
    out: dict = {}
    for c in by_rate(records, policy).values():
        for k, v in c.items():
            out[k] = max(out.get(k, v), v)
    return out


def table(records: list[dict], policy: str) -> str:
    """Markdown: the counters at every measured rate of one policy."""
    per = by_rate(records, policy)
    head = ["rate"] + [h for h, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in sorted(per):
        c = per[x]
        cells = [f"{x:g}"] + [f"{100 * c.get(k, 0):.1f} %" if k == "cpu_token_share"
                              else str(c.get(k, 0)) for _, k in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--policy", default="dualpace")
    a = ap.parse_args(argv)
    from simserve.capacity import load_records
    if not (a.out / "summary.json").exists():
        print(f"{a.out}: no summary.json", file=sys.stderr)
        return 2
    print(table(load_records(a.out), a.policy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
