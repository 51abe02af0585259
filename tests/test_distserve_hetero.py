"""`distserve` with a decode pool of another GPU kind: decode priced by that GPU, KV sized by
its memory, the hand-off over the inter-node link; the default split unchanged."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from simserve.cost import GpuCostModel
from simserve.errors import ConfigError
from simserve.hardware.setup import HardwareConfig, resolve_hardware
from simserve.models import get_model
from simserve.run import simulate_point
from tests.helpers import workload

MODEL = "llama-3.1-8b"
H100X1 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=1))
H100X4 = resolve_hardware(HardwareConfig(gpu="h100-sxm", num_gpus=4))
H20X1 = resolve_hardware(HardwareConfig(gpu="h20", num_gpus=1))
# ib-ndr400.yaml (assumed): 45 GB/s one way, 5 us per transfer
IB_GBPS, IB_LAT_S = 45.0, 5e-6


def _kv_bytes(prompt: int) -> float:
    # Llama-3.1-8B: 32 layers, 8 KV heads of 128 dims, bf16, K and V
    return prompt * 2 * 32 * 8 * 128 * 2


def _digest(rec) -> str:
    h = hashlib.sha256()
    for a in (rec.token_times_s, rec.num_preemptions, rec.first_token_s, rec.finish_s):
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _load(n=80, seed=7):
    rng = np.random.default_rng(seed)
    return workload(np.sort(rng.uniform(0, 10, n)), rng.integers(200, 3000, n),
                    rng.integers(20, 300, n))


@pytest.mark.parametrize("params,digest", [({}, "da0bf0947bbf4375"),
                                           ({"prefill_tp": 1}, "7ebeadfc158bd8b5")])
def test_default_split_is_unchanged(params, digest):
    # digests recorded from the one-kind half/half code before decode pools existed
    res = simulate_point(_load(), MODEL, H100X4, "distserve", **params)
    assert _digest(res.records) == digest
    assert "distserve_handoff" not in res.stats


def test_isolated_request_prefill_on_h100_handoff_over_ib_decode_on_h20():
    p = 5000
    res = simulate_point(workload([0.0], [p], [3]), MODEL, H100X1, "distserve",
                         decode_gpu="h20")
    m = get_model(MODEL)
    prefill = GpuCostModel(m, H100X1.gpu, 1, H100X1.nvlink).prefill_only_s(p)
    dec = GpuCostModel(m, H20X1.gpu, 1, H20X1.nvlink)
    tt = res.records.token_times(0)
    # one shard (TP1 -> TP1) over the network port, not NVLink
    assert tt[0] == pytest.approx(prefill + IB_LAT_S + _kv_bytes(p) / (IB_GBPS * 1e9), rel=1e-9)
    assert tt[1] - tt[0] == pytest.approx(dec.decode_only_s(1, p + 1), rel=1e-9)
    assert tt[2] - tt[1] == pytest.approx(dec.decode_only_s(1, p + 2), rel=1e-9)
    assert res.stats["distserve_handoff"] == dict(link="ib-ndr400", num_handoffs=1,
                                                  bytes_moved=int(_kv_bytes(p)))


def _tpot(res) -> float:
    r = res.records
    return float(np.mean((r.finish_s - r.first_token_s) / (r.output_tokens - 1)))


def test_decode_tpot_follows_the_decode_gpus_bandwidth():
    # decode is memory-bound: H100 3.35 TB/s < H20 4.0 TB/s < H200 4.8 TB/s (vendor specs)
    w = _load(60, seed=0)
    runs = {g: simulate_point(w, MODEL, H100X1, "distserve", decode_gpu=g)
            for g in ("h100-sxm", "h20", "h200-sxm")}
    ttft = {g: r.records.first_token_s - r.records.arrival_s for g, r in runs.items()}
    tpot = {g: _tpot(r) for g, r in runs.items()}
    assert tpot["h200-sxm"] < tpot["h20"] < tpot["h100-sxm"]
    # the prefill pool did not change; every request waits the same for its first token
    assert np.array_equal(ttft["h20"], ttft["h100-sxm"])
    # KV capacity per decode GPU comes from that GPU's memory (H20 96 GB > H100 80 GB)
    blocks = {g: r.stats["engines"][-1]["num_gpu_blocks"] for g, r in runs.items()}
    assert blocks["h100-sxm"] < blocks["h20"] < blocks["h200-sxm"]


def test_decode_pool_size_and_tp():
    w = _load(40, seed=1)
    res = simulate_point(w, MODEL, H100X1, "distserve", decode_gpu="h20", decode_num_gpus=4,
                         decode_tp=2)
    roles = [(e["role"], e["gpus"]) for e in res.stats["engines"]]
    assert roles == [("prefill", [0]), ("decode", [1, 2]), ("decode", [3, 4])]
    assert res.stats["distserve_handoff"]["num_handoffs"] == 40


def test_bad_decode_pools_name_the_field():
    w = workload([0.0], [10], [2])
    with pytest.raises(ConfigError, match=r"policy\.decode_gpu"):
        simulate_point(w, MODEL, H100X1, "distserve", decode_gpu="h999")
    with pytest.raises(ConfigError, match=r"policy\.decode_tp"):
        simulate_point(w, MODEL, H100X1, "distserve", decode_gpu="h20", decode_num_gpus=3,
                       decode_tp=2)
    with pytest.raises(ConfigError, match="decode_num_gpus"):
        simulate_point(w, MODEL, H100X1, "distserve", decode_num_gpus=2)
    with pytest.raises(ConfigError, match=r"policy\.handoff_link"):
        simulate_point(w, MODEL, H100X1, "distserve", decode_gpu="h20", handoff_link="nope")
    with pytest.raises(ConfigError, match=r"policy\.handoff_link"):
        simulate_point(w, MODEL, H100X1, "distserve", decode_gpu="h20",
                       handoff_link="pcie5-x16")


def test_a_misspelt_decode_gpu_names_file_line_and_field(tmp_path, capsys):
    from simserve.cli import main
    p = tmp_path / "bad.yaml"
    p.write_text("name: bad\nmodel: llama-3.1-8b\nhardware: {gpu: h100-sxm, num_gpus: 1}\n"
                 "workload: {trace: synthetic-conversation, num_requests: 5, rates: [1]}\n"
                 "policies:\n- {name: distserve, decode_gpu: h2O}\n")
    assert main(["run", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:6: policies[0].decode_gpu: unknown gpu profile 'h2O'" in err


def test_two_prefill_gpus_share_one_decode_gpus_receive_port():
    """Shards from two prefill GPUs to one decode GPU queue on its network port: the second
    lands one transfer later, not at the same time."""
    import simpy
    from simserve.hardware.profile import load_profile
    from simserve.policies.distserve.pools import NicLinks
    env = simpy.Environment()
    links = NicLinks(env, load_profile("ib-ndr400", expect_kind="link"))
    nbytes = 1e9
    d = links.nvlink_channel(0, 9).tx.duration_s(nbytes)
    done = []

    def go(src):
        yield links.nvlink_channel(src, 9).start(nbytes)
        done.append(env.now)
    env.process(go(0))
    env.process(go(1))
    env.run()
    assert sorted(done) == pytest.approx([d, 2 * d])
