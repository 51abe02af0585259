"""Sweeps on Dask and Ray workers that run elsewhere: worker processes in another folder that
cannot open the submitter's files and lack its environment, as on another machine. Their
results must match the local executor's byte for byte; a missing engine or an unreachable
cluster is a one-line error with exit status 2."""
from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import simserve
from tests.sweep_helpers import pinned_date  # noqa: F401 (autouse fixture)
from tests.sweep_helpers import sweep as _sweep, tree as _tree
from simserve.errors import SimserveError
from simserve.runner import sweep_run
from simserve.runner.sweep import load_sweep

# a trace file beside the YAML, named by a relative path: workers elsewhere cannot read it
SWEEP = """\
name: remote
model: llama-3.1-8b
hardware: {gpu: h100-sxm, num_gpus: 1}
workload: {trace: data/trace.csv, num_requests: 80, arrival: scale, seed: 1}
policies:
  - {name: vllm, max_num_batched_tokens: 2048}
slo: {ttft_ms: 1000, tbt_ms: 100}
sweep:
  workload.rates: [3, 9]
variants:
  base: {}
  big: {policies.0.max_num_batched_tokens: 4096}
"""
N_SIMS = 4
REPO = str(Path(simserve.__file__).resolve().parents[1])


def elsewhere_setup(project: str, cwd: str) -> str:
    """Python run first in each worker process: it moves to `cwd`, forgets the submitter's
    SOURCE_DATE_EPOCH and refuses to open any file under `project` (an audit hook), as a worker
    on another machine would; simserve is importable from the checkout, as if installed."""
    return f"""
import os, sys
sys.path.insert(0, {REPO!r})
os.chdir({cwd!r})
os.environ.pop("SOURCE_DATE_EPOCH", None)

def _not_here(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith({project!r}):
            raise PermissionError(f"{{path}}: not on this worker's machine")

sys.addaudithook(_not_here)
"""





@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The sweep YAML and its trace file, and the sweep run by the local executor (a pool of
    two processes)."""
    root = tmp_path_factory.mktemp("project")
    (root / "data").mkdir()
    rng = np.random.default_rng(5)
    arrivals = np.cumsum(rng.exponential(0.2, 100))
    rows = [f"{a:.6f},{p},{o}" for a, p, o in zip(arrivals, rng.integers(20, 900, 100),
                                                   rng.integers(1, 200, 100))]
    (root / "data" / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                             + "\n".join(rows) + "\n")
    (root / "sweep.yaml").write_text(SWEEP)
    assert _sweep([root / "sweep.yaml", "--out", root / "local", "--workers", 2]) == 0
    assert len(list((root / "local" / "points").iterdir())) == N_SIMS
    return root


def test_the_setup_really_hides_the_submitters_files(project, tmp_path):
    """The guard the two engine tests rely on: a process set up as a remote worker cannot
    read the trace, so a worker that reads it itself fails."""
    import subprocess

    code = elsewhere_setup(str(project), str(tmp_path)) + \
        f"open({str(project / 'data' / 'trace.csv')!r})"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0 and "not on this worker's machine" in res.stderr


# A cluster that never comes up (a loaded 2-core machine) must fail the run, not hang it: the
# thread method also stops a test blocked inside the engine's C code (it ends the process,
# printing every thread's stack).
CLUSTER_TIMEOUT = pytest.mark.timeout(240, method="thread")


@pytest.mark.slow
@CLUSTER_TIMEOUT
def test_dask_workers_elsewhere_match_local(project, tmp_path):
    """The workers join after the sweep has started and after the client's timeout (as a batch
    system's jobs start late): the sweep waits for them."""
    distributed = pytest.importorskip("distributed")
    setup = tmp_path / "elsewhere_setup.py"
    setup.write_text(elsewhere_setup(str(project), str(tmp_path)))
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=True,
                                  dashboard_address=None, preload=[str(setup)]) as cluster, \
            distributed.Client(cluster.scheduler_address, timeout="2s") as client:
        late = threading.Timer(3.0, cluster.scale, (2,))
        late.start()
        try:
            sweep_run.run_sweep(load_sweep(project / "sweep.yaml"), tmp_path / "d",
                                executor="dask", client=client, progress=False)
        finally:
            late.cancel()  # the sweep failed before the workers were due: never scale
            late.join()
    assert _tree(tmp_path / "d") == _tree(project / "local")


@pytest.mark.slow
@CLUSTER_TIMEOUT
def test_ray_workers_elsewhere_match_local(project, tmp_path):
    ray = pytest.importorskip("ray")
    code = elsewhere_setup(str(project), str(tmp_path))

    def setup():  # pickled by value: a nested function
        exec(code, {})

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": setup})
    try:
        assert _sweep([project / "sweep.yaml", "--out", tmp_path / "r", "--executor",
                       "ray"]) == 0
        assert ray.is_initialized()  # a runtime this process started is left to it
    finally:
        ray.shutdown()
    assert _tree(tmp_path / "r") == _tree(project / "local")


@pytest.mark.parametrize("engine, pip_extra", [("dask", "simserve[dist]"),
                                               ("ray", "simserve[ray]")])
def test_engine_not_installed_is_one_line(project, tmp_path, monkeypatch, capsys, engine,
                                          pip_extra):
    monkeypatch.setitem(sys.modules, {"dask": "distributed"}.get(engine, engine), None)
    assert _sweep([project / "sweep.yaml", "--out", tmp_path / "o", "--executor", engine]) == 2
    err = capsys.readouterr().err
    assert f"pip install '{pip_extra}'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    with pytest.raises(SimserveError):
        sweep_run.run_sweep(load_sweep(project / "sweep.yaml"), tmp_path / "o", executor=engine)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_cluster_is_one_line(project, tmp_path, capsys):
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_closed_port()}"
    assert _sweep([project / "sweep.yaml", "--out", tmp_path / "o", "--executor", "ray",
                   "--address", address]) == 2
    err = capsys.readouterr().err
    assert f"--address {address}: cannot connect to the Ray cluster" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, needle", [
    (["--executor", "local", "--address", "auto"], "--address is for --executor ray"),
    (["--executor", "ray", "--scheduler", "tcp://h:1"], "--scheduler is for --executor dask"),
])
def test_an_option_of_the_other_engine_is_refused(project, tmp_path, capsys, args, needle):
    assert _sweep([project / "sweep.yaml", "--out", tmp_path / "o", *args]) == 2
    assert needle in capsys.readouterr().err


def test_resolved_hardware_pickles_after_a_run():
    """A sweep sends resolved hardware to Dask and Ray workers; the pricing closures cached
    on it by a run (compiled, they do not pickle at all; this test's plain pickle refuses
    them from source too) must not go with it, or Dask waits forever for the inputs."""
    import pickle

    from simserve.hardware.setup import HardwareConfig, resolve_hardware
    from simserve.run import simulate_point
    from tests.helpers import workload
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm"))
    simulate_point(workload([0.0, 0.1], [3000, 500], [4, 4]), "llama-3.1-8b", hw, "vllm")
    again = pickle.loads(pickle.dumps(hw))
    r = simulate_point(workload([0.0, 0.1], [3000, 500], [4, 4]), "llama-3.1-8b", again, "vllm")
    assert r.records.finish_s.max() > 0
