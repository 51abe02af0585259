"""One look per serving design, the same in every figure: colour, marker and line style, no two
designs alike (a curve is told apart in grey print by marker and line, on screen by colour).

A design is a policy and, where it has one, its queue order (`scheduler`): ConfluxServe's
baselines come in FCFS and SRPT ("++") forms that the paper draws as different systems. "++"
forms keep their family's colour and marker, dashed and hollow; ConfluxServe's FCFS form is the
dashed one of its pair.
"""
from __future__ import annotations

# (policy, scheduler or None) -> (name in the papers, colour, marker, line style)
DESIGNS = {
    ("vllm", None): ("vLLM", "#2ca02c", "^", "-"),
    ("sarathi", None): ("Sarathi-Serve", "#bcbd22", "v", "-"),
    ("neo", None): ("NEO", "#1f77b4", "s", "-"),
    ("dualpace", None): ("DualPace", "#d62728", "o", "-"),
    ("chunked", "fcfs"): ("Chunked Prefill", "#8c564b", "s", "-"),
    ("chunked", "srpt"): ("Chunked++", "#8c564b", "s", "--"),
    ("muxwise", "fcfs"): ("MuxWise", "#9467bd", "D", "-"),
    ("muxwise", "srpt"): ("MuxWise++", "#9467bd", "D", "--"),
    ("distserve", "fcfs"): ("DistServe", "#e377c2", "P", "-"),
    ("distserve", "srpt"): ("DistServe++", "#e377c2", "P", "--"),
    ("loongserve", "fcfs"): ("LoongServe", "#17becf", "X", "-"),
    ("loongserve", "srpt"): ("LoongServe++", "#17becf", "X", "--"),
    ("conflux", "slo"): ("ConfluxServe", "#d62728", "*", "-"),
    ("conflux", "fcfs"): ("ConfluxServe-FCFS", "#d62728", "*", "--"),
}
HOLLOW_LS = "--"   # the second form of a family: a hollow marker as well as a dashed line

# Looks for designs the table does not know (a new policy): none of them is in the table.
_EXTRA_COLORS = ("#7f7f7f", "#ff7f0e", "#393b79", "#637939", "#8c6d31", "#843c39",
                 "#7b4173", "#3182bd", "#31a354", "#756bb1")
_EXTRA_MARKERS = ("h", "p", "8", "<", ">", "d", "H", "1", "2", "3")
_EXTRA_LS = ("-.", ":")


def _extras():
    known = {(c, m, ls) for _, c, m, ls in DESIGNS.values()}
    for ls in _EXTRA_LS:
        for i, c in enumerate(_EXTRA_COLORS):
            for j in range(len(_EXTRA_MARKERS)):
                look = (c, _EXTRA_MARKERS[(i + j) % len(_EXTRA_MARKERS)], ls)
                if look not in known:
                    yield look


def design_name(key: tuple) -> str:
    """The name a legend shows for a design key (policy, scheduler)."""
    if key in DESIGNS:
        return DESIGNS[key][0]
    pol, sched = key
    return str(pol) if sched in (None, "fcfs") else f"{pol} ({sched})"


def style(color: str, marker: str, ls: str) -> dict:
    return {"color": color, "marker": marker, "ls": ls,
            "mfc": "white" if ls == HOLLOW_LS else color}


def design_styles(keys) -> dict:
    """A style dict (color, marker, ls, mfc) per design key, distinct for every key given:
    the table's look for known designs, unused looks in order for the others."""
    out, extra = {}, _extras()
    for k in dict.fromkeys(keys):
        if k in DESIGNS:
            _, c, m, ls = DESIGNS[k]
        else:
            c, m, ls = next(extra)
        out[k] = style(c, m, ls)
    return out


def variant_style(base: dict, i: int) -> dict:
    """The i-th other variant of a design (shown with --all-variants): its colour and marker,
    another line style and a lighter line, so it reads as the same system."""
    dashes = ((0, (1, 1.5)), (0, (4, 1.5, 1, 1.5)), (0, (6, 2)), (0, (2, 3)),
              (0, (8, 2, 2, 2)))
    return {**base, "ls": dashes[i % len(dashes)], "alpha": max(0.35, 0.75 - 0.1 * (i // 5)),
            "mfc": "white"}
