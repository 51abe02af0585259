"""`Explanation` as a text table, CSV / JSON rows and a waterfall plot."""
from __future__ import annotations

import csv
import io
import json
import math

from simserve.explain.decompose import Explanation


def _f(x, fmt: str = ".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def rows(ex: Explanation) -> list[dict]:
    """One dict per line of the table: design, each mechanism, the remainder, the baseline."""
    out = [dict(step="design", title=ex.design, goodput=ex.design_goodput.rate,
                cumulative_share=None, alone_goodput=None, alone_share=None,
                engaged=None, counters="", off="")]
    for r in ex.rows:
        m = r.mechanism
        out.append(dict(
            step=m.key, title=m.title + (" (what-if)" if m.what_if else ""),
            goodput=r.cumulative.rate if r.cumulative else None,
            cumulative_share=r.cumulative_share if r.available else None,
            alone_goodput=r.alone.rate if r.alone else None,
            alone_share=r.alone_share if r.available else None,
            engaged=r.engaged, counters=r.engaged_text,
            off=", ".join(f"{k}: {v}" for k, v in m.off.items()) if r.available else
            "unavailable"))
    out.append(dict(step="remainder", title="every mechanism off vs the baseline",
                    goodput=ex.baseline_goodput.rate, cumulative_share=ex.remainder,
                    alone_goodput=None, alone_share=None, engaged=None, counters="", off=""))
    return out


def text(ex: Explanation) -> str:
    head = ["step", "goodput req/s", "share (cumulative)", "off alone req/s",
            "share (alone)", "engaged", "counters at the design's goodput"]
    table = [head]
    for r in rows(ex):
        eng = {True: "yes", False: "NO", None: "-"}[r["engaged"]]
        table.append([r["title"], _f(r["goodput"]), _f(r["cumulative_share"]),
                      _f(r["alone_goodput"]), _f(r["alone_share"]), eng, r["counters"]])
    widths = [max(len(x[i]) for x in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    t = ex.target
    out = [f"{ex.experiment}: {ex.design} vs {ex.baseline}, goodput = highest rate with {t} "
           f"(bisection to {ex.rtol:.0%}, {ex.num_requests} requests per point)",
           f"lead {_f(ex.lead)}x = {_f(ex.design_goodput.rate)} / "
           f"{_f(ex.baseline_goodput.rate)} req/s; product of the cumulative shares and the "
           f"remainder {_f(ex.product)}x", "", *lines, "",
           "cumulative: each mechanism off on top of the ones above it (G_prev / G_this); "
           "alone: only it off (G_design / G_off).",
           f"interaction residual (design / all-off, over the product of the one-at-a-time "
           f"shares): {_f(ex.interaction)}"]
    off = [f"  {r.mechanism.title} off: {r.mechanism.meaning}" for r in ex.rows if r.available]
    out += ["what each switch runs:", *off]
    unavailable = [f"  {r.mechanism.title}: {r.engaged_text}" for r in ex.rows
                   if not r.available]
    if unavailable:
        out += ["not measured:", *unavailable]
    for line in ex.never_engaged:
        out.append(f"counters check: {line}")
    if ex.sensitivity:
        out += ["", f"sensitivity of the lead ({ex.design} / {ex.baseline}):"]
        for s in ex.sensitivity:
            if s["available"]:
                out.append(f"  {s['variation']}: {_f(s['ratio'])}x "
                           f"({_f(s['design_goodput'])} / {_f(s['baseline_goodput'])} req/s)")
            else:
                out.append(f"  {s['variation']}: {s['note']}")
    la, lb = ex.load or ((math.nan,) * 3, (math.nan,) * 3)
    out.append(f"{ex.num_simulations} simulations in {ex.seconds:.0f} s (load average "
               f"{la[0]:.1f} at start, {lb[0]:.1f} at end)")
    return "\n".join(out)


def to_json(ex: Explanation) -> dict:
    def num(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x
    return {"experiment": ex.experiment, "design": ex.design, "baseline": ex.baseline,
            "target": str(ex.target), "lead": num(ex.lead), "product": num(ex.product),
            "interaction_residual": num(ex.interaction), "remainder": num(ex.remainder),
            "rows": [{k: num(v) for k, v in r.items()} for r in rows(ex)],
            "never_engaged": ex.never_engaged,
            "sensitivity": [{k: num(v) for k, v in s.items()} for s in ex.sensitivity or ()],
            "num_requests": ex.num_requests, "rtol": ex.rtol, "seconds": round(ex.seconds, 1),
            "load_average": [list(x) for x in ex.load], "num_simulations": ex.num_simulations}


def to_csv(ex: Explanation) -> str:
    buf = io.StringIO()
    rs = rows(ex)
    w = csv.DictWriter(buf, fieldnames=list(rs[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rs)
    return buf.getvalue()


def dumps_json(ex: Explanation) -> str:
    return json.dumps(to_json(ex), indent=1, ensure_ascii=False)


def waterfall(ex: Explanation, ax=None):
    """Goodput from the baseline up to the design: the remainder, then each mechanism's step
    (log scale, so each bar's height is its share); returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(1.2 * (len(ex.rows) + 3), 4))
    steps: list[tuple[str, float, float | None]] = [
        ("baseline\n" + ex.baseline, ex.baseline_goodput.rate, None)]
    level = ex.baseline_goodput.rate
    parts = [("all off", ex.remainder)] + [
        (r.mechanism.title, r.cumulative_share) for r in reversed(ex.rows) if r.available]
    for name, share in parts:
        if not math.isfinite(share):
            continue
        steps.append((name, level, level * share))
        level *= share
    steps.append(("design\n" + ex.design, ex.design_goodput.rate, None))
    for i, (name, a, b) in enumerate(steps):
        if b is None:
            ax.bar(i, a, color="0.5")
        else:
            lo, hi = sorted((a, b))
            ax.bar(i, hi - lo, bottom=lo, color="tab:green" if b >= a else "tab:red")
            ax.text(i, hi, f"{b / a:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(steps)), [s[0] for s in steps], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylabel("goodput (req/s)")
    ax.set_title(f"{ex.experiment}: {ex.design} vs {ex.baseline}, lead {ex.lead:.2f}x",
                 fontsize=9)
    return ax
