"""VO-RoPE (encodings/rope/vo_rope.py), DeepSeek-V4's rotated values: against a float64 formula
(each value contributes R(theta (j - i)) v_j), against transformers' ``DeepseekV4Attention`` on a
tiny random model, relative in the value path, and refused where it cannot be exact."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings import VORoPE
from posenc.errors import InvalidArgument

B, H, T, D, R = 2, 4, 7, 12, 8


def turn_pairs(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Adjacent pairs (x_{2i}, x_{2i+1}) of the last R dimensions of x turned by angle[..., i]."""
    lead, tail = x[..., :-R], x[..., -R:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    turned = torch.stack((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), dim=-1).flatten(-2)
    return torch.cat((lead, turned), dim=-1)


def formula(q, k, v, qp, kp, base=10000.0, scale=None):
    """float64: scores from q and k turned at their positions, out_i = sum_j p_ij R((j - i) theta) v_j."""
    inv_freq = base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    qr = turn_pairs(q, qp.double()[:, None] * inv_freq)
    kr = turn_pairs(k, kp.double()[:, None] * inv_freq)
    scores = qr @ kr.transpose(-1, -2) * (scale or D**-0.5)
    scores = scores.masked_fill(kp[None, :] > qp[:, None], float("-inf"))
    probs = scores.softmax(-1)  # (B, H, Tq, Tk)
    offsets = (kp[None, :] - qp[:, None]).double()[..., None] * inv_freq  # (Tq, Tk, R/2)
    turned = turn_pairs(v.unsqueeze(2).expand(-1, -1, qp.numel(), -1, -1), offsets)  # (B, H, Tq, Tk, D)
    return (probs.unsqueeze(-1) * turned).sum(-2)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked", "flex"])  # the CPU's (flash_attention_2: CUDA)
def test_every_backend_gives_each_value_its_relative_rotation(backend):
    enc = VORoPE(D, rotary_dim=R).double()
    q, k, v = inputs()
    qp, kp = torch.arange(T) + 40, torch.arange(T) + 40
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, q_positions=qp, k_positions=kp, backend=backend)
    torch.testing.assert_close(out, formula(q, k, v, qp, kp), rtol=0, atol=1e-12)


def test_the_value_path_is_relative_and_fails_without_the_output_rotation():
    enc = VORoPE(D, rotary_dim=R).double()
    q, k, v = inputs(1)
    positions = torch.arange(T)
    out = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions)
    moved = posenc.attention(q, k, v, enc, q_positions=positions + 1000, k_positions=positions + 1000)
    torch.testing.assert_close(moved, out, rtol=0, atol=1e-12)
    # the values rotated but the output not turned back: absolute positions leak into the output
    def without_output_rotation(shift):
        p = positions + shift
        q_turned, k_turned = enc.rotate(q, k, p, p)
        return posenc.attention(q_turned, k_turned, enc.rotate_values(v, p), None)

    assert (without_output_rotation(1000) - without_output_rotation(0)).abs().max() > 1e-2


def test_leading_half_split_variant_and_grouped_keys():
    enc = VORoPE(D, rotary_dim=R, rotary_slice="first", interleaved=False).double()
    q, k, v = inputs(2)
    positions = torch.arange(T)
    out = posenc.attention(q, k[:, :1], v[:, :1], enc, q_positions=positions, k_positions=positions)
    rope = posenc.create("rope", head_dim=D, rotary_dim=R).double()  # leading, half-split: the same rotation
    qr, kr = rope.rotate(q, k[:, :1], positions, positions)
    vr, _ = rope.rotate(v[:, :1], v[:, :1], positions, positions)
    probs = (qr @ kr.transpose(-1, -2) * D**-0.5).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    mixed = probs.softmax(-1) @ vr
    inverse = rope.cos_sin(positions, torch.float64)
    cos, sin = inverse
    back = torch.cat((posenc.apply_rotary(mixed[..., :R], cos, -sin), mixed[..., R:]), dim=-1)
    torch.testing.assert_close(out, back, rtol=0, atol=1e-12)


# -- against transformers' DeepSeek-V4 ----------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _deepseek_v4(rope_parameters=None):
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling
        from transformers.models.deepseek_v4.configuration_deepseek_v4 import (
            DeepseekV4Config,
        )
    except ImportError:
        pytest.skip("this transformers has no DeepSeek-V4")
    config = DeepseekV4Config(hidden_size=32, num_attention_heads=2, head_dim=16, q_lora_rank=16, o_groups=2,
                              o_lora_rank=8, sliding_window=64, num_hidden_layers=1, layer_types=["sliding_attention"],
                              vocab_size=50, qk_rope_head_dim=8, intermediate_size=32, moe_intermediate_size=16,
                              rope_parameters=rope_parameters)
    config._attn_implementation = "eager"
    return modeling, config


def test_deepseek_v4_sliding_attention_equals_transformers():
    """One sliding layer of a random DeepSeek-V4 (weights std 0.5, sinks): its projections and
    norms, then posenc.attention with vo_rope and the sinks in place of transformers' rotations
    and attention. Tolerance: transformers takes its angles in float32 (float64 modules), 1e-7
    rad at these positions; a wrong layout (half-split, leading slice) or no output rotation is
    off by > 1e-2."""
    modeling, config = _deepseek_v4()
    torch.manual_seed(0)
    attn = modeling.DeepseekV4Attention(config, 0)
    with torch.no_grad():
        for param in attn.parameters():
            param.normal_(0, 0.5)
    attn = attn.double()
    rotary = modeling.DeepseekV4RotaryEmbedding(config).double()
    hidden = torch.randn(B, 12, 32, dtype=torch.float64)
    position_ids = torch.arange(12).unsqueeze(0).expand(B, -1) + 30
    tables = {kind: rotary(hidden, position_ids, layer_type=kind) for kind in ("main", "compress")}
    causal = torch.full((12, 12), float("-inf"), dtype=torch.float64).triu(1)[None, None].expand(B, 1, -1, -1)
    want, _ = attn(hidden, tables, position_ids, causal)

    def posenc_layer(enc):
        q = attn.q_b_norm(attn.q_b_proj(attn.q_a_norm(attn.q_a_proj(hidden))).view(B, 12, -1, 16).transpose(1, 2))
        kv = attn.kv_norm(attn.kv_proj(hidden)).view(B, 12, -1, 16).transpose(1, 2)
        out = posenc.attention(q, kv, kv, enc, q_positions=position_ids, k_positions=position_ids, sinks=attn.sinks,
                               scale=16**-0.5)
        grouped = attn.o_a_proj(out.transpose(1, 2).reshape(B, 12, config.o_groups, -1)).flatten(2)
        return attn.o_b_proj(grouped)

    base = config.rope_parameters["main"]["rope_theta"]
    got = posenc_layer(VORoPE(16, rotary_dim=8, base=base).double())
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for wrong in (VORoPE(16, rotary_dim=8, base=base, interleaved=False), VORoPE(16, rotary_dim=8, base=base,
                                                                              rotary_slice="first"),
                  posenc.create("rope", head_dim=16, rotary_dim=8, base=base, interleaved=True)):
        assert (posenc_layer(wrong.double()) - want).abs().max() > 1e-2


def test_deepseek_v4_compressed_table_is_yarn_without_its_attention_factor():
    """The compressed layers' table: base 1.6e5, YaRN x16, attention factor forced to 1
    (DeepseekV4Config); transformers' cos and sin per pair against vo_rope's (every pair twice)."""
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
            "beta_slow": 1.0}
    modeling, config = _deepseek_v4(dict(yarn))
    assert config.rope_parameters["compress"]["attention_factor"] == 1.0
    rotary = modeling.DeepseekV4RotaryEmbedding(config)
    positions = torch.arange(0, 1024, 37)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None], layer_type="compress")
    enc = VORoPE(16, rotary_dim=8, base=config.rope_parameters["compress"]["rope_theta"],
                 scaling={**yarn, "attention_factor": 1.0})
    ours_cos, ours_sin = enc.cos_sin(positions, torch.float64)
    # transformers' angles are float32 products: 2^-24 relative at angles up to ~1e3 rad
    torch.testing.assert_close(ours_cos[:, 0::2].float(), cos[0], rtol=0, atol=2e-4)
    torch.testing.assert_close(ours_sin[:, 0::2].float(), sin[0], rtol=0, atol=2e-4)
    with_factor = VORoPE(16, rotary_dim=8, base=config.rope_parameters["compress"]["rope_theta"], scaling=yarn)
    assert (with_factor.cos_sin(positions, torch.float64)[0][:, 0::2].float() - cos[0]).abs().max() > 0.1


def test_bad_inputs():
    with pytest.raises(InvalidArgument, match=r"rotary_slice must be one of \('first', 'last'\), got 'end'"):
        VORoPE(8, rotary_slice="end")
    with pytest.raises(InvalidArgument, match="depends on the sequence length"):
        VORoPE(8, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16})
    enc = VORoPE(8)
    with pytest.raises(InvalidArgument, match="v must have head_dim=8, got 6"):
        posenc.attention(torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 6), enc)


def test_on_a_transformers_llama_it_takes_posenc_attention_not_the_models_tables():
    """use_encoding with vo_rope on a random Llama: the values are turned (its logits differ from
    the same RoPE without them: not served as the model's cos/sin tables, which would drop the
    value path silently), and generate() with the cache equals generate() without it."""
    from test_integration_families import build

    from posenc.integrations.transformers import use_encoding

    head_dim = build("llama").config.head_dim
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = use_encoding(build("llama"), posenc.create("rope", head_dim=head_dim))(ids).logits
        model = use_encoding(build("llama"), VORoPE(head_dim, rotary_slice="first", interleaved=False))
        turned = model(ids).logits
        assert (turned - plain).abs().max() > 1e-2
        options = {"max_new_tokens": 5, "do_sample": False, "output_logits": True, "return_dict_in_generate": True,
                   "pad_token_id": 0}
        cached = model.generate(ids[:, :5], use_cache=True, **options)
        uncached = model.generate(ids[:, :5], use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-4
