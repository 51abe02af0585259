"""experiments/dualpace: every file parses, follows the paper's setup, and the ratio text of
benchmarks/dualpace_paper.py carries censoring through."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from simserve.capacity import Capacity, parse_target
from simserve.runner.config import load_experiment
from simserve.runner.sweep import load_sweep

DIR = Path(__file__).resolve().parents[1] / "experiments" / "dualpace"


def _dualpace_paper():
    spec = importlib.util.spec_from_file_location(
        "dualpace_paper", DIR.parents[1] / "benchmarks" / "dualpace_paper.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("path", sorted(DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_files_parse(path):
    sw = load_sweep(path)
    assert sw.points
    for sp in sw.points:
        assert sp.cfg.workload.num_requests in (300, 2000)
        assert sp.cfg.workload.arrival == "poisson"


def test_figure_files_run_the_three_policies_on_the_paper_hardware():
    pr = _dualpace_paper()
    hw = {"llama8b-rtx4090": ("rtx4090", 1, "xeon-silver-4510", 12),
          "qwen14b-2xh20": ("h20", 2, "xeon-8469c", 24),
          "qwen32b-4xh20": ("h20", 4, "xeon-8469c", 48)}
    for stem, (_, _, tp, _) in pr.PAPER.items():
        cfg = load_experiment(DIR / f"{stem}.yaml")
        assert {p.name for p in cfg.policies} == {"vllm", "neo", "dualpace"}
        key = next(k for k in hw if k in stem)
        h = cfg.hardware
        assert (h.gpu, h.num_gpus, h.cpu, h.cpu_cores) == hw[key]
        assert all(p.config.tp == tp for p in cfg.policies if p.name != "dualpace")
        assert cfg.workload.trace == ("azure-code" if "-code-" in stem else "azure-conv")
        rates = pr.PAPER_MEANS_RATES[stem]
        assert rates == sorted(rates) and len(rates) >= 10


def test_fig11_variants():
    a = load_sweep(DIR / "fig11a-15a-cpu-tp.yaml")
    got = {(sp.variant, sp.policy, sp.cfg.hardware.cpu_cores,
            getattr(sp.cfg.policies[0].config, "cpu_tp", None)) for sp in a.points}
    assert got == {("cpu-tp1", "dualpace", 12, 1), ("cpu-tp1", "neo", 12, None),
                   ("cpu-tp1", "vllm", 12, None), ("cpu-tp2", "dualpace", 24, 2)}
    b = load_sweep(DIR / "fig11b-15b-host-kv.yaml")
    for sp in b.points:
        if sp.policy != "vllm":
            assert sp.cfg.policies[0].config.host_kv_gib == int(sp.variant[2:])


def _cap(rate, censored=False, lo=1.0, hi=8.0):
    return Capacity({}, parse_target("p99_ttft_ms<=5000"), rate, censored, lo, hi)


def test_ratio_text_censoring():
    r = _dualpace_paper().ratio_text
    assert r(_cap(4.0), _cap(2.0)) == "2.00"
    assert r(_cap(8.0, True), _cap(2.0)) == "≥ 4.00"            # a met everywhere
    assert r(_cap(4.0), _cap(8.0, True)) == "≤ 0.50"            # b met everywhere
    assert r(_cap(4.0), _cap(math.nan, True, lo=2.0)) == "≥ 2.00"   # b failed at its lowest
    assert r(_cap(math.nan, True, lo=2.0), _cap(4.0)) == "≤ 0.50"
    assert r(_cap(8.0, True), _cap(8.0, True)) == "—"
    assert r(None, _cap(2.0)) == "—"


def test_h20_files_carry_vllm_at_dualpace_token_limit():
    # issue 13 §1's ablation: on the H20 settings vLLM also runs at DualPace's own profiled
    # GPU batched-token limit (§4.3), whatever the profile derives it to be
    from simserve.hardware.setup import resolve_hardware
    from simserve.models import get_model
    from simserve.policies.dualpace import controls
    pr = _dualpace_paper()
    for stem, (_, _, tp, _) in pr.PAPER.items():
        cfg = load_experiment(DIR / f"{stem}.yaml")
        by_label = {p.label: p for p in cfg.policies}
        if cfg.hardware.gpu != "h20":
            assert pr.ABLATION not in by_label
            continue
        hw = resolve_hardware(cfg.hardware)
        limit = controls.gpu_token_limit_from(hw.gpu, get_model(cfg.model), tp)
        ab = by_label[pr.ABLATION]
        assert ab.name == "vllm" and ab.config.tp == tp
        assert ab.config.max_num_batched_tokens == limit
        assert by_label["vllm"].config.max_num_batched_tokens is None   # its own default, 8,192
        assert ab.config.enable_prefix_caching is False


def test_counters_at_the_knee():
    spec = importlib.util.spec_from_file_location(
        "dualpace_counters", DIR.parents[1] / "benchmarks" / "dualpace_counters.py")
    c = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(c)
    rates = [1.0, 2.0, 3.0]
    assert c.knee_rate(rates, _cap(2.4)) == 3.0                  # first rate at or above it
    assert c.knee_rate(rates, _cap(3.0, True)) == 3.0            # never crossed: the last
    assert c.knee_rate(rates, _cap(math.nan, True, lo=1.0)) == 1.0   # failed at once
    recs = [{"policy": "dualpace", "request_rate": r,
             "counters": {"cpu_token_share": r / 10, "num_cpu_batches": int(r),
                          "num_prefill_to_cpu": 0, "num_swap_out": 1, "num_swap_in": 2}}
            for r in rates] + [{"policy": "vllm", "request_rate": 1.0}]
    assert c.at_knee(recs, "dualpace", _cap(2.4)) == "CPU 30.0 %, 3 b, P2C 0, swaps 1/2 at 3"
    assert c.at_knee(recs, "vllm", _cap(2.4)) == "—"
    assert c.grid_max(recs, "dualpace")["num_cpu_batches"] == 3
