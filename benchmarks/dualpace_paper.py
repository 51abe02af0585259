"""Run the DualPace paper experiments (vLLM, NEO and DualPace) and print each policy's
sustainable request rate per target beside the paper's ratios; draw paper-style figures.

    python benchmarks/dualpace_paper.py [--only fig09a] [--workload trace|paper-means|both]
                                          [--policies vllm,neo,dualpace] [--workers 2]
                                          [--no-run] [--by-figure] [--plots] [--text]
    python benchmarks/dualpace_paper.py --fig11 [--no-run] [--plots]
    python benchmarks/dualpace_paper.py --h200 [--no-run] [--plots]
    python benchmarks/dualpace_paper.py --fig1 [--rate 3.5]

Fig. 9 / 10 / 13 / 14 come out of one sweep per setting (normalized latency, P99 TTFT, P99 ITL,
P99 TPOT). `--workload trace` replays the first 2,000 requests of the Azure 2023 trace (the
YAML files); `paper-means` swaps in `synthetic-dualpace-conversation` / `-code` (the trace's
shape scaled to the means the paper's Fig. 8 states, 1599/114 and 2348/22 tokens) on the rate
grids in PAPER_MEANS_RATES. Results go to results/dualpace-paper/<experiment>[-paper-means]/
(a `simserve sweep` folder: finished points are reused). Sustainable rates are linear
interpolations between measured rates, never extrapolated (`≥ r`: met at every measured rate;
`< r`: failed at the lowest). `--by-figure` prints one table per paper figure and target (a row
per setting) instead of one per setting. `--plots` writes fig09*.png, fig10*, fig13*, fig14*,
fig11-sensitivity.png and h200.png into experiments/dualpace/plots/ (generated, not committed;
`python benchmarks/figures.py` draws every figure of the repository).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this checkout's simserve, not an installed one
HERE = ROOT / "experiments" / "dualpace"    # the experiment YAMLs
sys.path.insert(0, str(Path(__file__).resolve().parent))   # dualpace_counters.py beside this file
RESULTS = ROOT / "results" / "dualpace-paper"
from simserve.plots import declutter  # noqa: E402  (after the path insert)
PLOTS = HERE / "plots"                      # generated, not committed (.gitignore)
NL, TTFT, ITL, TPOT = ("mean_normalized_latency_s<=1", "p99_ttft_ms<=5000", "p99_itl_ms<=1500",
                       "p99_tpot_ms<=1500")
TPOT1 = "p99_tpot_ms<=1000"     # Fig. 15's sensitivity target
ITL1 = "p99_itl_ms<=1000"       # Fig. 11's ITL target is not stated; 1 s shown beside 1.5 s
TARGETS = (NL, TTFT, ITL, TPOT)
TARGET_TEXT = {NL: "normalized latency ≤ 1 s/token", TTFT: "P99 TTFT ≤ 5 s",
               ITL: "P99 ITL ≤ 1.5 s", TPOT: "P99 TPOT ≤ 1.5 s", TPOT1: "P99 TPOT ≤ 1 s",
               ITL1: "P99 ITL ≤ 1 s"}
POLICIES = ("vllm", "neo", "dualpace")
NAMES = {"vllm": "vLLM", "neo": "NEO", "dualpace": "DualPace",
         "vllm-dplimit": "vLLM @ DP limit"}   # vLLM at DualPace's GPU token limit
ABLATION = "vllm-dplimit"   # H20 YAMLs: vLLM at DualPace's profiled GPU token limit (512 / 1,024)

# The paper's DualPace/vLLM and DualPace/NEO per target: a number where §6.2-6.3 and App. C give
# one, else what the text or figure says (">1": DualPace sustains more, "<1": less, "≈1").
_CONV_TAIL = {TTFT: ("> 1", "≈ 1"), ITL: ("< 1", None), TPOT: ("< 1", None)}
_CODE_L = {NL: ("—", "> 1"), TTFT: ("> 1", "> 1"), ITL: ("≥ 1", "≥ 1"),
           TPOT: ("≥ 1", "> 1")}
_CODE_Q = {NL: ("< 1", "> 1"), TTFT: ("≈ 1", "> 1"), ITL: ("≥ 1", "≥ 1"),
           TPOT: ("≥ 1", "> 1")}
# Conv: vLLM has the lowest P99 ITL and TPOT (§6.3, App. C); Code: DualPace has the lowest P99
# ITL over most rates and often matches or beats vLLM's TPOT, vLLM is favoured at 1 s/token on
# the Qwen3 settings, DualPace tracks vLLM's TTFT there and extends it most on the RTX 4090.


def _conv(nl_v, nl_n, itl_n, tpot_n):
    p = {k: v for k, v in _CONV_TAIL.items()}
    p[NL] = (nl_v, nl_n)
    p[ITL] = (p[ITL][0], itl_n)
    p[TPOT] = (p[TPOT][0], tpot_n)
    return p


# stem -> (panel, title, vLLM/NEO TP, paper ratios)
PAPER = {
    "fig09a-10a-14a-conv-llama8b-rtx4090": (
        "a", "Llama-3.1-8B, RTX 4090, 12 CPU cores, Azure-Conv", 1,
        _conv(1.906, 1.432, 1.505, 1.61)),
    "fig09b-10b-14b-conv-qwen14b-2xh20": (
        "b", "Qwen3-14B, 2×H20, 24 CPU cores, Azure-Conv", 2, _conv(1.115, 1.069, 1.152, 1.15)),
    "fig09c-10c-14c-conv-qwen32b-4xh20": (
        "c", "Qwen3-32B, 4×H20, 48 CPU cores, Azure-Conv", 4, _conv(1.238, 1.181, 1.073, 1.03)),
    "fig09d-13a-14d-code-llama8b-rtx4090": (
        "d", "Llama-3.1-8B, RTX 4090, 12 CPU cores, Azure-Code", 1, _CODE_L),
    "fig09e-13b-14e-code-qwen14b-2xh20": (
        "e", "Qwen3-14B, 2×H20, 24 CPU cores, Azure-Code", 2, _CODE_Q),
    "fig09f-13c-14f-code-qwen32b-4xh20": (
        "f", "Qwen3-32B, 4×H20, 48 CPU cores, Azure-Code", 4, _CODE_Q),
}
H200 = "conv-llama8b-h200-xeon-emr"   # not in the paper: the measured machine (vLLM, DualPace)
# Rate grids for the paper-means workload (its knees sit elsewhere than the trace's).
PAPER_MEANS_RATES = {
    "fig09a-10a-14a-conv-llama8b-rtx4090": [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75,
                                            3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 5.0, 6.0, 8.0,
                                            10.0],
    "fig09b-10b-14b-conv-qwen14b-2xh20": [1.5, 2.0, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25,
                                          4.5, 4.75, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0],
    "fig09c-10c-14c-conv-qwen32b-4xh20": [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25,
                                          3.5, 3.75, 4.0, 4.5, 5.0, 6.0, 8.0, 10.0, 14.0],
    "fig09d-13a-14d-code-llama8b-rtx4090": [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75,
                                            3.0, 3.5, 4.0, 5.0, 6.0],
    "fig09e-13b-14e-code-qwen14b-2xh20": [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75,
                                          3.0, 3.5, 4.0, 5.0, 6.0, 8.0],
    "fig09f-13c-14f-code-qwen32b-4xh20": [0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.4, 1.5, 1.6,
                                          1.75, 1.9, 2.0, 2.25, 2.5, 3.0, 4.0, 5.0],
}
SYNTHETIC = {"conv": "synthetic-dualpace-conversation", "code": "synthetic-dualpace-code"}
STYLE = {"dualpace": dict(color="#d62728", marker="o"), "neo": dict(color="#1f77b4", marker="s"),
         "vllm": dict(color="#2ca02c", marker="^")}


def out_dir(stem: str, workload: str) -> Path:
    return RESULTS / (stem if workload == "trace" else f"{stem}-paper-means")


def policy_subset(stem: str, names: list[str]) -> list[dict]:
    """The policies of experiment `stem` whose label (its name where it has none) is in
    `names`, as the YAML writes them (so a subset runs each policy as the full sweep does)."""
    doc = yaml.safe_load((HERE / f"{stem}.yaml").read_text())
    keep = [p for p in doc["policies"] if p.get("label", p["name"]) in names]
    known = {p.get("label", p["name"]) for p in doc["policies"]}
    missing = sorted(set(names) - known)
    if missing:
        raise SystemExit(f"{stem}.yaml: no policy named {', '.join(missing)} (has "
                         f"{', '.join(sorted(known))})")
    return keep


def run_sweep(stem: str, workload: str, workers: int, policies: list[str] | None = None,
              requests: int | None = None) -> Path:
    out = out_dir(stem, workload)
    cmd = [sys.executable, "-m", "simserve.cli", "sweep", str(HERE / f"{stem}.yaml"),
           "--out", str(out), "--workers", str(workers), "-q"]
    if workload == "paper-means":
        kind = "code" if "-code-" in stem else "conv"
        cmd += ["--set", f"workload.trace={SYNTHETIC[kind]}"]
        cmd += ["--set", f"workload.rates={PAPER_MEANS_RATES[stem]}"]
    if policies:   # a subset of the YAML's own policies (by label or name), options as written
        cmd += ["--set", "policies=" + json.dumps(policy_subset(stem, policies))]
    if requests:
        cmd += ["--set", f"workload.num_requests={requests}"]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**__import__("os").environ,
                                                   "PYTHONPATH": str(ROOT)})
    return out


# --------------------------------------------------------------------------- tables

def capacities(out: Path, targets=TARGETS) -> dict:
    """{(target, group label): Capacity} of a results folder."""
    from simserve.capacity import grid_capacity, group_label, load_records, parse_target
    caps = grid_capacity(load_records(out), [parse_target(t) for t in targets])
    tmap = {parse_target(t): t for t in targets}
    return {(tmap[c.target], group_label(c.group)): c for c in caps}


def ratio_text(a, b) -> str:
    """a's sustainable rate over b's as what is known of it: a number when both crossed,
    '≥ x' / '≤ x' when one is censored (met at every measured rate, or failed at the lowest),
    '—' when nothing can be said."""
    if a is None or b is None:
        return "—"
    (alo, ahi), (blo, bhi) = a.bounds, b.bounds
    if alo == ahi and blo == bhi:
        return f"{alo / blo:.2f}"
    lo = 0.0 if bhi == math.inf else alo / bhi
    hi = math.inf if blo == 0 or ahi == math.inf else ahi / blo
    if lo > 0 and hi == math.inf:
        return f"≥ {lo:.2f}"
    if lo == 0 and hi < math.inf:
        return f"≤ {hi:.2f}"
    return "—"


def _paper_cell(x) -> str:
    if x is None:
        return "—"
    return f"{x:g}" if isinstance(x, float) else str(x)


def table(stem: str, out: Path, markdown: bool = True) -> str:
    """One setting: each policy's sustainable rate per target, DualPace's ratios beside the
    paper's with the share of output tokens DualPace decoded on the CPU at its knee (0 %: the
    CPU tier never ran, the ratio is not the paper's mechanism), and vLLM at DualPace's GPU
    token limit where the experiment runs it (its ratio: what the token limit alone buys)."""
    from simserve.capacity import load_records
    from dualpace_counters import at_knee
    caps = capacities(out)
    recs = load_records(out)
    paper = PAPER.get(stem, (None, None, None, {}))[3]
    pols = [p for p in POLICIES + (ABLATION,) if any(k[1] == p for k in caps)]
    head = ["target"] + [NAMES[p] for p in pols]
    if "vllm" in pols:
        head.append("DualPace / vLLM (paper)")
    if "neo" in pols:
        head.append("DualPace / NEO (paper)")
    if "dualpace" in pols:
        head.append("DualPace CPU tier at its knee")
    if ABLATION in pols:
        head.append(f"DualPace / {NAMES[ABLATION]}")
    rows = []
    for t in TARGETS:
        d = caps.get((t, "dualpace"))
        row = [TARGET_TEXT[t]] + [caps[(t, p)].text if (t, p) in caps else "—" for p in pols]
        pv, pn = paper.get(t, (None, None))
        if "vllm" in pols:
            row.append(f"{ratio_text(d, caps.get((t, 'vllm')))} ({_paper_cell(pv)})")
        if "neo" in pols:
            row.append(f"{ratio_text(d, caps.get((t, 'neo')))} ({_paper_cell(pn)})")
        if "dualpace" in pols:
            row.append(at_knee(recs, "dualpace", d))
        if ABLATION in pols:
            row.append(ratio_text(d, caps.get((t, ABLATION))))
        rows.append(row)
    return _render(head, rows, markdown)


FIGURE_TABLES = (("Fig. 9", "Azure-Conv and Azure-Code", NL, "conv+code"),
                 ("Fig. 10 (top)", "Azure-Conv", TTFT, "conv"),
                 ("Fig. 10 (bottom)", "Azure-Conv", ITL, "conv"),
                 ("Fig. 13 (top)", "Azure-Code", TTFT, "code"),
                 ("Fig. 13 (bottom)", "Azure-Code", ITL, "code"),
                 ("Fig. 14 (top)", "Azure-Conv", TPOT, "conv"),
                 ("Fig. 14 (bottom)", "Azure-Code", TPOT, "code"))


def figure_tables(workloads=("trace",), markdown: bool = True) -> str:
    """The paper's figures as tables: one per figure and target, a row per setting (and per
    workload when there are several)."""
    blocks = []
    from simserve.capacity import load_records
    from dualpace_counters import at_knee
    caps_of = {(s, w): capacities(out_dir(s, w)) for s in PAPER for w in workloads
               if (out_dir(s, w) / "summary.json").exists()}
    recs_of = {k: load_records(out_dir(*k)) for k in caps_of}
    wl_name = {"trace": "Azure trace", "paper-means": "paper means"}
    for fig, wl, t, kinds in FIGURE_TABLES:
        head = ["setting"] + (["workload"] if len(workloads) > 1 else []) + [
            "rates", "vLLM", "NEO", "DualPace", "DualPace / vLLM (paper)",
            "DualPace / NEO (paper)", "DualPace CPU tier at its knee", NAMES[ABLATION],
            f"DualPace / {NAMES[ABLATION]}", "NEO CPU tier at its knee"]
        rows = []
        for s, (panel_, title, _, paper) in PAPER.items():
            kind = "code" if "-code-" in s else "conv"
            for w in workloads:
                if kind not in kinds or (s, w) not in caps_of:
                    continue
                caps = caps_of[(s, w)]
                d = caps.get((t, "dualpace"))
                pv, pn = paper.get(t, (None, None))
                rows.append([f"({panel_}) {' / '.join(title.split(', ')[:2])}"]
                            + ([wl_name[w]] if len(workloads) > 1 else [])
                            + [rates_measured(out_dir(s, w)).split(" (")[0].replace(" req/s", "")]
                            + [caps[(t, p)].text if (t, p) in caps else "—"
                               for p in ("vllm", "neo", "dualpace")]
                            + [f"{ratio_text(d, caps.get((t, 'vllm')))} ({_paper_cell(pv)})",
                               f"{ratio_text(d, caps.get((t, 'neo')))} ({_paper_cell(pn)})",
                               at_knee(recs_of[(s, w)], "dualpace", d)]
                            + [caps[(t, ABLATION)].text if (t, ABLATION) in caps else "—",
                               ratio_text(d, caps.get((t, ABLATION)))
                               if (t, ABLATION) in caps else "—"]
                            + [at_knee(recs_of[(s, w)], "neo", caps.get((t, "neo")))])
        blocks.append(f"{fig}, {TARGET_TEXT[t]} ({wl})\n\n{_render(head, rows, markdown)}")
    return "\n\n".join(blocks)


def _render(head, rows, markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(x) for c, x in zip(r, w)) for r in [head] + rows)


def rates_measured(out: Path) -> str:
    from simserve.capacity import load_records
    rs = sorted({r["request_rate"] for r in load_records(out)})
    return f"{rs[0]:g}–{rs[-1]:g} req/s ({len(rs)} rates)"


# --------------------------------------------------------------------------- plots

# y-axis top per target in display units (s/token, s): 2.5x the target
YMAX = {NL: 2.5, TTFT: 12.5, ITL: 3.75, TPOT: 3.75, TPOT1: 2.5, ITL1: 2.5}


def panel(ax, records, target: str, caps: dict, title: str, styles=None, legend=False):
    """One paper-style panel: the metric against the rate per curve, the target line, a mark
    where each curve crosses it; linear y clipped at 2.5x the target as in the paper."""
    from simserve.capacity import parse_target
    from simserve.plots import rate_curve
    t = parse_target(target)
    rate_curve(records, t.metric, ax, target=t, capacities=[c for (tt, _), c in caps.items()
                                                            if tt == target],
               styles=styles or _styles(records), logy=False, legend=legend, title=title)
    ax.set_ylim(0, YMAX[target])
    ax.title.set_fontsize(8.5)
    # x up to the first measured rate where every curve is off the top (the paper's plots stop
    # shortly past the knees), at least to every crossing
    by_rate: dict[float, list[float]] = {}
    for r in records:
        v = r.get(t.metric)
        by_rate.setdefault(float(r["request_rate"]), []).append(
            math.inf if v is None or v != v else v * (1e-3 if t.metric.endswith("_ms") else 1))
    rates = sorted(by_rate)
    off = [x for x in rates if min(by_rate[x]) > YMAX[target]]
    cross = [c.bounds[0] for (tt, _), c in caps.items() if tt == target and not c.censored]
    right = max([off[0] if off else rates[-1]] + [min((x for x in rates if x >= c), default=c)
                                                  for c in cross])
    ax.set_xlim(rates[0] - 0.03 * (right - rates[0]), right + 0.03 * (right - rates[0]))


def _styles(records) -> dict:
    from simserve.capacity import group_label, group_records
    out = {}
    for g, _ in group_records(records):
        lab = group_label(g)
        out[lab] = dict(STYLE.get(g.get("policy"), {"color": "0.4", "marker": "x"}))
    return out


def paper_figures(workload: str) -> list[Path]:
    """Fig. 9 (normalized latency, a-f), Fig. 10 (Conv P99 TTFT / ITL), Fig. 13 (Code P99 TTFT
    / ITL) and Fig. 14 (P99 TPOT, Conv / Code), as 2x3 grids like the paper's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simserve.capacity import load_records
    conv = [s for s in PAPER if "-conv-" in s]
    code = [s for s in PAPER if "-code-" in s]
    layouts = {"fig09": ("Fig. 9: normalized latency", [(conv, NL), (code, NL)]),
               "fig10": ("Fig. 10: Azure-Conversation tails", [(conv, TTFT), (conv, ITL)]),
               "fig13": ("Fig. 13: Azure-Code tails", [(code, TTFT), (code, ITL)]),
               "fig14": ("Fig. 14: P99 TPOT", [(conv, TPOT), (code, TPOT)])}
    data = {}
    for s in PAPER:
        o = out_dir(s, workload)
        if (o / "summary.json").exists():
            data[s] = (load_records(o), capacities(o))
    suffix = "" if workload == "trace" else "-paper-means"
    wl = ("first 2,000 Azure 2023 requests" if workload == "trace"
          else "synthetic, paper's Fig. 8 means")
    written = []
    for name, (title, rows) in layouts.items():
        fig, axes = plt.subplots(2, 3, figsize=(13, 7.2), layout="constrained")
        for r, (stems, target) in enumerate(rows):
            for c, s in enumerate(stems):
                ax = axes[r, c]
                if s not in data:
                    ax.set_visible(False)
                    continue
                recs, caps = data[s]
                panel(ax, recs, target, caps, f"({PAPER[s][0]}) {PAPER[s][1]}")
        handles = [plt.Line2D([], [], color=STYLE[p]["color"], marker=STYLE[p]["marker"],
                              label=NAMES[p]) for p in ("dualpace", "neo", "vllm")]
        fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
        fig.suptitle(f"{title} (simserve, {wl}; ○ sustainable rate, ▷ never crossed)",
                     fontsize=11)
        p = PLOTS / f"{name}{suffix}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        declutter(fig)   # value labels apart, for the final layout
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written


def four_panels(out: Path, title: str, path: Path, targets=TARGETS, styles=None) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simserve.capacity import load_records
    recs, caps = load_records(out), capacities(out, targets)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.2 * len(targets), 3.8),
                             layout="constrained")
    for ax, t in zip(axes, targets):
        panel(ax, recs, t, caps, TARGET_TEXT[t], styles=styles)
    h, lab = axes[0].get_legend_handles_labels()
    keep = [(a, b) for a, b in zip(h, lab) if not b.startswith("target")]
    fig.legend([a for a, _ in keep], [b for _, b in keep], loc="outside lower center",
               ncol=min(len(keep), 6), frameon=False, fontsize=8)
    fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    declutter(fig)   # value labels apart, for the final layout
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- Fig. 11

FIG11 = {"fig11a-15a-cpu-tp": ("Fig. 11a / 15a: CPU TP", ["cpu-tp1", "cpu-tp2"]),
         "fig11b-15b-host-kv": ("Fig. 11b / 15b: host KV capacity", ["kv30", "kv60", "kv120",
                                                                       "kv240"])}
FIG11_TARGETS = (NL, TTFT, ITL, ITL1, TPOT1, TPOT)
# paper: (numerator variant, denominator variant, {target: ratio})
FIG11_PAPER = {   # Fig. 11's ITL target is not stated: §6.4's +29.7 % is shown on both rows
    "fig11a-15a-cpu-tp": [("cpu-tp2", "cpu-tp1", {NL: 1.150, TTFT: 1.143, ITL: 1.297,
                                                  ITL1: 1.297, TPOT1: 1.31})],
    "fig11b-15b-host-kv": [
        ("kv120", "kv30", {NL: 1.287, TTFT: 1.283, ITL: "< 1", ITL1: "< 1", TPOT1: "< 1"}),
        ("kv120", "kv60", {NL: 1.185, TTFT: 1.146, ITL: "< 1", ITL1: "< 1", TPOT1: "< 1"}),
        ("kv240", "kv120", {NL: "≈ 1", TTFT: "≈ 1", ITL: "≈ 1", ITL1: "≈ 1",
                            TPOT1: "≈ 1"})],
}


def fig11_label(group: dict) -> str:
    p, v = group.get("policy"), group.get("variant")
    if p == "vllm":
        return "vllm"
    return f"{p} · {v}"


def fig11_name(label: str) -> str:
    """'dualpace · cpu-tp2' -> 'DualPace TP2', 'neo · kv30' -> 'NEO 30 GiB'."""
    if label == "vllm":
        return "vLLM"
    pol, var = label.split(" · ")
    var = {"cpu-tp1": "TP1", "cpu-tp2": "TP2"}.get(var, var.replace("kv", "") + " GiB")
    if pol == "neo" and var == "TP1":
        var = "(12 cores)"
    return f"{NAMES[pol]} {var}"


def fig11_caps(out: Path) -> dict:
    from simserve.capacity import grid_capacity, load_records, parse_target
    recs = load_records(out)
    caps = grid_capacity(recs, [parse_target(t) for t in FIG11_TARGETS])
    tmap = {parse_target(t): t for t in FIG11_TARGETS}
    res = {}
    for c in caps:
        res.setdefault((tmap[c.target], fig11_label(c.group)), c)  # vLLM: its first variant
    return res


def fig11_table(stem: str, out: Path, markdown=True) -> str:
    """Two tables: the sustainable rate of every curve (a row each, a column per target), and
    DualPace's ratios between variants beside the paper's."""
    caps = fig11_caps(out)
    variants = FIG11[stem][1]
    cols = [f"dualpace · {v}" for v in variants] + [f"neo · {v}" for v in variants] + ["vllm"]
    cols = [c for c in cols if any(k[1] == c for k in caps)]
    head = ["curve"] + [TARGET_TEXT[t] for t in FIG11_TARGETS]
    rows = [[fig11_name(c)] + [caps[(t, c)].text if (t, c) in caps else "—"
                               for t in FIG11_TARGETS] for c in cols]
    def ratio(t, num, den):
        return ratio_text(caps.get((t, f"dualpace · {num}")), caps.get((t, f"dualpace · {den}")))
    ratios = [[f"DualPace {fig11_name('dualpace · ' + num)[9:]} / "
               f"{fig11_name('dualpace · ' + den)[9:]}"]
              + [f"{ratio(t, num, den)} ({_paper_cell(paper.get(t))})" for t in FIG11_TARGETS]
              for num, den, paper in FIG11_PAPER[stem]]
    return (_render(head, rows, markdown) + "\n\n"
            + _render(["ratio (paper)"] + head[1:], ratios, markdown))


def fig11_plot() -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simserve.capacity import load_records
    targets = (NL, TTFT, ITL, TPOT1)
    fig, axes = plt.subplots(2, 4, figsize=(17, 8.4), layout="constrained")
    for r, stem in enumerate(FIG11):
        out = RESULTS / stem
        if not (out / "summary.json").exists():
            continue
        recs = load_records(out)
        seen, keep = set(), []
        for x in recs:   # vLLM once (it has no host KV / CPU TP)
            lab = fig11_label({"policy": x["policy"], "variant": x.get("variant")})
            if x["policy"] == "vllm" and (lab, x["request_rate"]) in seen:
                continue
            seen.add((lab, x["request_rate"]))
            keep.append({k: v for k, v in x.items() if k != "variant"}
                        if x["policy"] == "vllm" else x)
        from simserve.capacity import group_label, group_records
        labels = [group_label(g) for g, _ in group_records(keep)]
        cmap = matplotlib.colormaps["Reds"], matplotlib.colormaps["Blues"]
        vs = FIG11[stem][1]
        styles = {}
        for lab in labels:
            if lab == "vllm":
                styles[lab] = dict(STYLE["vllm"])
                continue
            pol, var = lab.split(" · variant=")
            shade = 0.45 + 0.55 * vs.index(var) / max(len(vs) - 1, 1)
            styles[lab] = {"color": (cmap[0] if pol == "dualpace" else cmap[1])(shade),
                           "marker": "o" if pol == "dualpace" else "s"}
        from simserve.capacity import grid_capacity, parse_target
        caps = {}
        for c in grid_capacity(keep, [parse_target(t) for t in targets]):
            caps[(next(t for t in targets if parse_target(t) == c.target),
                   group_label(c.group))] = c
        for ax, t in zip(axes[r], targets):
            panel(ax, keep, t, caps, f"{FIG11[stem][0]}: {TARGET_TEXT[t]}", styles=styles)
        h, lab = axes[r][0].get_legend_handles_labels()
        kept = [(a, b.replace(" · variant=", " ")) for a, b in zip(h, lab)
                if not b.startswith("target")]
        axes[r][0].legend([a for a, _ in kept], [b for _, b in kept], fontsize=7, loc="upper left")
    fig.suptitle("Fig. 11 / 15: sensitivity, Llama-3.1-8B, RTX 4090 + 12 cores/rank, Azure-Conv "
                 "(first 2,000 requests)", fontsize=11)
    p = PLOTS / "fig11-sensitivity.png"
    p.parent.mkdir(parents=True, exist_ok=True)
    declutter(fig)   # value labels apart, for the final layout
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p


# --------------------------------------------------------------------------- Fig. 1

def fig1(rate: float, requests: int | None) -> None:
    """Fig. 1 top: cumulative generated and CPU-decoded tokens over time at one rate, for
    vLLM, NEO and DualPace; prints a table and draws fig1-progress.png."""
    import numpy as np

    from simserve.runner.config import load_experiment
    from simserve.runner.point import make_workload
    from simserve.hardware.setup import resolve_hardware
    from simserve.policies.dualpace.progress import cpu_progress_stalls, token_progress
    from simserve.run import simulate_point
    sets = ["policies=[{name: vllm}, {name: neo}, {name: dualpace}]", f"workload.rates=[{rate}]"]
    if requests:
        sets.append(f"workload.num_requests={requests}")
    cfg = load_experiment(HERE / "fig01-progress-llama8b-rtx4090.yaml", sets)
    hw = resolve_hardware(cfg.hardware)
    curves = {}
    for pol in cfg.policies:
        res = simulate_point(make_workload(cfg, rate, 0), cfg.model, hw, pol.name, pol.config)
        end = float(np.nanmax(res.records.token_times_s))
        curves[pol.name] = token_progress(res.records, np.linspace(0, end, 200))
        p = token_progress(res.records, np.linspace(0, end, 11))
        print(f"Fig. 1 ({pol.name}, {rate} req/s): time s / total tokens / CPU-decoded tokens")
        for t, a, c in zip(p["t_s"], p["tokens_total"], p["tokens_cpu"]):
            print(f"  {t:8.1f} {a:9d} {c:9d}")
        st = cpu_progress_stalls(res.records, 2.0)
        print(f"  CPU-token gaps > 2 s: {len(st)} (longest {st.max() if len(st) else 0:.2f} s)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, c in curves.items():
        line, = ax.plot(c["t_s"], c["tokens_total"], label=f"{name}: all tokens")
        if c["tokens_cpu"].any():
            ax.plot(c["t_s"], c["tokens_cpu"], "--", color=line.get_color(),
                    label=f"{name}: CPU-decoded tokens")
    ax.set(xlabel="time (s)", ylabel="cumulative tokens",
           title=f"Llama-3.1-8B, RTX 4090 + 12 cores, Azure-Conversation, {rate} req/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = PLOTS
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "fig1-progress.png", dpi=110)
    print(f"plot: {out / 'fig1-progress.png'}")


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run experiments whose name contains this")
    ap.add_argument("--workload", choices=("trace", "paper-means", "both"), default="trace")
    ap.add_argument("--policies", help="comma-separated policy labels of the experiments (vllm, neo, dualpace, vllm-dplimit), run as their YAML writes them")
    ap.add_argument("--requests", type=int, help="fewer requests (quick look)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-run", action="store_true", help="tables from existing results only")
    ap.add_argument("--plots", action="store_true", help="also draw the figures")
    ap.add_argument("--text", action="store_true", help="plain tables instead of markdown")
    ap.add_argument("--by-figure", action="store_true",
                    help="with --no-run: one table per paper figure and target")
    ap.add_argument("--fig1", action="store_true")
    ap.add_argument("--fig11", action="store_true")
    ap.add_argument("--h200", action="store_true", help="the measured H200 machine")
    ap.add_argument("--rate", type=float, default=3.5)
    a = ap.parse_args()
    md = not a.text
    if a.fig1:
        fig1(a.rate, a.requests)
        return 0
    if a.fig11:
        for stem in FIG11:
            if a.only and a.only not in stem:
                continue
            out = RESULTS / stem
            if not a.no_run:
                subprocess.run([sys.executable, "-m", "simserve.cli", "sweep",
                                str(HERE / f"{stem}.yaml"), "--out", str(out), "--workers",
                                str(a.workers), "-q"], check=True, cwd=ROOT)
            print(f"\n{stem} ({rates_measured(out)})\n{fig11_table(stem, out, md)}")
        if a.plots:
            print(f"plot: {fig11_plot()}")
        return 0
    if a.h200:
        out = RESULTS / H200
        if not a.no_run:
            run_sweep(H200, "trace", a.workers, requests=a.requests)
        print(f"\n{H200} ({rates_measured(out)})\n{table(H200, out, md)}")
        if a.plots:
            print("plot:", four_panels(out, "Llama-3.1-8B, H200 + 16 cores xeon-emr (measured "
                                       "profiles), Azure-Conv, first 2,000 requests",
                                       PLOTS / "h200.png"))
        return 0
    pols = a.policies.split(",") if a.policies else None
    workloads = ("trace", "paper-means") if a.workload == "both" else (a.workload,)
    if a.by_figure:
        print(figure_tables(workloads, md))
        if a.plots:
            for wl in workloads:
                for p in paper_figures(wl):
                    print(f"plot: {p}")
        return 0
    for wl in workloads:
        for stem in PAPER:
            if a.only and a.only not in stem:
                continue
            out = out_dir(stem, wl) if a.no_run else run_sweep(stem, wl, a.workers, pols,
                                                                 a.requests)
            if not (out / "summary.json").exists():
                print(f"\n{stem} ({wl}): no results")
                continue
            print(f"\nFig. 9{PAPER[stem][0]} {stem} ({wl}, {rates_measured(out)})\n"
                  f"{table(stem, out, md)}")
        if a.plots:
            for p in paper_figures(wl):
                print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
