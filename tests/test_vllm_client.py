"""`api_server: false` (vLLM's in-process AsyncLLM / LLM client), `detokenize` and `offline`
on the vLLM family: a lone request's TTFT changes by exactly the difference of the two
front ends' modelled costs, and offline adds every request at t = 0."""
from __future__ import annotations

import numpy as np
import pytest

from simserve.cost.host import IN_PROCESS, engine_host
from simserve.hardware.profile import load_profile
from simserve.hardware.setup import HardwareConfig
from simserve.run import simulate_point
from simserve.workload.spec import Workload

PROMPT = 1000


def _ttft_ms(**kw) -> np.ndarray:
    # two requests far apart: each finds the engine idle, so only the front end differs
    w = Workload(arrival_s=np.array([0.0, 2.0]), prompt_tokens=np.array([PROMPT, PROMPT]),
                 output_tokens=np.array([8, 8]), name="lone")
    r = simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm", **kw).records
    return (r.first_token_s - r.arrival_s) * 1e3


def _front_ms(fe: dict, tokens_per_token: bool = True) -> float:
    """A lone request's front-end latency to its first token: admission work, hand-off in,
    output work for one token, hand-off out."""
    us = (fe["in_us"] + fe["in_per_token_us"] * PROMPT + fe.get("in_delay_us", 0.0)
          + fe["out_us"] + fe["out_per_output_us"] + fe.get("out_delay_us", 0.0))
    return us * 1e-3


def test_in_process_client_saves_exactly_the_api_servers_modelled_cost():
    server = engine_host(load_profile("h200-sxm"), "vllm").frontend
    in_proc = dict(IN_PROCESS)
    base, inproc = _ttft_ms(), _ttft_ms(api_server=False)
    want = _front_ms(server) - _front_ms(in_proc)
    assert want > 1.0   # the API server's HTTP path costs more than the in-process client
    np.testing.assert_allclose(base - inproc, want, atol=1e-6)


def test_token_ids_skip_tokenising_and_detokenising():
    a, b = _ttft_ms(api_server=False), _ttft_ms(api_server=False, detokenize=False)
    c = IN_PROCESS
    want = (c["in_per_token_us"] * PROMPT + c["out_per_output_us"]
            - c["out_per_output_no_detok_us"]) * 1e-3
    np.testing.assert_allclose(a - b, want, atol=1e-6)


def test_detokenize_is_not_read_behind_the_api_server():
    np.testing.assert_array_equal(_ttft_ms(), _ttft_ms(detokenize=False))


def test_offline_adds_every_request_at_time_zero():
    w = Workload(arrival_s=np.array([0.0, 5.0, 9.0]), prompt_tokens=np.array([500] * 3),
                 output_tokens=np.array([4] * 3), name="list")
    r = simulate_point(w, "llama-3.1-8b", HardwareConfig(gpu="h200-sxm"), "vllm",
                       offline=True).records
    assert np.all(r.arrival_s == 0.0)
    assert r.finish_s.max() < 1.0   # not the 9 s the workload's arrivals would take


def test_offline_with_the_api_server_is_refused():
    from simserve.policies.vllm_engine_config import ChunkedConfig
    with pytest.raises(ValueError, match="api_server"):
        ChunkedConfig(offline=True, api_server=True).validate()
    with pytest.raises(ValueError, match="detokenize"):
        ChunkedConfig(detokenize="no").validate()
