"""FoPE (posenc.encodings.rope.fope) against a float64 re-implementation of the shipped code
(vLLM ``vllm/model_executor/layers/rotary_embedding/fope.py`` @c215d1e, ``forward_native``;
InternLM/xtuner ``xtuner/v1/module/rope/rope.py`` @b934f46; the official
TsinghuaC3I/Fourier-Position-Embedding ``olmo/model.py`` @bd94b20), written here from those
files' steps, and the properties that hold: identity coefficients with nothing dropped are
RoPE (half-split), the padded channels' quirk, the GQA head order, gradients, compile."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.encodings import FoPE, fope_frequencies
from posenc.errors import InvalidArgument


def reference_fope(x, positions, cos_coef, sin_coef, *, head_dim, theta, max_position_embeddings=None,
                   num_inv_freq=None, sin_pad=1.0):
    """vLLM's forward_native in float64, one tensor x (B, H, T, D) at int positions (T,):
    inv_freq = 1 / theta ** (arange(0, D, 2) / D); the first num_inv_freq, or those (in
    float32) > 2 pi / max_position_embeddings; cos / sin of t * inv_freq mixed by
    einsum("htD,hDd->thd") per coefficient head; padded to D / 2 with 1 (sin: sin_pad);
    cat((c, c)); x * cos + rotate_half(x) * sin, head h reading coefficient head h // (H / Hc)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if num_inv_freq is not None:
        inv = inv[:num_inv_freq]
    elif max_position_embeddings is not None:
        inv = inv[inv.float() > 2.0 * math.pi / max_position_embeddings]
    ang = positions.double()[:, None] * inv[None]
    group = x.shape[1] // cos_coef.shape[0]
    out = torch.empty_like(x, dtype=torch.float64)
    half = head_dim // 2
    for h in range(x.shape[1]):
        c = torch.cos(ang) @ cos_coef[h // group].double()
        s = torch.sin(ang) @ sin_coef[h // group].double()
        pad = half - c.shape[-1]
        c = torch.cat([c, torch.ones(c.shape[0], pad, dtype=torch.float64)], -1)
        s = torch.cat([s, torch.full((s.shape[0], pad), sin_pad, dtype=torch.float64)], -1)
        c, s = torch.cat([c, c], -1), torch.cat([s, s], -1)
        xh = x[:, h].double()
        rot = torch.cat([-xh[..., half:], xh[..., :half]], -1)
        out[:, h] = xh * c + rot * s
    return out


def _random_coefficients(enc, generator):
    with torch.no_grad():
        for coef in (enc.cos_coef, enc.sin_coef):
            coef.copy_(torch.randn(coef.shape, generator=generator, dtype=coef.dtype))


@pytest.mark.parametrize("heads, coef_heads, sep", [(4, 2, True), (4, 4, True), (4, 1, False)])
@pytest.mark.parametrize("limits", [{"max_position_embeddings": 64}, {"num_inv_freq": 5}, {}])
@pytest.mark.parametrize("sin_pad", [1.0, 0.0])
def test_rotate_equals_the_shipped_code_in_float64(heads, coef_heads, sep, limits, sin_pad):
    g = torch.Generator().manual_seed(0)
    enc = FoPE(16, coef_heads, rope_theta=500.0, fope_sep_head=sep, sin_pad_value=sin_pad, **limits).double()
    _random_coefficients(enc, g)  # far from the identity: every mixing weight shows
    q = torch.randn(2, heads, 7, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, coef_heads, 9, 16, generator=g, dtype=torch.float64)
    qp, kp = torch.arange(1000, 1007), torch.tensor([0, 3, 5, 64, 200, 999, 1000, 1003, 1006])
    got_q, got_k = enc.rotate(q, k, qp, kp)
    kwargs = dict(head_dim=16, theta=500.0, sin_pad=sin_pad, **limits)
    torch.testing.assert_close(got_q, reference_fope(q, qp, enc.cos_coef, enc.sin_coef, **kwargs), rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, reference_fope(k, kp, enc.cos_coef, enc.sin_coef, **kwargs), rtol=0, atol=1e-12)
    # the check sees a wrong head order: query head h on coefficient head h % Hc instead of h // (H / Hc)
    if coef_heads not in (1, heads):
        shuffled = torch.cat([q[:, 0::2], q[:, 1::2]], 1)  # heads 0, 2, 1, 3
        wrong = reference_fope(shuffled, qp, enc.cos_coef, enc.sin_coef, **kwargs)
        assert (wrong - torch.cat([got_q[:, 0::2], got_q[:, 1::2]], 1)).abs().max() > 1e-3


def test_rotate_takes_per_row_positions():
    g = torch.Generator().manual_seed(1)
    enc = FoPE(8, 2, max_position_embeddings=32).double()
    _random_coefficients(enc, g)
    x = torch.randn(2, 2, 5, 8, generator=g, dtype=torch.float64)
    rows = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])
    got, _ = enc.rotate(x, x, rows, rows)
    for b in range(2):
        one, _ = enc.rotate(x[b:b + 1], x[b:b + 1], rows[b], rows[b])
        torch.testing.assert_close(got[b:b + 1], one, rtol=0, atol=0)


@pytest.mark.parametrize("theta, length, kept", [(10000.0, 512, 16), (10000.0, 1024, 18)])
def test_kept_frequencies_are_the_official_counts(theta, length, kept):
    """head_dim 64, base 1e4: the official configs' training lengths 512 and 1024 leave 16 and
    18 of 32 frequencies (16 and 14 channels padded), each > 2 pi / L."""
    inv = fope_frequencies(64, rope_theta=theta, max_position_embeddings=length)
    assert inv.dtype == torch.float64 and inv.numel() == kept
    full = 1.0 / theta ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    torch.testing.assert_close(inv, full[:kept], rtol=1e-15, atol=0)
    assert full[kept] * length < 2 * math.pi < full[kept - 1] * length
    assert fope_frequencies(64, rope_theta=theta, num_inv_freq=3).numel() == 3
    assert fope_frequencies(64, rope_theta=theta).numel() == 32


def test_identity_coefficients_with_every_frequency_are_rope():
    enc = FoPE(16, 2, rope_theta=1e4, fope_init_factor=0.0).double()
    rope = posenc.RoPE(16, base=1e4).double()
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 2, 6, 16, generator=g, dtype=torch.float64) for _ in range(2))
    pos = torch.tensor([0, 1, 7, 100, 4095, 70000])
    for got, want in zip(enc.rotate(q, k, pos, pos), rope.rotate(q, k, pos, pos)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # and the scores are then relative (RoPE's); with mixed coefficients they are not
    _random_coefficients(enc, g)
    a, b = enc.rotate(q, k, pos, pos)
    c, d = enc.rotate(q, k, pos + 37, pos + 37)
    assert ((a @ b.transpose(-1, -2)) - (c @ d.transpose(-1, -2))).abs().max() > 1e-3


def test_dropped_channels_carry_the_shipped_sin_of_one():
    """A channel of a dropped frequency: cos 1 and sin 1 as shipped, so the pair (x_j,
    x_{j+D/2}) becomes (x_j - x_{j+D/2}, x_{j+D/2} + x_j); with sin_pad_value 0 it passes."""
    enc = FoPE(8, 1, rope_theta=1e4, num_inv_freq=1, fope_init_factor=0.0).double()
    x = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    pos = torch.arange(3)
    got, _ = enc.rotate(x, x, pos, pos)
    for j in (1, 2, 3):
        torch.testing.assert_close(got[..., j], x[..., j] - x[..., j + 4], rtol=0, atol=1e-15)
        torch.testing.assert_close(got[..., j + 4], x[..., j + 4] + x[..., j], rtol=0, atol=1e-15)
    passing = FoPE(8, 1, rope_theta=1e4, num_inv_freq=1, fope_init_factor=0.0, sin_pad_value=0.0).double()
    got, _ = passing.rotate(x, x, pos, pos)
    torch.testing.assert_close(got[..., [1, 2, 3, 5, 6, 7]], x[..., [1, 2, 3, 5, 6, 7]], rtol=0, atol=0)


def test_coefficients_start_at_identity_plus_xavier_noise():
    torch.manual_seed(3)
    enc = FoPE(64, 8, fope_init_factor=0.5)
    heads, count = enc.cos_coef.shape[0], enc.num_inv_freq
    assert enc.cos_coef.shape == enc.sin_coef.shape == (8, 32, 32)
    noise = enc.cos_coef - torch.eye(count)
    want = 0.5 * math.sqrt(2.0 / (count * count + heads * count))  # xavier_normal_ on (H, F, F)
    assert abs(noise.std().item() / want - 1) < 0.05 and abs(noise.mean().item()) < 3 * want / math.sqrt(noise.numel())
    assert not torch.equal(enc.cos_coef, enc.sin_coef)
    assert torch.equal(FoPE(8, 2, fope_init_factor=0.0).cos_coef, torch.eye(4).expand(2, 4, 4))


def test_buffers_by_default_parameters_when_learnable():
    frozen, learned = FoPE(8, 2), FoPE(8, 2, learnable=True)
    assert list(frozen.parameters()) == [] and set(frozen.state_dict()) == {"cos_coef", "sin_coef"}
    assert {name for name, _ in learned.named_parameters()} == {"cos_coef", "sin_coef"}
    low = FoPE(8, 2).to(torch.bfloat16)  # the frequencies stay float64 (a bf16 copy would not rotate exactly)
    assert low.cos_coef.dtype == torch.bfloat16 and low._inv_freq_f64.dtype == torch.float64


def test_gradients_against_finite_differences():
    enc = FoPE(8, 2, max_position_embeddings=20, learnable=True).double()
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([2, 9, 30])

    def scores(q, k, cos_coef, sin_coef):
        with torch.no_grad():
            enc.cos_coef.copy_(cos_coef)
            enc.sin_coef.copy_(sin_coef)
        a, b = enc.rotate(q, k, pos, pos)
        return a @ b.repeat_interleave(2, 1).transpose(-1, -2)

    assert torch.autograd.gradcheck(lambda q, k: scores(q, k, enc.cos_coef.detach(), enc.sin_coef.detach()), (q, k))
    a, b = enc.rotate(q, k, pos, pos)
    (a.sum() + b.sum()).backward()
    assert enc.cos_coef.grad is not None and enc.cos_coef.grad.abs().sum() > 0


def test_rotate_compiles_fullgraph():
    enc = FoPE(8, 2, max_position_embeddings=20)
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    pos = torch.arange(5)
    torch._dynamo.reset()
    compiled = torch.compile(enc.rotate, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(q, k, pos, pos), enc.rotate(q, k, pos, pos)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("kwargs, match", [
    ({"head_dim": 7}, "head_dim"),
    ({"head_dim": 8, "num_key_value_heads": 0}, "num_key_value_heads"),
    ({"head_dim": 8, "rope_theta": 1.0}, "rope_theta"),
    ({"head_dim": 8, "num_inv_freq": 5}, "num_inv_freq"),
    ({"head_dim": 8, "num_inv_freq": 2, "max_position_embeddings": 64}, "not both"),
    ({"head_dim": 8, "max_position_embeddings": 6}, "no frequency"),
    ({"head_dim": 8, "max_position_embeddings": 0}, "max_position_embeddings"),
    ({"head_dim": 8, "fope_init_factor": -0.1}, "fope_init_factor"),
    ({"head_dim": 8, "sin_pad_value": 0.5}, "sin_pad_value"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        FoPE(**kwargs)


def test_head_counts_that_do_not_divide_are_refused():
    enc = FoPE(8, 2)
    with pytest.raises(InvalidArgument, match="num_key_value_heads"):
        enc.rotate(torch.randn(1, 3, 2, 8), torch.randn(1, 2, 2, 8), torch.arange(2), torch.arange(2))
    with pytest.raises(InvalidArgument, match="head_dim"):
        enc.rotate(torch.randn(1, 2, 2, 6), torch.randn(1, 2, 2, 6), torch.arange(2), torch.arange(2))


def test_the_lab_clips_at_its_training_length():
    """posenc extrapolate builds FoPE with max_position_embeddings = L (the official code's
    max_sequence_length), through the encodings' generic options_for_train_len."""
    from posenc.lab.experiments.extrapolation_config import ExtrapolationConfig

    assert FoPE.options_for_train_len(128) == {"max_position_embeddings": 128}
    config = ExtrapolationConfig.from_preset("quick")
    options = config.encoding_options("fope")
    assert options == {"max_position_embeddings": config.train_len}
    built = config.encoding("fope")
    assert isinstance(built, FoPE) and built.num_inv_freq == fope_frequencies(
        built.head_dim, max_position_embeddings=config.train_len).numel() < built.head_dim // 2
