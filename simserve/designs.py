"""Which serving design a result's curve belongs to, and the best curve of each design: a
comparison figure draws one curve per design (as the papers do, e.g. ConfluxServe's Chunked
Prefill at its best token budget), the other swept variants on request."""
from __future__ import annotations

import re

from simserve.capacity import Capacity, group_label, group_records


def design_key(record: dict) -> tuple:
    """(policy, scheduler or None) of a summary record. Records name the registered policy
    (`policy_name`) and its options; older ones only their label ('chunked++-2048'), read as
    the policy before the first '-' or '+', '++' or 'srpt' meaning SRPT, 'fcfs' FCFS."""
    opts = record.get("policy_options") or {}
    name = record.get("policy_name")
    if name is None:
        label = str(record.get("policy"))
        name = re.split(r"[-+]", label, maxsplit=1)[0] or label
        sched = ("srpt" if "++" in label or "srpt" in label else
                 "fcfs" if "fcfs" in label else None)
    else:
        sched = opts.get("scheduler") if isinstance(opts, dict) else None
    from simserve.plot_styles import DESIGNS
    if (name, None) in DESIGNS:
        return name, None
    if sched is None and any(k[0] == name for k in DESIGNS):
        sched = "slo" if name == "conflux" else "fcfs"   # the policies' defaults
    return name, sched


def curves_by_design(records: list[dict]) -> dict[tuple, list[str]]:
    """Design key -> its curves' labels, in order of first appearance."""
    out: dict[tuple, list[str]] = {}
    for g, recs in group_records(records):
        out.setdefault(design_key(recs[0]), []).append(group_label(g))
    return out


def best_curves(records: list[dict], caps: list[Capacity]) -> dict[tuple, str]:
    """Design key -> the label of its curve with the highest sustainable rate under the
    first target of `caps` that ranks them (its lower bound, then upper; the first curve on a
    tie or when no target applies)."""
    by_design = curves_by_design(records)
    rate = {}
    for c in caps:
        rate.setdefault(c.target, {})[group_label(c.group)] = c.bounds
    out = {}
    for key, labels in by_design.items():
        best = labels[0]
        for bounds in rate.values():
            have = [lab for lab in labels if lab in bounds]
            if len(have) == len(labels) and len({bounds[lab] for lab in have}) > 1:
                best = max(labels, key=lambda lab: (bounds[lab], -labels.index(lab)))
                break
        out[key] = best
    return out
