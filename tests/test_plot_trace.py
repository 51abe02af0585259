"""`simserve plot` draws one point's timeline: a row per trace track, a bar per iteration or
transfer, from a --trace-events file or a sweep point folder (re-simulated with a trace)."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from simserve.cli import main  # noqa: E402
from simserve.plot_trace import trace_gantt, tracks  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = """\
name: tiny
model: llama-3.1-8b
hardware: {gpu: rtx4090, num_gpus: 1, cpu: xeon-silver-4510, cpu_cores: 12, pcie: pcie4-x16}
workload: {trace: synthetic-conversation, num_requests: 60, arrival: poisson, rates: [2], seed: 0}
policies:
  - {name: dualpace}
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    (d / "tiny.yaml").write_text(SMALL)
    assert main(["run", str(d / "tiny.yaml"), "--no-save", "-q", "--trace-events",
                 str(d / "t.json")]) == 0
    return d / "t.json"


def test_gantt_has_a_row_per_track_and_a_bar_per_event(trace):
    doc = json.loads(trace.read_text())
    order, by = tracks(doc)
    assert "GPU engine 0" in order and "CPU engine 1" in order
    assert any("pcie" in n for n in order)
    ax = trace_gantt(trace)
    assert [t.get_text() for t in ax.get_yticklabels()] == order
    bars = {}
    for coll in ax.collections:   # one BrokenBarHCollection per track and kind
        row = round(coll.get_paths()[0].vertices[:, 1].mean())
        bars[order[row]] = bars.get(order[row], 0) + len(coll.get_paths())
    assert bars == {n: len(es) for n, es in by.items()}
    legend = ax.get_legend()   # outside the bars
    fig = ax.figure
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert legend.get_window_extent(r).x0 >= ax.get_window_extent(r).x1
    plt.close(fig)
    ax = trace_gantt(trace, window=(1.0, 2.0))
    assert ax.get_xlim() == (1.0, 2.0)
    plt.close(ax.figure)


def test_plot_command_from_trace_file_and_point_folder(trace, tmp_path, capsys):
    assert main(["plot", "--trace-events", str(trace), "--out", str(tmp_path / "a"),
                 "--format", "png"]) == 0
    assert (tmp_path / "a" / "trace.png").read_bytes()[:8] == PNG
    (tmp_path / "tiny.yaml").write_text(SMALL)
    assert main(["sweep", str(tmp_path / "tiny.yaml"), "--out", str(tmp_path / "s"), "-q",
                 "--workers", "1"]) == 0
    point = next((tmp_path / "s" / "points").iterdir())
    capsys.readouterr()
    assert main(["plot", str(point), "--format", "png"]) == 0
    assert (point / "plots" / "trace.png").read_bytes()[:8] == PNG
    doc = json.loads((point / "plots" / "trace.json").read_text())
    assert tracks(doc)[0] == tracks(json.loads(trace.read_text()))[0]
    for bad, msg in ((["--trace-events", str(tmp_path / "nope.json")], "no such file"),
                     (["--trace-events", str(trace), "--window", "2,1"], "after T0"),
                     ([], "RESULTS folder or --trace-events")):
        capsys.readouterr()
        assert main(["plot", *bad]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
