"""rope_type ``dynamic_yarn`` (issue 26 item 1): YaRN (Peng et al. 2023, sec. 3.2-3.4) at the
factor of the current length, s = max(1, L / L0) (YaRN sec. 3.3, "Dynamic Scaling").

References: the YaRN formula written out below with the math module in float64 (independent
of posenc's scaling module), plain RoPE, static YaRN at factor T / L0, and hand-worked logits.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

import posenc
from posenc.hf_config import extension_config
from posenc.lab.model import KVCache, LMConfig, TransformerLM
from posenc.rope import (
    EXTENSION_METHODS,
    ROPE_TYPES,
    extension_scaling,
    from_hf_config,
    rope_frequencies,
)

D, BASE, L0 = 32, 10000.0, 512
DYN = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": L0}


def yarn_formula(d, base, context, length, beta_fast=32.0, beta_slow=1.0):
    """(inv_freq list, attention factor) of YaRN at s = max(1, length / context), float64.

    dim_of(r) = d ln(L0 / (2 pi r)) / (2 ln b) (YaRN eq. 17 solved for the dimension); low =
    floor(dim_of(beta_fast)), high = ceil(dim_of(beta_slow)), clamped to [0, d - 1]; ramp_i =
    clamp((i - low) / (high - low), 0, 1); inv_i = theta_i / s * ramp_i + theta_i (1 - ramp_i);
    attention factor 0.1 ln s + 1 (eq. 22). s = 1: theta and 1.
    """
    theta = [base ** (-2 * i / d) for i in range(d // 2)]
    s = max(1.0, length / context)
    if s == 1.0:
        return theta, 1.0

    def dim_of(r):
        return d * math.log(context / (2 * math.pi * r)) / (2 * math.log(base))

    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), d - 1)
    ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(d // 2)]
    return [t / s * r + t * (1 - r) for t, r in zip(theta, ramp)], 0.1 * math.log(s) + 1


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def test_the_sample_ramp_has_pairs_on_both_sides():
    """At d = 32, b = 1e4, L0 = 512 some pairs keep theta (extrapolated) and some are divided by
    s (interpolated): the tests below exercise both ends of the ramp and its middle."""
    inv, _ = yarn_formula(D, BASE, L0, 4 * L0)
    theta, _ = yarn_formula(D, BASE, L0, L0)
    ratios = [t / i for t, i in zip(theta, inv)]
    assert ratios[0] == 1.0 and ratios[-1] == pytest.approx(4.0) and any(1.1 < r < 3.9 for r in ratios)


@pytest.mark.parametrize("length", [L0 + 1, 700, 2 * L0, 4096, 123_457, 2**31])
def test_frequencies_and_attention_factor_follow_the_yarn_formula(length):
    inv, factor = rope_frequencies(D, base=BASE, scaling=DYN, seq_len=length)
    want_inv, want_factor = yarn_formula(D, BASE, L0, length)
    torch.testing.assert_close(inv, f64(want_inv).float(), rtol=0, atol=0)  # float32, rounded once
    assert factor == pytest.approx(want_factor, rel=1e-15, abs=0) and factor > 1
    # what RoPE computes from: the record's float64 functions of the length
    record = ROPE_TYPES["dynamic_yarn"]
    lengths = f64([float(length)])
    torch.testing.assert_close(record.of_length(D, BASE, DYN)(lengths)[0], f64(want_inv), rtol=1e-15, atol=0)
    torch.testing.assert_close(record.attention_of_length(D, BASE, DYN)(lengths)[0], f64(want_factor), rtol=1e-15, atol=0)


def test_beta_fast_and_beta_slow_are_read():
    scaling = {**DYN, "beta_fast": 8, "beta_slow": 2}
    inv, _ = rope_frequencies(D, base=BASE, scaling=scaling, seq_len=3000)
    want, _ = yarn_formula(D, BASE, L0, 3000, beta_fast=8, beta_slow=2)
    torch.testing.assert_close(inv, f64(want).float(), rtol=0, atol=0)
    assert not torch.equal(inv, rope_frequencies(D, base=BASE, scaling=DYN, seq_len=3000)[0])


@pytest.mark.parametrize("mode", ["rerotate", "frozen"])
def test_rotation_follows_the_formula_past_l0(mode):
    """cos and sin at each position, float64: rerotate at the call's length T (both sides times
    m(T)); frozen at length p + 1, the query side times m(p + 1)^2 and the key side by nothing."""
    T = 600
    rope = posenc.RoPE(D, scaling=DYN, dynamic_cache=mode)
    positions = torch.arange(T)
    for role in ("query", "key"):
        cos, _ = rope.cos_sin(positions, torch.float64, role=role)
        for p in (0, 100, L0 - 1, L0, 599):
            length = T if mode == "rerotate" else p + 1
            inv, m = yarn_formula(D, BASE, L0, length)
            scale = m if mode == "rerotate" else (m * m if role == "query" else 1.0)
            want = [math.cos(p * f) * scale for f in inv]
            torch.testing.assert_close(cos[p, : D // 2], f64(want), rtol=1e-12, atol=1e-12)


def test_equal_to_plain_rope_at_every_length_up_to_l0():
    """Rotations and logits bit for bit equal to rope_type default, in both modes, at every
    length <= L0 (s = 1: theta exactly and attention factor exactly 1)."""
    context = 64
    scaling = {**DYN, "original_max_position_embeddings": context}
    plain = posenc.RoPE(D, base=BASE)
    modes = [posenc.RoPE(D, base=BASE, scaling=scaling, dynamic_cache=m) for m in ("rerotate", "frozen")]
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, context, D, generator=g), torch.randn(1, 2, context, D, generator=g)
    for length in range(1, context + 1):
        pos = torch.arange(length)
        want_q, want_k = plain.rotate(q[:, :, :length], k[:, :, :length], pos, pos)
        for rope in modes:
            got_q, got_k = rope.rotate(q[:, :, :length], k[:, :, :length], pos, pos)
            assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k), (length, rope.dynamic_cache)
        inv, factor = rope_frequencies(D, base=BASE, scaling=scaling, seq_len=length)
        assert torch.equal(inv, rope_frequencies(D, base=BASE)[0]) and factor == 1.0
    # the frequencies and factors RoPE uses, at every length <= L0 = 512 too, in one call
    record, lengths = ROPE_TYPES["dynamic_yarn"], torch.arange(1, L0 + 1, dtype=torch.float64)
    theta = posenc.RoPE(D, base=BASE)._frequencies(torch.arange(1), None)
    assert torch.equal(record.of_length(D, BASE, DYN)(lengths), theta.expand(L0, -1))
    assert torch.equal(record.attention_of_length(D, BASE, DYN)(lengths), torch.ones(L0, dtype=torch.float64))
    # and the logits: one step past L0 they differ (the test can fail)
    pos = torch.arange(context + 1)
    x = torch.randn(1, 1, context + 1, D, generator=g)
    for rope in modes:
        assert not torch.equal(rope.rotate(x, x, pos, pos)[0], plain.rotate(x, x, pos, pos)[0])


@pytest.mark.parametrize("T", [L0 + 1, 700, 2 * L0, 1500])
def test_rerotate_prefill_equals_static_yarn_at_factor_t_over_l0(T):
    """A prefill of T tokens: the frequencies of static YaRN with factor T / L0 bit for bit, the
    attention factor to the last bit of float64 (torch's log against the math module's)."""
    dynamic = posenc.RoPE(D, scaling=DYN)
    static = posenc.RoPE(D, scaling={"rope_type": "yarn", "factor": T / L0, "original_max_position_embeddings": L0})
    pos = torch.arange(T)
    assert torch.equal(dynamic._frequencies(pos, None), static._frequencies(pos, None))
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, T, D, dtype=torch.float64, generator=g) for _ in range(2))
    dq, dk = dynamic.rotate(q, k, pos, pos)
    sq, sk = static.rotate(q, k, pos, pos)
    torch.testing.assert_close(dq, sq, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(dk, sk, rtol=1e-15, atol=1e-15)
    out = posenc.attention(q, k, q, dynamic, backend="eager")
    torch.testing.assert_close(out, posenc.attention(q, k, q, static, backend="eager"), rtol=1e-12, atol=1e-12)


def test_the_table_shrinks_back_for_a_shorter_call():
    """Unlike the reference code's grow-only cache: after a long call a short one is plain RoPE again."""
    rope, plain = posenc.RoPE(D, scaling=DYN), posenc.RoPE(D)
    x = torch.randn(1, 1, 3 * L0, D, dtype=torch.float64)
    long_pos = torch.arange(3 * L0)
    rope.rotate(x, x, long_pos, long_pos)
    pos = torch.arange(10)
    assert torch.equal(rope.rotate(x[:, :, :10], x[:, :, :10], pos, pos)[0], plain.rotate(x[:, :, :10], x[:, :, :10], pos, pos)[0])


# -- the frozen mode's logit scale, by hand ----------------------------------------------------------
def test_frozen_logit_scale_follows_the_query_length_only():
    """d = 2, L0 = 4: YaRN's ramp is 0 on the one pair (theta_0 = 1 kept: extrapolated), so only
    the attention factor changes. q = k = (1, 0); a query at position 7 (length 8, s = 2) and a
    key at position 5 (length 6, s = 1.5): the logit is m(8)^2 cos(7 - 5) with m(8) = 1 + 0.1 ln 2,
    not m(8) m(6) cos 2 (the product of both sides' own factors, which a shared table gives)."""
    scaling = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 4}
    rope = posenc.RoPE(2, scaling=scaling, dynamic_cache="frozen")
    one = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    qr, kr = rope.rotate(one, one, torch.tensor([7]), torch.tensor([5]))
    m8, m6 = 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(1.5)
    logit = float((qr * kr).sum())
    assert logit == pytest.approx(m8**2 * math.cos(2), rel=1e-14)
    assert abs(logit - m8 * m6 * math.cos(2)) > 1e-3
    # a key inside L0 (position 1, length 2): still m(8)^2
    qr, kr = rope.rotate(one, one, torch.tensor([7]), torch.tensor([1]))
    assert float((qr * kr).sum()) == pytest.approx(m8**2 * math.cos(6), rel=1e-14)
    # the shared table (transformers' one table for q and k) carries m(p + 1) on each side
    cq, sq = rope.cos_sin(torch.tensor([7]), torch.float64)
    ck, sk = rope.cos_sin(torch.tensor([5]), torch.float64)
    assert float(cq[0, 0] * ck[0, 0] + sq[0, 0] * sk[0, 0]) == pytest.approx(m8 * m6 * math.cos(2), rel=1e-14)
    # rerotate: both sides at the call's length 8
    qr, kr = posenc.RoPE(2, scaling=scaling).rotate(one, one, torch.tensor([7]), torch.tensor([5]))
    assert float((qr * kr).sum()) == pytest.approx(m8**2 * math.cos(2), rel=1e-14)


def test_frozen_rotates_each_position_at_its_own_length_whatever_the_chunking():
    rope = posenc.RoPE(D, scaling=DYN, dynamic_cache="frozen")
    x = torch.randn(1, 2, 3 * L0, D, dtype=torch.float64)
    pos = torch.arange(3 * L0)
    q, k = rope.rotate(x, x, pos, pos)
    cut = L0 + 37
    q1, k1 = rope.rotate(x[:, :, :cut], x[:, :, :cut], pos[:cut], pos[:cut])
    q2, k2 = rope.rotate(x[:, :, cut:], x[:, :, cut:], pos[cut:], pos[cut:])
    assert torch.equal(torch.cat((q1, q2), 2), q) and torch.equal(torch.cat((k1, k2), 2), k)
    assert not torch.equal(q, k)  # the query side carries the scale, the key side none


# -- cached decoding ---------------------------------------------------------------------------------
def tiny_lm(num_layers, **rope_kwargs):
    torch.manual_seed(1)
    config = LMConfig(vocab_size=256, d_model=32, num_layers=num_layers, num_heads=4, max_positions=64)
    model = TransformerLM(config, posenc.RoPE(config.head_dim, **rope_kwargs))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.normal_(0, 0.3)
    return model.eval()


def decode(model, tokens):
    cache = KVCache(model.config.num_layers)
    outs = [model(tokens[:, :1], torch.arange(1), cache=cache)]
    for t in range(1, tokens.shape[1]):
        outs.append(model(tokens[:, t : t + 1], torch.tensor([t]), cache=cache))
    return torch.cat(outs, dim=1)


SMALL = {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 8}


def test_rerotate_cached_decoding_is_exact_for_the_first_layer_only():
    """Keys cached unrotated and re-rotated at each step's length: one layer decodes exactly as
    the full pass over each prefix; with two layers the second layer's cached keys and values
    were computed at shorter lengths, which the encoding flags (call_invariant False)."""
    tokens = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))  # past L0 = 8
    for layers in (1, 2):
        model = tiny_lm(layers, scaling=SMALL)
        assert not model.encoding.call_invariant
        with torch.no_grad():
            stepped = decode(model, tokens)[0]
            prefix = torch.stack([model(tokens[:, : t + 1])[0, -1] for t in range(tokens.shape[1])])
        if layers == 1:
            torch.testing.assert_close(stepped, prefix, atol=1e-5, rtol=1e-5)
        else:
            assert (stepped - prefix).abs().max() > 1e-4


def test_frozen_cached_decoding_equals_the_full_pass():
    tokens = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(3))
    model = tiny_lm(2, scaling=SMALL, dynamic_cache="frozen")
    assert model.encoding.call_invariant
    with torch.no_grad():
        torch.testing.assert_close(decode(model, tokens), model(tokens), atol=1e-5, rtol=1e-5)
        # and the full pass is not plain RoPE's past L0
        assert (model(tokens) - tiny_lm(2)(tokens)).abs().max() > 1e-4


def test_no_fused_kernel_for_a_length_dependent_attention_factor():
    """The Triton kernel takes one float attention factor: dynamic_yarn keeps the table path."""
    assert posenc.RoPE(D, scaling=DYN).kernel_angles(torch.arange(4)) is None
    assert posenc.RoPE(D, scaling={**DYN, "rope_type": "dynamic"} | {"factor": 2.0}).kernel_angles(torch.arange(4)) is not None


# -- the dict, the extension and Hugging Face configs --------------------------------------------------
def test_extension_scaling_and_the_factor_key():
    assert "dynamic_yarn" in EXTENSION_METHODS
    assert extension_scaling("dynamic_yarn", 4.0, L0) == {"rope_type": "dynamic_yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": L0}
    assert extension_scaling("dynamic_yarn", 1.0, L0) is None
    # the factor is the declared extension: the frequencies follow the length, not the factor
    for factor in (2.0, 8.0):
        inv, m = rope_frequencies(D, scaling={**DYN, "factor": factor}, seq_len=1000)
        assert torch.equal(inv, rope_frequencies(D, scaling=DYN, seq_len=1000)[0]) and m == pytest.approx(1 + 0.1 * math.log(1000 / L0))


def test_bad_dicts_are_refused():
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        posenc.RoPE(D, scaling={"rope_type": "dynamic_yarn"})
    with pytest.raises(ValueError, match="factor"):
        posenc.RoPE(D, scaling={**DYN, "factor": 0.5})
    with pytest.raises(ValueError, match="beta_fast must be >= beta_slow"):
        posenc.RoPE(D, scaling={**DYN, "beta_fast": 1, "beta_slow": 4})
    with pytest.warns(UserWarning, match="attention_factor"):  # the factor follows the length: no override
        posenc.RoPE(D, scaling={**DYN, "attention_factor": 2.0})
    with pytest.raises(ValueError, match="role must be one of"):
        posenc.RoPE(D, scaling=DYN).cos_sin(torch.arange(3), role="value")
    with pytest.raises(ValueError, match="multi-axis"):
        posenc.MRoPE(D, scaling=DYN)


CONFIG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": L0,
          "rope_parameters": {"rope_type": "default", "rope_theta": BASE}}


def test_how_it_is_written_into_a_hugging_face_config():
    """to_hf_dict writes the dict as it is (rope_type "dynamic_yarn"); extension_config writes
    rope_parameters with L0 kept in the dict and max_position_embeddings = round(s * L0), as for
    yarn; either reads back to the same RoPE."""
    rope = posenc.RoPE(D, scaling={**DYN, "factor": 4.0})
    written = rope.to_hf_dict()
    assert written["rope_scaling"] == {**DYN, "factor": 4.0}
    back = from_hf_config(written)
    assert back.scaling == rope.scaling and back.head_dim == D

    fields = extension_config(CONFIG, "dynamic_yarn", 4.0)
    assert fields == {"max_position_embeddings": 4 * L0,
                      "rope_parameters": {"rope_type": "dynamic_yarn", "rope_theta": BASE, "factor": 4.0,
                                          "original_max_position_embeddings": L0}}
    extended = from_hf_config({**CONFIG, **fields})
    assert extended.scaling["original_max_position_embeddings"] == L0 and extended.length_dependent
    # a config without L0 in the dict (v4, hand-written): L0 is max_position_embeddings, as for yarn
    bare = from_hf_config({**CONFIG, "rope_parameters": {"rope_type": "dynamic_yarn", "rope_theta": BASE}})
    assert bare.scaling["original_max_position_embeddings"] == L0


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_plain_transformers_loads_the_config_but_cannot_build_the_model():
    """transformers (5.x) has no dynamic_yarn: its config class accepts the dict with a logged
    warning ("Missing validation function ... 'rope_type'='dynamic_yarn'") and building the model
    raises KeyError('dynamic_yarn') from ROPE_INIT_FUNCTIONS: a plain from_pretrained fails loudly,
    never silently with another RoPE."""
    transformers = pytest.importorskip("transformers")
    fields = extension_config(CONFIG, "dynamic_yarn", 4.0)
    config_dict = {k: v for k, v in {**CONFIG, **fields}.items() if k != "model_type"}
    logger, handler = logging.getLogger("transformers"), _Messages()  # transformers' logger does not propagate
    logger.addHandler(handler)
    try:
        config = transformers.LlamaConfig(**config_dict)
    finally:
        logger.removeHandler(handler)
    assert config.rope_parameters["rope_type"] == "dynamic_yarn"
    assert any("'rope_type'='dynamic_yarn'" in m for m in handler.messages), handler.messages  # logged, not raised
    with pytest.raises(KeyError, match="dynamic_yarn"):
        transformers.LlamaForCausalLM(config)
