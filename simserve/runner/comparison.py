"""The curves a comparison figure draws: one per design (its best swept variant under the
figure's targets; every variant with `--all-variants`), each in its design's look and under its
name in the papers (`simserve.plot_styles`, `simserve.designs`)."""
from __future__ import annotations

from simserve.capacity import Capacity, Target, grid_capacity, group_label, group_records
from simserve.designs import best_curves, curves_by_design
from simserve.plot_styles import design_name, design_styles, variant_style

# which target ranks a design's variants: the papers' headline first (ConfluxServe's goodput
# at 95 % attainment; DualPace's P99 TTFT and normalized latency)
RANK_ORDER = ("slo_attainment", "p99_ttft_ms", "mean_normalized_latency_s")


def select(records: list[dict], targets: list[Target], all_variants: bool = False
           ) -> tuple[list[dict], list[Capacity], dict]:
    """(records of the curves kept, their sustainable rates under `targets`, style per curve
    label, with the legend's label under 'label')."""
    caps = grid_capacity(records, targets)
    order = sorted(targets, key=lambda t: RANK_ORDER.index(t.metric)
                   if t.metric in RANK_ORDER else len(RANK_ORDER))
    ranked = [c for t in order for c in caps if c.target == t]
    best = best_curves(records, ranked)
    by_design = curves_by_design(records)
    base = design_styles(by_design)
    styles, keep = {}, set()
    for key, labels in by_design.items():
        name, b = design_name(key), best[key]
        styles[b] = {**base[key], "label": name if len(labels) == 1 else f"{name} ({b})"}
        keep.add(b)
        for i, lab in enumerate(x for x in labels if x != b):
            styles[lab] = {**variant_style(base[key], i), "label": f"{name} ({lab})"}
            if all_variants:
                keep.add(lab)
    kept = [r for g, recs in group_records(records) if group_label(g) in keep for r in recs]
    caps = [c for c in caps if group_label(c.group) in keep]
    return kept, caps, styles
