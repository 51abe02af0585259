"""A DualPace variant that keeps long requests on the CPU, written against the documented
hooks of `policies.dualpace.gpu_schedule` (placement, swap-in) and `engine.build_dualpace`."""
from __future__ import annotations

import numpy as np

from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.policies import register
from simserve.policies.dualpace.config import DualPaceConfig
from simserve.policies.dualpace.engine import build_dualpace
from simserve.policies.dualpace.envelope import admit_prefills
from simserve.run import simulate_point
from tests.helpers import workload

LONG = 3000       # prompt tokens from which a request stays on the CPU
placed: dict[int, str] = {}


def long_on_cpu(c):
    """Order-preserving FIFO placement; the first long prompt and all after it go to the CPU."""
    first_long = next((i for i, n in enumerate(c.prompt_tokens) if n >= LONG), None)
    res = admit_prefills(c.prompt_blocks, c.peak_blocks, **c.envelope, cpu_from=first_long)
    placed.update(zip(c.ids, res.dest))
    return res


def short_swap_in(p, mark=False):
    """The FIFO swap-in rule (and step 6's marks), skipping long prompts: they finish on the CPU."""
    prompt = p.table.prompt
    for r in p.swap_in_candidates(mark):
        if prompt[r] < LONG and not p.take_swap_in(r, mark):
            break


@register("dualpace-long-on-cpu", DualPaceConfig)
def build(ctx, cfg):
    return build_dualpace(ctx, cfg, placement=long_on_cpu, swap_in=short_swap_in)


def test_long_requests_stay_on_the_cpu():
    rng = np.random.default_rng(3)
    n = 40
    prompt = rng.integers(200, 6000, n)
    w = workload(np.sort(rng.uniform(0, 8, n)), prompt, rng.integers(20, 120, n))
    hw = resolve_hardware(HardwareConfig(gpu="rtx4090", cpu="xeon-silver-4510", cpu_cores=12))
    placed.clear()
    res = simulate_point(w, "llama-3.1-8b", hw, "dualpace-long-on-cpu", cpu_batch_limit=64)
    base = simulate_point(w, "llama-3.1-8b", hw, "dualpace", cpu_batch_limit=64)
    assert np.isfinite(res.records.finish_s).all()
    long_ids = [i for i in range(n) if prompt[i] >= LONG]
    assert long_ids and all(placed[i] == "cpu" for i in long_ids)
    c, b = res.stats["counters"], base.stats["counters"]
    assert c["num_prefill_to_cpu"] >= len(long_ids)
    assert c["cpu_token_share"] > b["cpu_token_share"]    # long requests decode on the CPU


def test_the_variant_passes_check_policy():
    from simserve.policy_check import check
    hw = {"gpu": "rtx4090", "cpu": "xeon-silver-4510", "cpu_cores": 12}
    assert check("dualpace-long-on-cpu", {"cpu_batch_limit": 64}, hardware=hw, n=120, rate=2.0,
                 compiled=False) == []
