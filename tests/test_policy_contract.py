"""The policy contract (`simserve/policies/base.py`): every built-in policy executes through
the context's GPU cost hook; a policy written outside simserve, registered through the public
API or an entry point, runs end to end; names come from the `@register` decorators."""
from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import simserve.policies as policies
from simserve.cost import GpuCostModel
from simserve.cost.sp import SpCostModel
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.policies import builtin_policies, get_policy, policy_names, register
from simserve.policies.base import (Deployment, Engine, EngineBase, KvPool, cost_model, deploy,
                                    kv_blocks)
from simserve.policies.signal import Signal
from simserve.run import simulate_point
from simserve.sim.kv import BlockPool
from tests.helpers import workload

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "how-to" / "add-a-policy.md"
MODEL = "llama-3.1-8b"
WL = workload([0.0, 0.01, 0.02, 0.5], [300, 1200, 40, 700], [20, 5, 30, 9])


def _hardware(name: str) -> HardwareConfig:
    # NEO runs one engine over all GPUs at its default tp 1; the rest get two GPUs (replicas,
    # SP instances, a prefill/decode split) and a CPU for the CPU-offloading designs
    return HardwareConfig(gpu="h100-sxm", num_gpus=1 if name == "neo" else 2,
                          cpu="xeon-silver-4510", cpu_cores=12)


class Slower:
    """A hook's result: the wrapped cost model with every `*_s` duration doubled."""

    def __init__(self, cost):
        self._cost = cost

    def __getattr__(self, name):
        attr = getattr(self._cost, name)
        if callable(attr) and name.endswith("_s"):
            return lambda *a, **k: attr(*a, **k) * 2
        return attr


@pytest.fixture
def built_models(monkeypatch):
    """Every GPU / SP cost model constructed at the top level (an SP model's inner GPU model
    is part of it), in construction order."""
    made, depth = [], [0]
    for cls in (GpuCostModel, SpCostModel):
        orig = cls.__init__

        def init(self, *a, _orig=orig, **k):
            depth[0] += 1
            try:
                _orig(self, *a, **k)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                made.append(self)
        monkeypatch.setattr(cls, "__init__", init)
    return made


@pytest.mark.parametrize("name", sorted(builtin_policies()))
def test_every_policy_executes_through_the_gpu_cost_hook(name, built_models):
    hw = resolve_hardware(_hardware(name))
    plain = simulate_point(WL, MODEL, hw, name)
    built_models.clear()
    hooked = []
    slow = simulate_point(WL, MODEL, hw, name,
                          gpu_cost_hook=lambda c: hooked.append(c) or Slower(c))
    # doubling every GPU duration delays every first token (the first request arrives idle)
    assert slow.records.first_token_s[0] > plain.records.first_token_s[0]
    assert slow.stats["sim_end_s"] > plain.stats["sim_end_s"]
    # and no engine executes on a model that bypassed the hook
    assert hooked and all(any(m is h for h in hooked) for m in built_models), \
        f"{name}: cost models built without ctx.gpu_cost_hook"


@pytest.mark.parametrize("name", sorted(builtin_policies()))
def test_every_policy_deploys_engines_that_meet_the_protocols(name):
    import simpy

    from simserve.policies import make_config
    from simserve.sim.cluster import Cluster
    from simserve.sim.context import ArrivalSource, Recorder, SimContext
    from simserve.sim.requests import RequestTable
    hw = resolve_hardware(_hardware(name))
    env = simpy.Environment()
    table = RequestTable(WL)
    ctx = SimContext(env, get_model(MODEL), hw,
                     Cluster.build(env, hw.gpu, hw.num_gpus, hw.pcie, hw.nvlink), table,
                     ArrivalSource(env, table.arrival), Recorder(), np.random.default_rng(0))
    dep = get_policy(name)[1](ctx, make_config(name, {}))
    assert isinstance(dep, Deployment) and dep.engines and callable(dep.on_arrival)
    assert all(isinstance(e, Engine) for e in dep.engines)
    assert all(isinstance(p, KvPool) for p in dep.kv_pools)
    assert [p for e in dep.engines for p in e.kv_pools()] == list(dep.kv_pools)
    assert not ctx.stats, "policies report through the Deployment, not ctx.stats"


def test_builtin_names_are_exactly_the_registered_builtins():
    for mod in pkgutil.walk_packages(policies.__path__, "simserve.policies."):
        importlib.import_module(mod.name)
    registered = {n for n, (_, build) in policies._REGISTRY.items()
                  if build.__module__.startswith("simserve.policies.")}
    assert set(builtin_policies()) == registered
    for name, module in builtin_policies().items():
        assert get_policy(name)[1].__module__ == module


def test_unknown_policy_is_one_line_with_did_you_mean():
    with pytest.raises(ConfigError,
                       match=r"unknown policy 'vlm' \(did you mean 'vllm'\?\); known: "):
        get_policy("vlm")


# -- a policy written outside simserve, against base.py only ---------------------------------
@dataclass(frozen=True, slots=True)
class FcfsConfig:
    gpu_memory_utilization: float = 0.9
    block_size: int = 16


class FcfsEngine(EngineBase):
    """One request at a time: the prompt, then one decode step per further token."""

    def __init__(self, ctx, cfg: FcfsConfig, index: int):
        self.ctx, self.index, self.gpus = ctx, index, [index]
        blocks, kv = kv_blocks(ctx, "policy test-fcfs", 1, cfg.gpu_memory_utilization,
                               cfg.block_size, 4096, 1)
        self.pool = BlockPool(f"fcfs{index}.kv", blocks, cfg.block_size)
        self.kv_summary = dict(kv.summary(), num_gpu_blocks=blocks)
        self.cost = cost_model(ctx, lambda: GpuCostModel(ctx.model, ctx.hardware.gpu, 1),
                               "policy test-fcfs")
        self.queue, self.busy, self.signal, self.served = [], 0, Signal(ctx.env), 0

    def load(self) -> int:
        return len(self.queue) + self.busy

    def enqueue(self, rid: int) -> None:
        self.queue.append(rid)
        self.signal.fire()

    def counters(self) -> dict:
        return {"num_served": self.served, "num_engines": 1}

    def run(self):
        env, t = self.ctx.env, self.ctx.table
        while True:
            if not self.queue:
                yield self.signal.wait()
                continue
            rid = self.queue.pop(0)
            self.busy, ids = 1, np.array([rid])
            p, n = int(t.prompt[rid]), int(t.output[rid])
            nb = self.pool.blocks_for(p + n)
            self.pool.allocate(nb)
            yield env.timeout(self.cost.prefill_only_s(p))
            t.computed[ids] = p
            t.emit(ids, env.now)
            for i in range(1, n):
                yield env.timeout(self.cost.decode_only_s(1, p + i))
                t.computed[ids] += 1
                t.emit(ids, env.now)
            self.pool.free(nb)
            self.busy, self.served = 0, self.served + 1


def _build_fcfs(ctx, cfg: FcfsConfig):
    return deploy(ctx, "test-fcfs", [FcfsEngine(ctx, cfg, i)
                                     for i in range(ctx.hardware.num_gpus)])


def test_out_of_tree_policy_runs_end_to_end():
    register("test-fcfs", FcfsConfig)(_build_fcfs)
    assert "test-fcfs" in policy_names()
    hw = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=2))
    # requests 0 and 2 go to replica 0 (least loaded, lowest index first), 1 to replica 1
    w = workload([0.0, 0.001, 0.002], [200, 300, 100], [3, 2, 4])
    res = simulate_point(w, MODEL, hw, "test-fcfs", gpu_memory_utilization=0.8)
    cost = GpuCostModel(get_model(MODEL), hw.gpu, 1)
    rec = res.records
    t0 = rec.token_times(0)
    assert t0[0] == pytest.approx(cost.prefill_only_s(200), rel=1e-12)
    assert t0[1] - t0[0] == pytest.approx(cost.decode_only_s(1, 201), rel=1e-12)
    # request 2 waited for request 0 on replica 0; request 1 ran alone on replica 1
    assert rec.token_times(2)[0] == pytest.approx(t0[-1] + cost.prefill_only_s(100), rel=1e-12)
    assert rec.token_times(1)[0] == pytest.approx(0.001 + cost.prefill_only_s(300), rel=1e-12)
    # the runner sums counters() over engines and reports each engine's pool
    assert res.stats["counters"] == {"num_served": 3, "num_engines": 2}
    assert res.stats["peak_kv_blocks"] == [-(-203 // 16), -(-302 // 16)]
    assert res.stats["kv_blocks_in_use_at_end"] == [0, 0]
    assert [e["gpus"] for e in res.stats["engines"]] == [[0], [1]]


def test_a_second_policy_under_one_name_is_refused():
    register("test-fcfs-once", FcfsConfig)(_build_fcfs)

    def other(ctx, cfg):
        return _build_fcfs(ctx, cfg)
    with pytest.raises(ConfigError, match="registered twice"):
        register("test-fcfs-once", FcfsConfig)(other)


def _guide_module() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    return blocks[0]


def test_the_guides_policy_registers_through_an_entry_point_and_runs_from_yaml(tmp_path):
    """docs/how-to/add-a-policy.md, followed: its module installed as a distribution with a
    `simserve.policies` entry point (a dist-info folder on the path), then `simserve run` of
    its YAML in a fresh process."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "toy_fcfs.py").write_text(_guide_module())
    info = site / "toy_fcfs-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-fcfs\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[simserve.policies]\ntoy-fcfs = toy_fcfs\n")
    yaml = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S)[0]
    yaml = yaml.replace("num_requests: 100", "num_requests: 12").replace("[2, 4]", "[4]")
    (tmp_path / "toy.yaml").write_text(yaml)
    env = {"PYTHONPATH": f"{site}:{ROOT}", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "simserve", "run", "toy.yaml", "--no-save"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "toy-fcfs" in out.stdout
    bad = yaml.replace("gpu_memory_utilization: 0.85", "gpu_memory_utilizaton: 0.85")
    (tmp_path / "bad.yaml").write_text(bad)
    out = subprocess.run([sys.executable, "-m", "simserve", "run", "bad.yaml", "--no-save"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "did you mean 'gpu_memory_utilization'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_entry_point_that_registers_nothing_is_a_one_line_error(tmp_path, monkeypatch):
    (tmp_path / "empty_policy.py").write_text("X = 1\n")
    info = tmp_path / "empty_policy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: empty-policy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[simserve.policies]\nghost = empty_policy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ghost" in policy_names()
    with pytest.raises(ConfigError, match="registered no policy 'ghost'"):
        get_policy("ghost")
    with pytest.raises(ConfigError, match="did you mean 'ghost'"):
        get_policy("ghosts")


def test_naming_a_policy_does_not_import_the_others():
    code = textwrap.dedent("""
        import sys
        from simserve.policies import get_policy, policy_names
        policy_names()
        get_policy("vllm")
        print(sorted(m for m in sys.modules if m.startswith("simserve.policies.")))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    loaded = out.stdout
    for other in ("dualpace", "conflux", "neo", "loongserve", "muxwise", "distserve"):
        assert f"simserve.policies.{other}" not in loaded
