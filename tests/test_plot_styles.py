"""Comparison figures read like the papers': one look per design that no other design shares,
one curve per design (its best swept variant) unless every variant is asked for, value labels
that do not overlap, the legend outside the data."""
from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from simserve import plots  # noqa: E402
from simserve.capacity import grid_capacity, parse_target  # noqa: E402
from simserve.designs import best_curves, design_key  # noqa: E402
from simserve.errors import ConfigError  # noqa: E402
from simserve.plot_styles import DESIGNS, design_name, design_styles  # noqa: E402
from simserve.policies import builtin_policies, make_config  # noqa: E402
from simserve.runner.comparison import select  # noqa: E402


def _registered_designs() -> list[tuple]:
    """Every built-in policy with every queue order its config accepts (a third-party
    policy installed beside simserve is not this test's business)."""
    keys = []
    for name in builtin_policies():
        cfg = make_config(name, {})
        if not hasattr(cfg, "scheduler"):
            keys.append((name, None))
            continue
        for s in ("fcfs", "srpt", "slo", "edf", "sjf"):
            try:
                make_config(name, {"scheduler": s})
            except ConfigError:
                continue
            keys.append((name, s))
    return keys


def _look(st):
    return st["color"], st["marker"], st["ls"]


def test_no_two_designs_look_alike():
    keys = _registered_designs()
    assert ("loongserve", "fcfs") in keys and ("conflux", "slo") in keys
    styles = design_styles(keys + [("new-policy", None), ("other-new", "srpt")])
    looks = [_look(s) for s in styles.values()]
    assert len(set(looks)) == len(looks)
    assert len({(c, m, ls) for _, c, m, ls in DESIGNS.values()}) == len(DESIGNS)
    # the two that tab10 drew as grey stars
    assert _look(styles[("loongserve", "fcfs")]) != _look(styles[("conflux", "slo")])
    assert {design_name(k) for k in keys} >= {"LoongServe", "ConfluxServe", "Chunked++"}


def test_design_of_a_record():
    assert design_key({"policy": "chunked-512", "policy_name": "chunked",
                       "policy_options": {"scheduler": "srpt"}}) == ("chunked", "srpt")
    assert design_key({"policy": "x", "policy_name": "vllm", "policy_options": {}}) == \
        ("vllm", None)
    assert design_key({"policy": "chunked++-2048"}) == ("chunked", "srpt")   # older records
    assert design_key({"policy": "conflux-fcfs"}) == ("conflux", "fcfs")
    assert design_key({"policy": "conflux"}) == ("conflux", "slo")   # its default
    assert design_key({"policy": "muxwise"}) == ("muxwise", "fcfs")


def _records(curves):
    """curves: label -> (policy_name, scheduler, p99 TTFT ms at rates 1..6)."""
    out = []
    for lab, (pol, sched, ttfts) in curves.items():
        for rate, v in zip(range(1, 7), ttfts):
            out.append({"policy": lab, "request_rate": float(rate), "seed": 0,
                        "policy_name": pol, "policy_options": {"scheduler": sched},
                        "p99_ttft_ms": v})
    return out


CURVES = {  # chunked's best budget is 2048 (it crosses 1000 ms last)
    "chunked-512": ("chunked", "fcfs", [100, 300, 2000, 4000, 8000, 9000]),
    "chunked-2048": ("chunked", "fcfs", [100, 200, 400, 900, 3000, 9000]),
    "chunked-8192": ("chunked", "fcfs", [100, 200, 600, 3000, 6000, 9000]),
    "loongserve": ("loongserve", "fcfs", [150, 250, 800, 1200, 5000, 9000]),
    "conflux": ("conflux", "slo", [120, 260, 700, 950, 1300, 9000]),
    "muxwise": ("muxwise", "fcfs", [130, 240, 750, 1100, 5000, 9000]),
}


def test_one_curve_per_design_unless_all_variants():
    recs = _records(CURVES)
    t = parse_target("p99_ttft_ms<=1000")
    best = best_curves(recs, grid_capacity(recs, [t]))
    assert best[("chunked", "fcfs")] == "chunked-2048"
    kept, caps, styles = select(recs, [t])
    assert sorted({r["policy"] for r in kept}) == ["chunked-2048", "conflux", "loongserve",
                                                   "muxwise"]
    assert {c.group["policy"] for c in caps} == {r["policy"] for r in kept}
    assert styles["chunked-2048"]["label"] == "Chunked Prefill (chunked-2048)"
    assert styles["conflux"]["label"] == "ConfluxServe"
    kept, _, styles = select(recs, [t], all_variants=True)
    assert len({r["policy"] for r in kept}) == len(CURVES)
    others = [styles[x] for x in ("chunked-512", "chunked-8192")]   # same colour, other line
    assert all(s["color"] == styles["chunked-2048"]["color"] for s in others)
    assert len({str(_look(s)) for s in [*others, styles["chunked-2048"]]}) == 3


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("all_variants", [False, True])
def test_value_labels_apart_and_legend_outside(all_variants):
    recs = _records(CURVES)
    t = parse_target("p99_ttft_ms<=1000")
    kept, caps, styles = select(recs, [t], all_variants)
    fig, ax = plt.subplots(figsize=(6, 4))
    plots.rate_curve(kept, "p99_ttft_ms", ax, target=t, capacities=caps, styles=styles)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    labels = [c for c in ax.texts if not c.get_text().startswith("target")]
    assert len(labels) >= 3     # marks at 3.5-4.2 req/s: close enough to collide unmoved
    boxes = [x.get_window_extent(r) for x in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b)
    assert ax.get_legend().get_window_extent(r).x0 >= ax.get_window_extent(r).x1
    names = [x.get_text() for x in ax.get_legend().get_texts()]
    assert "LoongServe" in names and "ConfluxServe" in names
    plt.close(fig)
