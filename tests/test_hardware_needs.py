"""A CPU-tier design without a host CPU is refused before anything runs: no point simulated,
no results folder created, one line naming the field."""
from __future__ import annotations

from simserve.cli import main

YAML = """name: n2
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: random, num_requests: 20, rates: [2], random_input_len: 128, random_output_len: 16}
policies:
  - name: vllm
  - name: POLICY
"""


def _refused(capsys, argv, tmp_path, monkeypatch) -> str:
    import simserve.runner.point as point
    ran = []
    real = point.simulate_point
    monkeypatch.setattr(point, "simulate_point", lambda *a, **k: ran.append(1) or real(*a, **k))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not ran
    assert not (tmp_path / "out").exists()
    return err[0]


def test_run_and_sweep_refuse_neo_and_dualpace_without_a_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for policy, field in (("neo", "hardware.cpu"), ("dualpace", "hardware.cpu")):
        (tmp_path / "e.yaml").write_text(YAML.replace("POLICY", policy))
        line = _refused(capsys, ["run", "e.yaml", "--out", "out", "-q"], tmp_path, monkeypatch)
        assert line.startswith(f"simserve: error: e.yaml: {field}:"), line
        (tmp_path / "s.yaml").write_text(YAML.replace("POLICY", policy)
                                         + "sweep:\n  workload.rates: [1, 2]\n")
        line = _refused(capsys, ["sweep", "s.yaml", "--out", "out"], tmp_path, monkeypatch)
        assert f"s.yaml: {field}:" in line and f"policy={policy}" in line, line
    # with the CPU tier named, the check passes (cpu_cores too, for dualpace)
    (tmp_path / "e.yaml").write_text(YAML.replace("POLICY", "dualpace").replace(
        "num_gpus: 1}", "num_gpus: 1, cpu: xeon-silver-4510}"))
    line = _refused(capsys, ["run", "e.yaml", "--out", "out", "-q"], tmp_path, monkeypatch)
    assert "hardware.cpu_cores:" in line, line


def test_check_policy_names_its_own_flag(capsys):
    assert main(["check-policy", "dualpace", "-n", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("simserve check-policy: --cpu: "), err
    assert main(["check-policy", "dualpace", "-n", "20", "--cpu", "xeon-silver-4510"]) == 2
    assert capsys.readouterr().err.startswith("simserve check-policy: --cpu-cores: ")


def test_the_python_api_gets_the_same_rule_at_build():
    import numpy as np
    import pytest

    from simserve.errors import ConfigError
    from simserve.hardware.setup import HardwareConfig
    from simserve.run import simulate_point
    from simserve.workload.spec import Workload
    w = Workload(arrival_s=np.zeros(2), prompt_tokens=np.array([16, 16]),
                 output_tokens=np.array([2, 2]))
    with pytest.raises(ConfigError, match=r"^hardware\.cpu: policy neo runs on the host CPU"):
        simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h100-sxm"), "neo")
