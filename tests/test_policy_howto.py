"""docs/how-to/add-a-policy.md's variants of DualPace and ConfluxServe, as written there: each
registers, runs its own rule and passes `simserve check-policy`; and a vLLM-family variant built
with `chunked_replicas` takes the `router` option."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np

from simserve.api import simulate
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.policy_check import check
from simserve.run import simulate_point
from tests.helpers import workload

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "add-a-policy.md"
CPU_HW = {"gpu": "rtx4090", "cpu": "xeon-silver-4510", "cpu_cores": 12}


def guide_module(index: int, name: str, rename: tuple[str, str] | None = None) -> dict:
    """The guide's `index`-th python block, imported as module `name`; its globals. `rename`: (the
    policy name it registers, another) where a test module registers that name already."""
    code = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)[index]
    if rename:
        assert f'register("{rename[0]}"' in code
        code = code.replace(f'register("{rename[0]}"', f'register("{rename[1]}"')
    module = types.ModuleType(name)   # as importing the file would make it
    exec(compile(code, f"{name}.py", "exec"), module.__dict__)
    sys.modules[name] = module
    return module.__dict__


def test_the_dualpace_variant_keeps_long_prompts_on_the_cpu():
    """Short and long prompts (200-6000 tokens) on an RTX 4090 + Xeon: DualPace swaps some of
    each into the GPU; the guide's rule swaps only short ones."""
    ns = guide_module(2, "dualpace_long", ("dualpace-long-on-cpu", "guide-dualpace-long"))
    rule, taken = ns["short_swap_in"], []

    def spy(planner, mark=False):  # the guide's rule, watching what it swaps in
        before = len(planner.plan.swap_in)
        rule(planner, mark)
        taken.extend(planner.plan.swap_in[before:])
    rng = np.random.default_rng(2)
    n = 120
    prompt = rng.integers(200, 6000, n)
    w = workload(np.sort(rng.uniform(0, 12, n)), prompt, rng.integers(20, 300, n))
    hw = resolve_hardware(HardwareConfig(**CPU_HW))
    ns["build"].__globals__["short_swap_in"] = spy
    try:
        simulate_point(w, "llama-3.1-8b", hw, "guide-dualpace-long", cpu_batch_limit=64)
    finally:
        ns["build"].__globals__["short_swap_in"] = rule
    assert taken and all(prompt[r] < ns["LONG"] for r in taken)
    base = simulate_point(w, "llama-3.1-8b", hw, "dualpace", cpu_batch_limit=64)
    assert base.stats["counters"]["num_swap_in"] > len(taken)  # DualPace swaps long ones too
    assert check("guide-dualpace-long", {"cpu_batch_limit": 64}, hardware=CPU_HW, n=120,
                 rate=2.0, compiled=False) == []


def test_the_conflux_variant_places_through_its_attribute():
    """Every decode placement goes through the guide's rule; where it picks another rank than
    dual-mode placement (Alg. 3), the run differs from `conflux`'s."""
    from simserve.policies.conflux.placement import place_on
    ns = guide_module(3, "conflux_most_free")
    rule, picks = ns["most_free"], []

    def spy(*args):
        picks.append((rule(*args), place_on(*args)))
        return picks[-1][0]
    kw = dict(num_gpus=4, num_requests=150, rate=8, trace="synthetic-conversation")
    ns["build"].__globals__["most_free"] = spy
    try:
        a = simulate("conflux-most-free", **kw).requests
    finally:
        ns["build"].__globals__["most_free"] = rule
    b = simulate("conflux", **kw).requests
    assert len(picks) >= len(a) and all(mine is not None for mine, _ in picks)
    assert any(mine != theirs for mine, theirs in picks)
    assert not np.array_equal(a["finish_s"].to_numpy(), b["finish_s"].to_numpy())
    assert check("conflux-most-free", {}, hardware={"gpu": "h100-sxm", "num_gpus": 4}, n=120,
                 compiled=False) == []


def test_a_vllm_variant_takes_the_router_option():
    guide_module(1, "vllm_spf")
    kw = dict(num_gpus=2, num_requests=200, rate=6, seed=3)
    a = simulate("vllm-spf", **kw).requests
    b = simulate("vllm-spf", router="round_robin", **kw).requests
    assert not np.array_equal(a["finish_s"].to_numpy(), b["finish_s"].to_numpy())


def test_a_plugin_without_a_docstring_is_still_listed(capsys):
    from simserve import cli
    ns = guide_module(1, "vllm_spf_bare", ("vllm-spf", "vllm-spf-bare"))
    sys.modules["vllm_spf_bare"].__doc__ = None
    assert ns["build"].__module__ == "vllm_spf_bare"
    assert cli.main(["policies"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("vllm-spf-bare "))
    assert "no docstring" in line
