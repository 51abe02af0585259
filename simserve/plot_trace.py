"""A simulated point's timeline as a Gantt chart: a row per track of a Chrome trace-event file
(`simserve run --trace-events`): engines, SP ranks, CPU engines and links, each iteration or
transfer a bar coloured by what it ran."""
from __future__ import annotations

import json
from collections import defaultdict

# bar colour per event name's kind; one legend entry each
KINDS = (("prefill", "#d62728"), ("mixed", "#9467bd"), ("decode", "#1f77b4"),
         ("CPU decode", "#2ca02c"), ("transfer", "#ff7f0e"), ("other", "#7f7f7f"))


def _kind(e: dict) -> str:
    if e.get("cat") == "transfer":
        return "transfer"
    name = e.get("name", "")
    for k, _ in KINDS:
        if name.startswith(k):
            return k
    return "other"


def load_trace(src) -> dict:
    """A trace document from a path or an already loaded dict (or TraceEvents)."""
    if hasattr(src, "to_json"):
        return src.to_json()
    if isinstance(src, dict):
        return src
    with open(src) as f:
        doc = json.load(f)
    if isinstance(doc, list):          # the format's bare-array form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{src}: not a trace-event file (no traceEvents list)")
    return doc


def tracks(doc: dict) -> tuple[list[str], dict[str, list[dict]]]:
    """Track names in the viewer's order (process, then thread id) and their X events."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    by = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            key = (e["pid"], e["tid"])
            by[names.get(key, f"pid {key[0]} tid {key[1]}")].append(e)
    order = [names[k] for k in sorted(names) if names[k] in by]
    order += [n for n in by if n not in order]
    return order, dict(by)


def trace_gantt(src, ax=None, *, window: tuple[float, float] | None = None,
                title: str | None = None):
    """Bars per track from `src` (path, dict or TraceEvents), in simulated seconds; `window`
    (t0, t1) zooms in. Returns the axes."""
    doc = load_trace(src)
    order, by = tracks(doc)
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(11, 0.45 * max(len(order), 2) + 1.6))
    colors = dict(KINDS)
    used = set()
    shown = sum(1 for n in order for e in by[n] if window is None or
                window[0] <= e["ts"] * 1e-6 <= window[1])
    edge = 0.6 if shown < 2000 else 0.0   # a white seam between iterations, while legible
    for row, name in enumerate(order):
        spans = defaultdict(list)
        for e in by[name]:
            a, d = e["ts"] * 1e-6, e["dur"] * 1e-6
            if window is not None and (a + d < window[0] or a > window[1]):
                continue
            spans[_kind(e)].append((a, d))
        for kind, xs in spans.items():
            lw = edge if kind != "transfer" else 0.0   # transfers are too thin to seam
            ax.broken_barh(xs, (row - 0.38, 0.76), facecolors=colors[kind],
                           edgecolors="white" if lw else "none", linewidth=lw,
                           label=kind if kind not in used else None)
            used.add(kind)
    ax.set_yticks(range(len(order)), order, fontsize=8)
    ax.set_ylim(len(order) - 0.5, -0.5)
    if window is not None:
        ax.set_xlim(*window)
    ax.set_xlabel("simulated time (s)")
    ax.grid(True, axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=11)
    handles = [h for h in ax.get_legend_handles_labels()[0]]
    if handles:  # outside the bars, to the right
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax
