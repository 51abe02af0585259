"""vLLM's measured host path on derived profiles: carried over from the measured H200
(`hardware/rescale.py` carry_engines), used when asked for (`engine: vllm`), never by a
policy's default there (paper comparisons on derived GPUs price every design alike)."""
from __future__ import annotations

import numpy as np
from simserve.cost.host import engine_host
from simserve.hardware.profile import load_profile
from simserve.hardware.rescale import rescale_gpu
from simserve.hardware.setup import HardwareConfig
from simserve.run import simulate_point
from simserve.workload.spec import Workload


def test_host_path_carries_over_and_fa3_tables_only_to_hopper():
    src = load_profile("h200-sxm").overheads["engines"]["vllm-0.22.1"]
    h100 = rescale_gpu("h200-sxm", "h100-sxm")["overheads"]["engines"]["vllm-0.22.1"]
    ada = rescale_gpu("h200-sxm", "rtx4090")["overheads"]["engines"]["vllm-0.22.1"]
    for e in (h100, ada):
        assert e["carried_from"] == "h200-sxm"
        assert e["frontend"] == src["frontend"] and e["step_us"] == src["step_us"]
    # FA3 is Hopper's: rescaled for the H100 (slower HBM: decode attention takes longer) ...
    d_src = np.asarray(src["attention"]["llama-3.1-8b"]["decode_attn"]["us"])
    d_h100 = np.asarray(h100["attention"]["llama-3.1-8b"]["decode_attn"]["us"])
    assert (d_h100 >= d_src).all() and (d_h100[-1] > 1.3 * d_src[-1]).all()
    # ... dropped for the RTX 4090, with the in-situ factor fitted against them
    assert "attention" not in ada and "gpu_in_situ" not in ada


def test_default_engine_uses_only_a_host_path_measured_on_that_gpu():
    h100 = load_profile("h100-sxm")
    assert engine_host(h100, None) is None                 # generic overheads
    assert engine_host(h100, "vllm").frontend is not None  # asked for: the carried path
    assert engine_host(load_profile("h200-sxm"), None).name == "vllm-0.22.1"


def test_engine_vllm_on_a_derived_gpu_pays_the_front_end():
    w = Workload(arrival_s=np.array([0.0]), prompt_tokens=np.array([512]),
                 output_tokens=np.array([4]))
    hw = HardwareConfig(gpu="h100-sxm")
    ttft = {e: simulate_point(w, "llama-3.1-8b", hw, "vllm", engine=e).records.first_token_s[0]
            for e in (None, "vllm")}
    fe = load_profile("h100-sxm").overheads["engines"]["vllm-0.22.1"]["frontend"]
    # the admission work and both hand-offs come on top (the host step hides under the GPU)
    assert ttft["vllm"] - ttft[None] >= 0.9 * (fe["in_us"] + fe["in_delay_us"]
                                               + fe["out_delay_us"]) * 1e-6
