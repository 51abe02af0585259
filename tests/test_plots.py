"""Figures: `simserve plot` writes PNG and SVG for a tiny results folder; the plotting functions
return their axes; token timelines (exact and linear) count tokens right."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from simserve import plots  # noqa: E402
from simserve.cli import main  # noqa: E402
from simserve.capacity import grid_capacity, parse_target  # noqa: E402

SMALL = """\
name: small
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: synthetic-conversation, num_requests: 100, arrival: poisson, rates: [4, 24, 40], seed: 0}
policies:
  - {name: vllm, max_num_batched_tokens: 2048}
  - {name: sarathi, max_num_batched_tokens: 512}
slo: {ttft_ms: 1000, tbt_ms: 100}
"""

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("plots")
    (d / "small.yaml").write_text(SMALL)
    assert main(["run", str(d / "small.yaml"), "--out", str(d / "r"), "-q"]) == 0
    return d / "r"


def test_plot_command_writes_png_and_svg(results, tmp_path, capsys):
    out = tmp_path / "figs"
    assert main(["plot", str(results), "--out", str(out), "--target", "p99_ttft_ms<=2000",
                 "--target", "p90_e2el_ms<=20000"]) == 0
    printed = capsys.readouterr().out.split()
    for stem in ("latency", "attainment", "timeline"):
        png, svg = out / f"{stem}.png", out / f"{stem}.svg"
        assert str(png) in printed and str(svg) in printed
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
        assert b"<svg" in svg.read_bytes()[:500]
    svg = (out / "latency.svg").read_text()
    assert "P99 time to first token" in svg and "P90 E2EL" in svg  # extra target, extra panel


def test_plot_default_out_timeline_point_and_formats(results, capsys):
    assert main(["plot", str(results), "--timeline-rate", "4", "--format", "pdf",
                 "--approx-timeline"]) == 0
    assert (results / "plots" / "timeline.pdf").read_bytes()[:4] == b"%PDF"
    assert main(["plot", str(results), "--timeline-rate", "5"]) == 2
    assert "no requests of that point" in capsys.readouterr().err
    assert main(["plot", str(results), "--format", "gif"]) == 2
    assert "--format 'gif'" in capsys.readouterr().err
    assert main(["plot", str(results), "--slo", "1000"]) == 2
    assert "TTFT_MS,TBT_MS" in capsys.readouterr().err


def test_plot_summary_only_folder(tmp_path, capsys):
    recs = [{"policy": p, "request_rate": r, "seed": 0, "variant": None, "point": f"{p}{r}",
             "p99_ttft_ms": v, "mean_normalized_latency_s": v / 1e4}
            for p, k in (("a", 1.0), ("b", 2.0)) for r, v in ((2, 100 * k), (4, 3000 * k))]
    (tmp_path / "summary.json").write_text(json.dumps(recs))
    assert main(["plot", str(tmp_path), "--format", "png"]) == 0
    out = capsys.readouterr().out
    assert "no token timeline" in out
    assert (tmp_path / "plots" / "latency.png").stat().st_size > 0
    assert not (tmp_path / "plots" / "attainment.png").exists()  # no slo_attainment
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_functions_return_their_axes(results):
    recs = json.loads((results / "summary.json").read_text())
    targets = [parse_target("p99_ttft_ms<=1000"), parse_target("slo_attainment>=0.95")]
    caps = grid_capacity(recs, targets)
    ax = plots.latency_vs_rate(recs, metric="p99_ttft_ms", target=targets[0], capacities=caps)
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "request rate (req/s)"
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"vllm", "sarathi"}
    plt.close(ax.figure)
    ax = plots.attainment_vs_rate(pd.DataFrame(recs), capacities=caps)
    assert ax.get_ylim() == (-3, 105)
    plt.close(ax.figure)
    fig = plt.figure()
    axes = plots.latency_panels(recs, fig, targets=targets, capacities=caps)
    assert len(axes) == 4 and all(a.get_title() for a in axes)
    plt.close(fig)


def test_token_timeline_counts():
    grid = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    # one token at 1, four more spread until 3; an unfinished request counts its first token
    y = plots._cumulative_linear(np.array([1.0, 2.0]), np.array([3.0, np.nan]),
                                 np.array([5.0, 9.0]), grid)
    assert list(y) == [0, 1, 1 + 1 + 2, 1 + 4 + 1, 5 + 1]
    assert list(plots._cumulative_exact([0.5, 1.0, 1.0, np.nan, 3.5], grid)) == [0, 3, 3, 3, 4]
    req = pd.DataFrame({"policy": ["p", "p"], "arrival_s": [0.0, 0.5],
                        "first_token_s": [1.0, 2.0], "finish_s": [3.0, 2.5],
                        "output_tokens": [5, 2]})
    ax = plots.token_timeline(req)
    (label, demand) = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "approx." in label and "demand" in demand
    assert ax.lines[0].get_ydata()[-1] == 7
    plt.close(ax.figure)
    ax = plots.token_timeline(req, token_times={"p": [1, 1.5, 2, 2.5, 3, 2, 2.5]}, offered=False)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p"]
    assert ax.lines[0].get_ydata()[-1] == 7
    plt.close(ax.figure)
