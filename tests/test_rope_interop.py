"""Hugging Face config interop (posenc.rope): fixtures typed in from published configs,
the round trip, inspect_config and its figure."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from rope_reference import ref_inv_freq

import posenc
from posenc.rope import HF_ROPE_FIELDS, from_hf_config, inspect_config, plot_rope_inspection, to_hf_dict

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ["llama2_7b", "llama3_1_8b", "qwen2_5_7b_instruct_yarn", "phi3_5_mini_instruct_longrope"]


def load(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def rope_fields(config):
    return {k: config[k] for k in HF_ROPE_FIELDS if k in config}


def assert_inv(rope, dim, base, scaling, seq_len=None):
    torch.testing.assert_close(rope.inv_freq.double(), torch.tensor(ref_inv_freq(dim, base, scaling, seq_len)[0],
                                                                    dtype=torch.float64), rtol=1.2e-7, atol=0)


def test_posenc_rope_is_reachable_after_import_posenc():
    assert posenc.rope.from_hf_config is from_hf_config


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_the_identity(name):
    config = load(name)
    original = copy.deepcopy(config)
    rope = from_hf_config(config)
    assert config == original  # not mutated
    assert rope.to_hf_dict() == rope_fields(config)
    assert to_hf_dict(rope) == rope_fields(config)
    again = from_hf_config(rope.to_hf_dict())
    assert torch.equal(again.inv_freq, rope.inv_freq) and again.attention_factor == rope.attention_factor


def test_llama2_is_plain_rope():
    rope = from_hf_config(load("llama2_7b"))
    assert (rope.head_dim, rope.rotary_dim, rope.base, rope.scaling, rope.attention_factor) == (128, 128, 10000.0, None, 1.0)
    assert rope.inv_freq[1].item() == pytest.approx(0.86596, rel=1e-5)  # Hugging Face's golden default vector


def test_llama3_1_frequencies():
    rope = from_hf_config(load("llama3_1_8b"))
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    assert rope.base == 500000.0 and rope.attention_factor == 1.0
    assert_inv(rope, 128, 500000.0, sc)


def test_qwen2_5_yarn_uses_the_explicit_factor():
    """max_position_embeddings == original (32768): v4.4x would have forced s = 1 (issue #38224); v5 uses 4."""
    rope = from_hf_config(load("qwen2_5_7b_instruct_yarn"))
    assert rope.head_dim == 3584 // 28 == 128
    assert rope.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert_inv(rope, 128, 1e6, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})


def test_phi3_longrope_takes_context_and_factor_from_the_config():
    config = load("phi3_5_mini_instruct_longrope")
    rope = from_hf_config(config)
    assert rope.head_dim == 96
    assert rope.scaling["original_max_position_embeddings"] == 4096 and rope.scaling["factor"] == 32.0
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    sc = dict(rope.scaling)
    assert_inv(rope, 96, 10000.0, sc)  # short factors within L0
    long_inv, _ = posenc.rope_frequencies(96, scaling=sc, seq_len=4097)
    torch.testing.assert_close(long_inv.double(), torch.tensor(ref_inv_freq(96, 10000.0, sc, 4097)[0], dtype=torch.float64),
                               rtol=1.2e-7, atol=0)


def test_v5_rope_parameters_form():
    v4 = load("llama3_1_8b")
    params = {"rope_type": "llama3", "rope_theta": 500000.0, **{k: v for k, v in v4["rope_scaling"].items() if k != "rope_type"}}
    v5 = {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "max_position_embeddings": 131072,
          "rope_parameters": params}
    a, b = from_hf_config(v4), from_hf_config(v5)
    assert torch.equal(a.inv_freq, b.inv_freq) and b.base == 500000.0
    assert b.to_hf_dict() == rope_fields(v5)
    # default rope in v5 form, with partial rotary inside the dict
    v5_plain = {"head_dim": 64, "max_position_embeddings": 2048,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}
    rope = from_hf_config(v5_plain)
    assert rope.rotary_dim == 32 and rope.scaling is None
    assert rope.to_hf_dict() == rope_fields(v5_plain)


def test_v5_per_layer_rope_parameters_need_layer_type():
    config = {"head_dim": 64, "max_position_embeddings": 8192, "layer_types": ["full_attention", "sliding_attention"],
              "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    with pytest.raises(ValueError, match="layer_type"):
        from_hf_config(config)
    full = from_hf_config(config, layer_type="full_attention")
    assert full.base == 1e6 and full.scaling["factor"] == 8.0
    assert full.to_hf_dict() == rope_fields(config)
    assert from_hf_config(config, layer_type="sliding_attention").scaling is None


def test_dynamic_context_comes_from_max_position_embeddings():
    config = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 2048,
              "rope_scaling": {"rope_type": "dynamic", "factor": 10.0}}
    rope = from_hf_config(config)
    assert rope.scaling["original_max_position_embeddings"] == 2048
    assert rope.to_hf_dict() == rope_fields(config)


def test_partial_rotary_factor_round_trip():
    config = {"hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
              "max_position_embeddings": 2048, "rope_scaling": None}
    rope = from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim) == (80, 32)
    assert rope.to_hf_dict() == rope_fields(config)


def test_directly_built_rope_exports_a_config_that_reads_back_the_same():
    rope = posenc.RoPE(64, rotary_dim=32, base=5e5, scaling={"rope_type": "yarn", "factor": 8.0,
                                                             "original_max_position_embeddings": 4096})
    back = from_hf_config(rope.to_hf_dict())
    assert torch.equal(back.inv_freq, rope.inv_freq) and back.attention_factor == rope.attention_factor
    assert back.rotary_dim == 32


def test_bad_configs():
    with pytest.raises(TypeError, match="config must be a dict"):
        from_hf_config([1, 2])
    with pytest.raises(KeyError, match="head_dim"):
        from_hf_config({"rope_theta": 10000.0})
    with pytest.raises(KeyError, match="max_position_embeddings"):
        from_hf_config({"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="unknown rope_type"):
        from_hf_config({"head_dim": 64, "rope_scaling": {"rope_type": "su", "factor": 4.0}})
    with pytest.raises(ValueError, match="rope_scaling"):
        from_hf_config({"head_dim": 64, "rope_scaling": "yarn"})


def test_inspect_llama2_critical_dimension():
    report = inspect_config(load("llama2_7b"))
    # pairs with 2 pi 10000^(2i/128) <= 4096: i <= 64 ln(4096 / 2 pi) / ln 10000 = 45.03 -> pairs 0..45
    assert report.num_full_rotation_pairs == 46
    assert report.critical_dim == pytest.approx(64 * math.log(4096 / (2 * math.pi)) / math.log(10000))
    assert report.original_context == report.extended_context == 4096
    assert torch.equal(report.wavelength_original, report.wavelength_scaled)
    assert report.wavelength_original[0].item() == pytest.approx(2 * math.pi)


def test_inspect_llama3_1_stretches_only_the_long_wavelengths():
    report = inspect_config(load("llama3_1_8b"))
    assert (report.original_context, report.extended_context, report.attention_factor) == (8192, 131072, 1.0)
    scale = report.scale
    short = report.wavelength_original < 8192 / 4
    long = report.wavelength_original > 8192
    assert torch.allclose(scale[short], torch.ones_like(scale[short]))
    assert torch.allclose(scale[long], torch.full_like(scale[long], 8.0))
    assert report.num_full_rotation_pairs == int((report.wavelength_original <= 8192).sum())


def test_inspect_longrope_and_yarn_extended_context():
    phi = inspect_config(load("phi3_5_mini_instruct_longrope"))
    assert (phi.original_context, phi.extended_context, phi.rotary_dim) == (4096, 131072, 96)
    assert phi.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    long_factor = torch.tensor(load("phi3_5_mini_instruct_longrope")["rope_scaling"]["long_factor"], dtype=torch.float64)
    torch.testing.assert_close(phi.scale, long_factor, rtol=1e-6, atol=0)
    qwen = inspect_config(load("qwen2_5_7b_instruct_yarn"))
    assert (qwen.original_context, qwen.extended_context) == (32768, 131072)


def test_plot_rope_inspection_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_rope_inspection(inspect_config(load("llama3_1_8b")), tmp_path / "sub" / "rope.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_hf_layout_and_max_position_embeddings_are_constructor_arguments():
    config = load("phi3_5_mini_instruct_longrope")
    rope = from_hf_config(config)
    assert rope.max_position_embeddings == config["max_position_embeddings"] and rope.hf_layout is not None
    rebuilt = posenc.RoPE(rope.head_dim, base=rope.base, scaling=rope.scaling, rotary_dim=rope.rotary_dim,
                          hf_layout=rope.hf_layout, max_position_embeddings=rope.max_position_embeddings)
    assert rebuilt.to_hf_dict() == rope_fields(config)
    plain = posenc.RoPE(64)
    assert plain.hf_layout is None and plain.max_position_embeddings is None
    assert plain.to_hf_dict() == {"rope_theta": 10000.0, "head_dim": 64, "rope_scaling": None}
    with pytest.raises(TypeError):
        posenc.RoPE(64, None)  # keyword-only, as every option


def test_interop_names_keep_their_import_paths():
    import posenc.lab.plots
    from posenc.hf_config import encoding, rope

    for name in ("HF_ROPE_FIELDS", "read_hf_config", "write_hf_config", "inspect_config", "RopeInspection",
                 "extension_scaling", "EXTENSION_METHODS"):
        assert getattr(rope, name) is getattr(posenc.rope, name)
    for name in ("from_hf_config", "to_hf_dict"):
        assert getattr(posenc.rope, name) is getattr(encoding, name)
    assert plot_rope_inspection is posenc.lab.plots.plot_rope_inspection
    with pytest.raises(AttributeError):
        posenc.rope.no_such_name  # noqa: B018


def test_import_posenc_rope_loads_neither_the_figures_nor_matplotlib():
    import subprocess
    import sys

    code = "import sys, posenc.rope; assert 'posenc.lab.plots' not in sys.modules and 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_rope_figure_is_the_librarys_and_drawing_it_loads_no_lab_module(tmp_path):
    """posenc.rope.plot_rope_inspection lives in the library (hf_config/rope_figure.py): drawing
    the figure through posenc.rope imports nothing of posenc.lab (the one call up into the lab,
    gone)."""
    import subprocess
    import sys

    pytest.importorskip("matplotlib")
    code = ("import json, sys, posenc.rope; "
            f"config = json.load(open({str(FIXTURES / 'llama3_1_8b.json')!r})); "
            f"posenc.rope.plot_rope_inspection(posenc.rope.inspect_config(config), {str(tmp_path / 'rope.png')!r}); "
            "bad = [m for m in sys.modules if m.startswith('posenc.lab')]; assert not bad, bad; "
            "assert posenc.rope.plot_rope_inspection.__module__ == 'posenc.hf_config.rope_figure'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "rope.png").read_bytes()[:4] == b"\x89PNG"
