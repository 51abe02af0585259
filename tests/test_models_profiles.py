"""Model catalog numbers and hardware profile loading."""
from __future__ import annotations

import pytest

from simserve.errors import ConfigError
from simserve.hardware.functions import Curve
from simserve.hardware.profile import available_profiles, load_profile
from simserve.models import CATALOG, get_model
from simserve.kv_budget import gpu_kv_budget

# exact parameter counts published for the Llama models, Qwen's rounded counts (notes §1.2)
PUBLISHED = {"llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496}
ROUNDED_B = {"qwen3-8b": 8.2, "qwen3-14b": 14.8, "qwen3-32b": 32.8}


def test_parameter_counts_match_published_numbers():
    for name, n in PUBLISHED.items():
        assert get_model(name).num_params == n
    for name, b in ROUNDED_B.items():
        assert round(get_model(name).num_params / 1e9, 1) == b


def test_kv_bytes_per_token_and_tp_shapes():
    m = get_model("llama-3.1-70b")
    assert m.kv_bytes_per_token == 327_680  # 2 x 80 x 8 x 128 x 2
    assert m.kv_bytes_per_token_per_rank(8) == 40_960
    qkv, o, gu, down = m.gemms(4)
    assert (qkv.k, qkv.n, o.k, o.n, gu.n, down.k) == (8192, 2560, 2048, 8192, 14336, 7168)
    q32 = get_model("qwen3-32b").gemms(1)
    assert (q32[0].n, q32[1].k) == (10240, 8192)  # 64 heads x 128 > hidden 5120
    with pytest.raises(ValueError):
        get_model("qwen3-14b").gemms(16)


def test_unknown_model_lists_known_ones():
    with pytest.raises(ValueError, match="did you mean 'qwen3-14b'.*llama-3.1-8b"):
        get_model("qwen3-41b")


def test_every_shipped_profile_loads_and_covers_the_catalog():
    names = available_profiles()
    for required in ("h100-sxm", "h200-sxm", "h20", "rtx4090", "xeon-silver-4510",
                     "xeon-8469c", "xeon-emr", "pcie4-x16", "pcie5-x16", "nvlink4"):
        assert required in names
    for name in names:
        p = load_profile(name)
        assert p.provenance_type in ("measured", "derived", "assumed")
        if p.provenance_type == "assumed":   # nothing measured: it must say where it came from
            assert p.kind == "link" and p.provenance.get("sources")
        if p.kind == "gpu":
            for m in CATALOG:
                for tp in (1, 2, 4, 8):
                    ops = p.ops(m, tp)
                    assert ops.dense["gate_up"](4096) > ops.dense["gate_up"](1)


def test_unknown_profile_and_wrong_kind_are_clear_errors():
    with pytest.raises(ConfigError, match="did you mean 'h100-sxm'"):
        load_profile("h100-sx", expect_kind="gpu")
    with pytest.raises(ConfigError, match="is a link, expected a gpu"):
        load_profile("nvlink4", expect_kind="gpu")


def test_profile_schema_errors_name_the_file(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("schema: simserve-hwprofile/1\nname: x\nkind: gpu\nprovenance: {type: guess}\nspec: {}\n")
    with pytest.raises(ConfigError, match="x.yaml: provenance.type"):
        load_profile(bad)
    bad.write_text("schema: simserve-hwprofile/1\nname: x\nkind: gpu\nprovenence: {}\nspec: {}\n")
    with pytest.raises(ConfigError, match="did you mean 'provenance'"):
        load_profile(bad)


def test_curve_extends_along_roofline_not_flat():
    c = Curve.from_lists("t", [1, 10, 100], [5, 6, 50])
    assert c(200) == pytest.approx(100.0)     # 50 us at 100 -> proportional beyond
    assert c(0.5) == 5.0                      # clamped below the first knot
    c2 = Curve.from_lists("m", [1, 2, 3], [5, 4, 6])
    assert c2(2) == 5.0                       # knots made monotone


def test_kv_capacity_of_8b_on_rtx4090_matches_worked_example():
    # notes §5 worked example: 23.99 GiB x 0.92 - 14.96 GiB weights - activations - graphs
    # leaves about 38k-48k tokens of KV on one RTX 4090
    b = gpu_kv_budget(get_model("llama-3.1-8b"), 24.0 * 2**30, 1, 0.92, 16, 2048, 256)
    assert 38_000 <= b.num_blocks * 16 <= 48_000
