"""benchmarks/figures.py regenerates the repository's figures (none of which are committed):
a validation folder's from its committed CSVs, a ConfluxServe figure from a (tiny) sweep."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "figures.py"
PNG = b"\x89PNG\r\n\x1a\n"
MAX_EXAMPLE_BYTES = 150_000


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_lists_a_job_per_validation_folder_and_paper_figure():
    r = _run("--list")
    assert r.returncode == 0, r.stderr
    names = r.stdout.split()
    scored = [d.name for d in (ROOT / "validation").iterdir()
              if any((d / f).exists() for f in ("gpu_scored.csv", "cpu_scored.csv",
                                                "sp_scored.csv"))]
    assert scored and all(f"validation/{d}" in names for d in scored)
    assert "conflux/qwen14b" in names and "dualpace/fig11-sensitivity" in names


def test_tiny_subset_draws_into_out(tmp_path):
    out, res = tmp_path / "figs", tmp_path / "results"
    r = _run("--only", "validation/h200-sxm-x2-sp2-qwen3-14b",
             "--only", "validation/h200-sxm-llama-3.1-8b-run2",
             "--only", "conflux/fig17-qwen14b-tbt50", "--out", str(out), "--results", str(res),
             "--workers", "1", "--set", "workload.num_requests=10", "--set", "workload.rates=[1,2]",
             "--set", "policies=[{name: chunked, label: chunked-2048, "
             "max_num_batched_tokens: 2048}, {name: conflux, label: confluxserve}]")
    assert r.returncode == 0, r.stderr
    want = [out / "validation" / "h200-sxm-x2-sp2-qwen3-14b" / "sp_iterations.png",
            out / "validation" / "h200-sxm-llama-3.1-8b-run2" / "iterations.png",
            out / "validation" / "h200-sxm-llama-3.1-8b-run2" / "replay.png",
            out / "experiments" / "conflux" / "plots" / "fig17-qwen14b-tbt50" / "attainment.png",
            out / "experiments" / "conflux" / "plots" / "fig17-qwen14b-tbt50" / "latency.png"]
    printed = r.stdout.split()
    for p in want:
        assert p.read_bytes()[:8] == PNG and str(p) in printed
    assert (res / "conflux-fig17-qwen14b-tbt50-sweep" / "summary.json").exists()
    # --no-run draws from the results just made, runs nothing
    r = _run("--only", "conflux/fig17-qwen14b-tbt50", "--no-run", "--out", str(tmp_path / "b"),
             "--results", str(res))
    assert r.returncode == 0 and "points" not in r.stdout
    assert (tmp_path / "b" / "experiments" / "conflux" / "plots" / "fig17-qwen14b-tbt50"
            / "latency.png").exists()


def test_unknown_job_is_one_line_exit_2():
    r = _run("--only", "no-such-figure")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such job" in r.stderr


def test_no_generated_figure_is_committed():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    images = [f for f in files if f.lower().endswith((".png", ".jpg", ".jpeg", ".gif"))]
    shown = "\n".join((ROOT / f).read_text() for f in files if f.endswith(".md"))
    for f in images:  # only small examples that a README or doc shows
        assert (ROOT / f).stat().st_size <= MAX_EXAMPLE_BYTES, f
        assert Path(f).name in shown, f"{f} is committed but no document shows it"
    ignored = subprocess.run(["git", "check-ignore", "experiments/conflux/plots/x/latency.png",
                              "validation/some-run/iterations.png"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert len(ignored) == 2
