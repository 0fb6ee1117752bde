"""RoPE scalings (posenc.rope_frequencies) against independent references.

References: each formula re-derived here in float64 with explicit Python loops and the
math module (no torch, no posenc code); values worked out by hand from the papers; and
Hugging Face's own golden vectors (tests/utils/test_modeling_rope_utils.py,
EXPECTED_INV_FREQ, LlamaConfig: head_dim 128, rope_theta 1e4, L0 = 2048).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.encodings.rope.scaling import rope_type_record
from rope_reference import ref_default, ref_inv_freq

def assert_f32_close(got, ref):
    """got is float32 rounded once from float64: within one float32 ulp of the reference."""
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), torch.tensor(ref, dtype=torch.float64), rtol=1.2e-7, atol=0)


# -- every type against the loop reference ---------------------------------------------------------

CASES = [
    (64, 10000.0, {"rope_type": "linear", "factor": 4.0}, None),
    (128, 500000.0, {"rope_type": "linear", "factor": 2}, None),
    (64, 10000.0, {"rope_type": "ntk", "factor": 4.0}, None),
    (16, 10000.0, {"rope_type": "ntk", "factor": 1.0}, None),
    (64, 10000.0, {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64}, None),
    (64, 10000.0, {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64}, 50),
    (64, 10000.0, {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64}, 200),
    (128, 10000.0, {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096}, 16384),
    (64, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, None),
    (128, 1e6, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, None),
    (128, 10000.0, {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 64, "beta_slow": 2, "truncate": False}, None),
    (64, 10000.0, {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                   "mscale": 1.0, "mscale_all_dim": 0.707}, None),
    (64, 10000.0, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "attention_factor": 1.5}, None),
    (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}, None),
    (32, 10000.0, {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                   "original_max_position_embeddings": 256}, None),
    # Llama 4 Scout: low = high, a step with no band in between
    (128, 500000.0, {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192}, None),
]
# Grok's yarn_log and theta_scale, TeleChat3's YaRN (vLLM; not in transformers)
CASES += [
    (128, 208533496.0, {"rope_type": "yarn_log", "factor": 16.0, "original_max_position_embeddings": 8192}, None),
    (64, 208533496.0, {"rope_type": "yarn_log", "factor": 16.0, "original_max_position_embeddings": 8192}, None),
    (128, 10000.0, {"rope_type": "yarn_log", "factor": 8.0, "original_max_position_embeddings": 4096,
                    "beta_fast": 16, "beta_slow": 2, "extrapolation_factor": 0.5}, None),
    (128, 208533496.0, {"rope_type": "theta_scale", "factor": 16.0, "original_max_position_embeddings": 8192}, None),
    (64, 10000.0, {"rope_type": "theta_scale", "factor": 4.0, "original_max_position_embeddings": 64}, None),
    (128, 1e6, {"rope_type": "telechat3_yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, None),
    (128, 1e6, {"rope_type": "telechat3_yarn", "factor": 8.0, "original_max_position_embeddings": 32768,
                "beta_fast": 64, "beta_slow": 2, "truncate": False}, 100000),
]
_LR = {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
       "long_factor": [2.0 + i for i in range(8)], "original_max_position_embeddings": 64}
CASES += [
    (16, 10000.0, {**_LR, "factor": 8.0}, None),
    (16, 10000.0, {**_LR, "factor": 8.0}, 64),
    (16, 10000.0, {**_LR, "factor": 8.0}, 65),
    (16, 10000.0, {**_LR, "attention_factor": 1.25}, 1000),
    (16, 10000.0, {**_LR, "factor": 1.0}, 1000),
]


@pytest.mark.parametrize(("dim", "base", "scaling", "seq_len"), CASES)
def test_every_type_matches_the_float64_loop_reference(dim, base, scaling, seq_len):
    inv_freq, attention_factor = posenc.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len)
    ref, ref_af = ref_inv_freq(dim, base, scaling, seq_len)
    assert inv_freq.shape == (dim // 2,)
    assert_f32_close(inv_freq, ref)
    assert attention_factor == pytest.approx(ref_af, rel=1e-15)


@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(2, 64),
    log_base=st.floats(math.log(100.0), math.log(1e7)),
    factor=st.floats(1.0, 64.0),
    log_context=st.floats(math.log(16), math.log(1 << 17)),
    beta_slow=st.floats(0.25, 4.0),
    beta_gap=st.floats(0.0, 64.0),
    truncate=st.booleans(),
)
def test_yarn_property_matches_reference(half, log_base, factor, log_context, beta_slow, beta_gap, truncate):
    dim, base, context = 2 * half, math.exp(log_base), int(math.exp(log_context))
    sc = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": context,
          "beta_fast": beta_slow + beta_gap, "beta_slow": beta_slow, "truncate": truncate}
    inv_freq, af = posenc.rope_frequencies(dim, base=base, scaling=sc)
    ref, ref_af = ref_inv_freq(dim, base, sc)
    assert_f32_close(inv_freq, ref)
    assert af == pytest.approx(ref_af)
    theta = torch.tensor(ref_default(dim, base), dtype=torch.float64)
    # YaRN only ever interpolates: theta / s <= inv <= theta
    assert torch.all(inv_freq.double() <= theta * (1 + 2e-7)) and torch.all(inv_freq.double() >= theta / factor * (1 - 2e-7))


@settings(max_examples=40, deadline=None)
@given(
    half=st.integers(1, 64),
    log_base=st.floats(math.log(100.0), math.log(1e7)),
    factor=st.floats(1.0, 32.0),
    low=st.floats(0.25, 4.0),
    gap=st.floats(0.01, 16.0),
    log_context=st.floats(math.log(16), math.log(1 << 17)),
)
def test_llama3_property_matches_reference(half, log_base, factor, low, gap, log_context):
    dim, base = 2 * half, math.exp(log_base)
    sc = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": low + gap,
          "original_max_position_embeddings": int(math.exp(log_context))}
    inv_freq, af = posenc.rope_frequencies(dim, base=base, scaling=sc)
    assert_f32_close(inv_freq, ref_inv_freq(dim, base, sc)[0])
    assert af == 1.0


# -- hand-computed values from the papers -------------------------------------------------------------


def test_hand_computed_small_cases():
    # PI (Chen et al. 2023): theta / s. d = 4, b = 1e4: theta = [1, 1e-2].
    inv, af = posenc.rope_frequencies(4, scaling={"rope_type": "linear", "factor": 2.0})
    assert inv.tolist() == pytest.approx([0.5, 0.005], rel=1e-7) and af == 1.0
    # NTK-aware: b' = 1e4 * 4^(4/2) = 160000, theta_1 = 160000^(-1/2) = 1/400.
    inv, _ = posenc.rope_frequencies(4, scaling={"rope_type": "ntk", "factor": 4.0})
    assert inv.tolist() == pytest.approx([1.0, 0.0025], rel=1e-7)
    # Dynamic NTK: s = 2, L0 = 64, L = 128: b' = 1e4 * (2*2 - 1)^2 = 90000, theta_1 = 1/300.
    sc = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
    assert posenc.rope_frequencies(4, scaling=sc, seq_len=128)[0].tolist() == pytest.approx([1.0, 1 / 300], rel=1e-7)
    assert posenc.rope_frequencies(4, scaling=sc, seq_len=64)[0].tolist() == pytest.approx([1.0, 0.01], rel=1e-7)
    # YaRN: d = 8, b = 1e4, L0 = 64, s = 4. dim_of(32) = 8 ln(64/(64 pi)) / (2 ln 1e4) = -0.497 -> floor -1 -> 0;
    # dim_of(1) = 8 ln(64/(2 pi)) / (2 ln 1e4) = 1.008 -> ceil 2. ramp = [0, .5, 1, 1];
    # theta = [1, .1, .01, .001] -> [1, .1 * (.5/4 + .5), .01/4, .001/4]; attention 0.1 ln 4 + 1.
    inv, af = posenc.rope_frequencies(8, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    assert inv.tolist() == pytest.approx([1.0, 0.0625, 0.0025, 0.00025], rel=1e-7)
    assert af == pytest.approx(1.1386294361119891, rel=1e-15)
    # Llama 3: d = 4, theta = [1, .01], wavelengths [2 pi, 200 pi = 628.3]; L0 = 1024, low 1, high 4, s = 8:
    # 256 <= 628.3 <= 1024 is "medium": smooth = (1024/628.3 - 1)/3 = 0.20992 -> (1 - sm) .01/8 + sm .01.
    sm = (1024 / (200 * math.pi) - 1) / 3
    inv, _ = posenc.rope_frequencies(4, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})
    assert inv.tolist() == pytest.approx([1.0, (1 - sm) * 0.01 / 8 + sm * 0.01], rel=1e-7)
    assert inv[1].item() == pytest.approx(0.0030867, rel=1e-4)
    # LongRoPE, Phi-3 style default attention: s = 32, L0 = 4096 -> sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12).
    lr = {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0],
          "original_max_position_embeddings": 4096, "factor": 32.0}
    inv, af = posenc.rope_frequencies(4, scaling=lr, seq_len=4097)
    assert inv.tolist() == pytest.approx([0.25, 0.00125], rel=1e-7)
    assert af == pytest.approx(math.sqrt(17 / 12), rel=1e-15)
    assert posenc.rope_frequencies(4, scaling=lr, seq_len=4096)[0].tolist() == pytest.approx([1.0, 0.005], rel=1e-7)


def test_deepseek_mscale_attention_factor():
    # DeepSeek-V2: s = 40, mscale = mscale_all_dim = 0.707 -> ratio 1; mscale 1 vs 0.707 -> (0.1 ln40 + 1)/(0.0707 ln40 + 1)
    base = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
    assert posenc.rope_frequencies(64, scaling={**base, "mscale": 0.707, "mscale_all_dim": 0.707})[1] == 1.0
    af = posenc.rope_frequencies(64, scaling={**base, "mscale": 1.0, "mscale_all_dim": 0.707})[1]
    assert af == pytest.approx((0.1 * math.log(40) + 1) / (0.0707 * math.log(40) + 1), rel=1e-12)
    # only one of the two set: Hugging Face falls back to the plain YaRN default
    assert posenc.rope_frequencies(64, scaling={**base, "mscale": 1.0})[1] == pytest.approx(0.1 * math.log(40) + 1)


# -- Hugging Face golden vectors (tests/utils/test_modeling_rope_utils.py) ----------------------------
# fmt: off
HF_DEFAULT = [
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01,
    3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01,
    1.0000e-01, 8.6596e-02, 7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02,
    3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02, 1.7783e-02, 1.5399e-02, 1.3335e-02, 1.1548e-02,
    1.0000e-02, 8.6596e-03, 7.4989e-03, 6.4938e-03, 5.6234e-03, 4.8697e-03, 4.2170e-03, 3.6517e-03,
    3.1623e-03, 2.7384e-03, 2.3714e-03, 2.0535e-03, 1.7783e-03, 1.5399e-03, 1.3335e-03, 1.1548e-03,
    1.0000e-03, 8.6596e-04, 7.4989e-04, 6.4938e-04, 5.6234e-04, 4.8697e-04, 4.2170e-04, 3.6517e-04,
    3.1623e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
]
HF_DYNAMIC = [  # factor 10, seq_len 16384
    1.0000e+00, 8.0931e-01, 6.5498e-01, 5.3008e-01, 4.2900e-01, 3.4720e-01, 2.8099e-01, 2.2741e-01,
    1.8404e-01, 1.4895e-01, 1.2055e-01, 9.7558e-02, 7.8955e-02, 6.3899e-02, 5.1714e-02, 4.1853e-02,
    3.3872e-02, 2.7413e-02, 2.2185e-02, 1.7955e-02, 1.4531e-02, 1.1760e-02, 9.5176e-03, 7.7027e-03,
    6.2339e-03, 5.0451e-03, 4.0831e-03, 3.3045e-03, 2.6744e-03, 2.1644e-03, 1.7517e-03, 1.4176e-03,
    1.1473e-03, 9.2852e-04, 7.5146e-04, 6.0817e-04, 4.9220e-04, 3.9834e-04, 3.2238e-04, 2.6091e-04,
    2.1115e-04, 1.7089e-04, 1.3830e-04, 1.1193e-04, 9.0585e-05, 7.3312e-05, 5.9332e-05, 4.8018e-05,
    3.8861e-05, 3.1451e-05, 2.5453e-05, 2.0600e-05, 1.6672e-05, 1.3492e-05, 1.0920e-05, 8.8374e-06,
    7.1522e-06, 5.7883e-06, 4.6845e-06, 3.7912e-06, 3.0683e-06, 2.4832e-06, 2.0097e-06, 1.6265e-06,
]
HF_YARN = [  # factor 10, beta_fast 32, beta_slow 1
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01,
    3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01,
    1.0000e-01, 8.3479e-02, 6.9590e-02, 5.7925e-02, 4.8136e-02, 3.9931e-02, 3.3061e-02, 2.7315e-02,
    2.2515e-02, 1.8512e-02, 1.5177e-02, 1.2403e-02, 1.0101e-02, 8.1924e-03, 6.6143e-03, 5.3120e-03,
    4.2400e-03, 3.3599e-03, 2.6396e-03, 2.0520e-03, 1.5746e-03, 1.1882e-03, 8.7713e-04, 6.2810e-04,
    4.3007e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
    1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05, 4.2170e-05, 3.6517e-05,
    3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05, 1.1548e-05,
]
HF_LLAMA3 = [  # factor 10, original 2048, low 1, high 4
    1.0000e+00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01, 4.2170e-01, 3.6517e-01,
    3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01, 1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01,
    1.0000e-01, 8.6596e-02, 7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02, 3.6517e-02,
    3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02, 1.7783e-02, 1.5399e-02, 1.3335e-02, 1.0730e-02,
    7.7785e-03, 5.6009e-03, 3.9991e-03, 2.8248e-03, 1.9675e-03, 1.3449e-03, 8.9549e-04, 5.7363e-04,
    3.4539e-04, 2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
    1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05, 4.2170e-05, 3.6517e-05,
    3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05, 1.7783e-05, 1.5399e-05, 1.3335e-05, 1.1548e-05,
]
# fmt: on


@pytest.mark.parametrize(("scaling", "seq_len", "expected"), [
    (None, None, HF_DEFAULT),
    ({"rope_type": "dynamic", "factor": 10.0, "original_max_position_embeddings": 2048}, 16384, HF_DYNAMIC),
    ({"rope_type": "dynamic", "factor": 10.0, "original_max_position_embeddings": 2048}, None, HF_DEFAULT),
    ({"rope_type": "dynamic", "factor": 10.0, "original_max_position_embeddings": 2048}, 1, HF_DEFAULT),
    ({"rope_type": "yarn", "factor": 10.0, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 2048}, None, HF_YARN),
    ({"rope_type": "llama3", "factor": 10.0, "original_max_position_embeddings": 2048, "low_freq_factor": 1,
      "high_freq_factor": 4}, None, HF_LLAMA3),
])
def test_hugging_face_golden_vectors(scaling, seq_len, expected):
    inv_freq, _ = posenc.rope_frequencies(128, base=10000.0, scaling=scaling, seq_len=seq_len)
    # the golden values are printed to 5 significant digits: half a unit in the last place
    torch.testing.assert_close(inv_freq.double(), torch.tensor(expected, dtype=torch.float64), rtol=5.01e-5, atol=0)


def test_ntk_equals_dynamic_with_factor_one_at_s_times_l0():
    """The identity the parity test uses for ntk (Hugging Face has no static ntk type)."""
    ntk, _ = posenc.rope_frequencies(64, scaling={"rope_type": "ntk", "factor": 4.0})
    dyn, _ = posenc.rope_frequencies(
        64, scaling={"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": 512}, seq_len=2048
    )
    torch.testing.assert_close(ntk, dyn, rtol=2.4e-7, atol=0)


def inv_freq_per_position(dim, base, scaling, num_positions):
    """Row p: the record's of_length at length p + 1 (what RoPE's "frozen" mode uses), rounded to float32."""
    of_length = rope_type_record(scaling).of_length(dim, base, scaling)
    return of_length(torch.arange(1, num_positions + 1, dtype=torch.float64)).float()


def test_of_length_at_positions_plus_one_gives_the_frequencies_at_length_p_plus_one():
    sc = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8}
    table = inv_freq_per_position(16, 10000.0, sc, 20)
    for p in range(20):
        assert_f32_close(table[p], ref_inv_freq(16, 10000.0, sc, p + 1)[0])
    table = inv_freq_per_position(16, 10000.0, {**_LR, "factor": 8.0}, 70)
    assert_f32_close(table[63], ref_inv_freq(16, 10000.0, {**_LR, "factor": 8.0}, 64)[0])
    assert_f32_close(table[64], ref_inv_freq(16, 10000.0, {**_LR, "factor": 8.0}, 65)[0])


# -- bad input ---------------------------------------------------------------------------------------
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
DYN = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64}
LONG = {**_LR, "factor": 4.0}


@pytest.mark.parametrize(("scaling", "key"), [
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "ntk"}, "factor"),
    ({"rope_type": "dynamic", "original_max_position_embeddings": 64}, "factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, "original_max_position_embeddings"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 64}, "factor"),
    ({"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings"),
    ({"rope_type": "linear", "factor": None}, "factor"),
    *[({k: v for k, v in L3.items() if k != missing}, missing) for missing in
      ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")],
    *[({k: v for k, v in LONG.items() if k != missing}, missing) for missing in
      ("short_factor", "long_factor", "original_max_position_embeddings", "factor")],
])
def test_missing_required_key_raises_keyerror_naming_it(scaling, key):
    with pytest.raises(KeyError, match=key):
        posenc.rope_frequencies(16, scaling=scaling)


def test_longrope_needs_no_factor_when_attention_factor_given():
    inv, af = posenc.rope_frequencies(16, scaling={**_LR, "attention_factor": 1.1})
    assert af == 1.1


def test_unknown_rope_type_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown rope_type 'su'.*dynamic.*linear.*llama3.*longrope.*ntk.*yarn"):
        posenc.rope_frequencies(16, scaling={"rope_type": "su", "factor": 2.0})


@pytest.mark.parametrize(("scaling", "match"), [
    *[({**sc, "factor": bad}, "factor.*>= 1") for sc in
      ({"rope_type": "linear"}, {"rope_type": "ntk"}, DYN, YARN, L3, LONG) for bad in (0.5, 0.0, -2.0)],
    ({"rope_type": "linear", "factor": "2"}, "factor"),
    ({"rope_type": "linear", "factor": True}, "factor"),
    ({"rope_type": "linear", "factor": float("nan")}, "factor"),
    ({"rope_type": "linear", "factor": float("inf")}, "factor"),
    ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_fast must be >= beta_slow"),
    ({**YARN, "beta_fast": -3.0}, "beta_fast"),
    ({**YARN, "beta_slow": -1.0}, "beta_slow"),
    ({**YARN, "attention_factor": -1.0}, "attention_factor"),
    ({**YARN, "truncate": "yes"}, "truncate"),
    ({**YARN, "mscale": -1.0, "mscale_all_dim": 1.0}, "mscale"),
    ({**L3, "high_freq_factor": 0.5}, "high_freq_factor must be >= low_freq_factor"),
    ({**L3, "low_freq_factor": 0.0}, "low_freq_factor"),
    ({**L3, "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ({**L3, "original_max_position_embeddings": 8192.5}, "original_max_position_embeddings"),
    ({**DYN, "original_max_position_embeddings": True}, "original_max_position_embeddings"),
    ({**LONG, "short_factor": [1.0] * 7}, r"short_factor.*8 numbers, got 7"),
    ({**LONG, "long_factor": [1.0] * 9}, r"long_factor.*8 numbers, got 9"),
    ({**LONG, "long_factor": 2.0}, "long_factor"),
    ({**LONG, "short_factor": [1.0] * 7 + [-1.0]}, "short_factor"),
    ({**LONG, "attention_factor": 0.0}, "attention_factor"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, "rope_theta.*disagrees"),
])
def test_bad_values_raise_valueerror_naming_the_key(scaling, match):
    with pytest.raises(ValueError, match=match):
        posenc.rope_frequencies(16, scaling=scaling)


@pytest.mark.parametrize("seq_len", [0, -5, 2.5, True])
def test_bad_seq_len(seq_len):
    with pytest.raises(ValueError, match="seq_len"):
        posenc.rope_frequencies(16, scaling=DYN, seq_len=seq_len)


def test_ntk_needs_rotary_dim_above_two():
    with pytest.raises(ValueError, match="rotary dim must be > 2"):
        posenc.rope_frequencies(2, scaling={"rope_type": "ntk", "factor": 2.0})


def test_scaling_must_be_a_dict():
    with pytest.raises(TypeError, match="scaling must be a dict"):
        posenc.rope_frequencies(16, scaling=[("rope_type", "linear")])


def test_unknown_keys_warn_like_hugging_face():
    with pytest.warns(UserWarning, match="fator"):
        posenc.rope_frequencies(16, scaling={"rope_type": "linear", "factor": 2.0, "fator": 3.0})
