"""ConfluxServe with the paper's estimator and with the oracle, beside the paper (issue 13 §2):
goodput per design, ConfluxServe's ratio over the best baseline of its row, its p99 ITL against
τ and its estimator counters, from the sweeps of `experiments/conflux/fig1{2,6,7}-*.yaml`.

    simserve sweep experiments/conflux/fig12-qwen14b.yaml --out RESULTS/fig12-qwen14b
    ... (one folder per figure; the H200 rows with --set hardware.gpu=h200-sxm, folder -h200)
    python benchmarks/conflux_estimator_figures.py RESULTS [--json OUT.json] [--csv OUT.csv]

Goodput is the sustained one (`metrics.sustained_goodput`: attainment >= 95 % and keep-up
>= 0.95, first crossing, interpolated); the plain attainment reading is kept beside it.
ConfluxServe's p99 ITL is read over the rates it passes (up to its goodput), and its estimator
counters at the highest passing rate.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import pandas as pd
import yaml

from simserve.metrics import max_rate_meeting, sustained_goodput

# folder name -> (label, τ ms, paper: ConfluxServe-FCFS, ConfluxServe, FCFS ratio, "++" ratio);
# §8.2 (Fig. 12), §8.3 (Fig. 16, 17); None where the paper gives no number
FIGURES = {
    "fig12-llama8b": ("Fig. 12 Llama-3.1-8B, 4x H100", 50, 7.9, 9.2, 1.33, 1.26),
    "fig12-qwen14b": ("Fig. 12 Qwen3-14B, 4x H100", 100, 6.0, 7.9, 1.34, 1.52),
    "fig12-qwen32b": ("Fig. 12 Qwen3-32B, 8x H100", 100, 4.1, 5.6, 1.62, 1.44),
    "fig12-llama8b-h200": ("Fig. 12 Llama-3.1-8B, 4x H200", 50, None, None, None, None),
    "fig12-qwen14b-h200": ("Fig. 12 Qwen3-14B, 4x H200", 100, None, None, None, None),
    "fig12-qwen32b-h200": ("Fig. 12 Qwen3-32B, 8x H200", 100, None, None, None, None),
    "fig16-qwen14b-mooncake-synthetic": ("Fig. 16 Mooncake-Synthetic", 100, None, 5.5, None, 1.7),
    "fig16-qwen14b-qwen-a": ("Fig. 16 QwenA", 100, None, 15.6, None, 1.1),
    "fig17-qwen14b-tbt150": ("Fig. 17 TBT 150 ms", 150, None, 8.3, None, 1.4),
    "fig17-qwen14b-tbt50": ("Fig. 17 TBT 50 ms", 50, None, 7.2, None, 1.5),
}
CONFLUX = {"fcfs": ("conflux-fcfs", "conflux-fcfs-oracle"),
           "slo": ("confluxserve", "confluxserve-oracle")}
COUNTERS = ("conflux_estimator_mape", "conflux_estimator_bias",
            "conflux_prefill_iter_over_tau_share", "conflux_p99_prefill_iter_over_tau",
            "conflux_tbt_margin", "conflux_alpha", "conflux_beta")


def _curves(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["policy"], []).append(r)
    return {k: sorted(v, key=lambda r: r["request_rate"]) for k, v in out.items()}


def goodputs(rows: list[dict]) -> tuple[float, float]:
    """(sustained, plain) goodput of one design's rate curve."""
    rates = [r["request_rate"] for r in rows]
    att = [math.nan if r["slo_attainment"] is None else r["slo_attainment"] for r in rows]
    keep = [math.nan if r.get("keep_up_ratio") is None else r["keep_up_ratio"] for r in rows]
    return sustained_goodput(rates, att, keep)[0], max_rate_meeting(rates, att)[0]


def conflux_view(rows: list[dict], goodput: float) -> dict:
    """p99 ITL over the passing rates (<= goodput) and the counters at the highest of them."""
    passing = [r for r in rows if r["request_rate"] <= goodput + 1e-9] or rows[:1]
    itl = [r["p99_itl_ms"] for r in passing]
    top = passing[-1]
    return {"p99_itl_ms_min": min(itl), "p99_itl_ms_max": max(itl),
            "counters_at_rate": top["request_rate"],
            **{k: (top.get("counters") or top).get(k) for k in COUNTERS}}


def late_decode_shares(folder: Path, labels: set[str]) -> dict[tuple[str, float], float]:
    """(label, rate) -> share of requests that met the TTFT SLO and missed a later token's
    deadline (a decode that fell behind τ·k), from each ConfluxServe point's requests.csv."""
    out = {}
    for cfg_file in (folder / "points").glob("*/config.yaml"):
        cfg = yaml.safe_load(cfg_file.read_text())
        pol = cfg["policies"][0]
        if pol.get("label") not in labels:
            continue
        f = pd.read_csv(cfg_file.parent / "requests.csv")
        ttft_ok = f.ttft_s <= cfg["slo"]["ttft_ms"] * 1e-3
        out[(pol["label"], float(f.request_rate.iloc[0]))] = float((ttft_ok & ~f.slo_met).mean())
    return out


def summarize_figure(name: str, records: list[dict], folder: Path | None = None) -> dict:
    label, tau, p_fcfs, p_slo, p_rf, p_rs = FIGURES[name]
    curves = _curves(records)
    good = {k: goodputs(v) for k, v in curves.items()}
    conflux_labels = {x for pair in CONFLUX.values() for x in pair}
    late = late_decode_shares(folder, conflux_labels) if folder is not None else {}
    base = {k: v for k, v in good.items() if k not in conflux_labels}
    fcfs = {k: v for k, v in base.items() if "++" not in k}
    plus = {k: v for k, v in base.items() if "++" in k}
    out = {"figure": name, "setting": label, "tau_ms": tau, "goodput": {k: v[0] for k, v in good.items()},
           "goodput_plain": {k: v[1] for k, v in good.items()},
           "paper": {"conflux_fcfs": p_fcfs, "confluxserve": p_slo, "fcfs_ratio": p_rf,
                     "plus_ratio": p_rs}}
    for row, best in (("fcfs", fcfs), ("slo", plus)):
        b = max(best, key=lambda k: best[k][0]) if best else None
        out[f"best_{row}_baseline"] = b and {"label": b, "goodput": best[b][0]}
        for lab, est in zip(CONFLUX[row], ("paper", "oracle")):
            if lab not in curves:
                continue
            g = good[lab][0]
            above = [r["request_rate"] for r in curves[lab] if r["request_rate"] > g + 1e-9]
            fail_rate = above[0] if above else None
            out[f"{row}_{est}"] = {"label": lab, "goodput": g,
                                   "ratio": g / best[b][0] if b and best[b][0] > 0 else None,
                                   **conflux_view(curves[lab], g),
                                   "first_failing_rate": fail_rate,
                                   "ttft_met_later_token_late_share": late.get((lab, fail_rate))}
    return out


def _f(x, fmt="{:.2f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


# What simserve's LoongServe lacks of its paper: its rows are marked "simplified"
LOONGSERVE_SIMPLIFIED = ("simplified: one SP group per iteration, no elastic scale-up during "
                         "decode, no multi-master decode, no KV spread over instances")


def baseline_name(label: str) -> str:
    """A design's label as a headline table prints it (LoongServe's marked simplified)."""
    return f"{label} (simplified)" if label.startswith("loongserve") else label


def markdown(rows: list[dict]) -> str:
    head = ("| setting (τ) | row | paper's estimator (the headline): goodput / ratio | "
            "oracle (what-if, never the quoted ratio): goodput / ratio | "
            "paper: goodput / ratio | best baseline | p99 ITL, paper's / oracle (τ) | "
            "estimator MAPE / bias / share of prefill iterations over τ, paper's vs oracle | "
            "first failing rate: requests with TTFT met and a later token late, paper's / "
            "oracle |")
    lines = [head, "|" + "---|" * 9]
    for s in rows:
        for row, paper_g, paper_r, name in (("fcfs", "conflux_fcfs", "fcfs_ratio", "FCFS"),
                                            ("slo", "confluxserve", "plus_ratio", "++")):
            p, o = s.get(f"{row}_paper"), s.get(f"{row}_oracle")
            if p is None and o is None:
                continue
            b = s.get(f"best_{row}_baseline") or {}
            cell = lambda v: (f"{_f(v['goodput'])} / {_f(v['ratio'])}" if v else "—")
            itl = lambda v: (f"{v['p99_itl_ms_min']:.0f}–{v['p99_itl_ms_max']:.0f}" if v else "—")
            late = lambda v: (f"{_f(v['ttft_met_later_token_late_share'], '{:.1%}')} at "
                              f"{_f(v['first_failing_rate'], '{:g}')}" if v else "—")
            cnt = lambda v: (f"{_f(v['conflux_estimator_mape'], '{:.1%}')} / "
                             f"{_f(v['conflux_estimator_bias'], '{:+.1%}')} / "
                             f"{_f(v['conflux_prefill_iter_over_tau_share'], '{:.0%}')}"
                             if v else "—")
            lines.append(
                f"| {s['setting']} ({s['tau_ms']} ms) | {name} | {cell(p)} | {cell(o)} | "
                f"{_f(s['paper'][paper_g], '{:.1f}')} / {_f(s['paper'][paper_r])} | "
                f"{baseline_name(b.get('label', '—'))} {_f(b.get('goodput'))} | "
                f"{itl(p)} / {itl(o)} | "
                f"{cnt(p)} vs {cnt(o)} | {late(p)} / {late(o)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="folder holding one sweep folder per figure (FIGURES keys)")
    ap.add_argument("--json", help="write the per-figure summaries here")
    ap.add_argument("--csv", help="write one row per design and figure here")
    a = ap.parse_args(argv)
    root = Path(a.results)
    rows = []
    for name in FIGURES:
        f = root / name / "summary.json"
        if f.exists():
            rows.append(summarize_figure(name, json.loads(f.read_text()), root / name))
    print(markdown(rows))
    if any(str((s.get(f"best_{r}_baseline") or {}).get("label", "")).startswith("loongserve")
           for s in rows for r in ("fcfs", "slo")):
        print(f"\nLoongServe {LOONGSERVE_SIMPLIFIED}.")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    if a.csv:
        with open(a.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["figure", "policy", "sustained_goodput", "plain_goodput"])
            for s in rows:
                for k in sorted(s["goodput"]):
                    w.writerow([s["figure"], k, f"{s['goodput'][k]:.3f}",
                                f"{s['goodput_plain'][k]:.3f}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
