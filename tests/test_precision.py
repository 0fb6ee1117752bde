"""The precision policy (docs/precision.md) at positions up to 2^20 = 1,048,576.

References are independent of the code under test: mpmath at 120 bits for RoPE's cos and
sin, float64 formulas written out for the biases, and float64 runs of the same encodings.
"""

import copy
import math

import mpmath
import pytest
import torch

import posenc
from conftest import attention_extras, make_encoding
from rope_reference import xpos_reference_score
from t5_reference import t5_bucket_reference

P = 1_048_576  # 2^20
LOW = (torch.bfloat16, torch.float16)


def fp32_ulp(value: float) -> float:
    """Spacing of float32 numbers at |value| (normal range)."""
    value = abs(value)
    return 2.0**-149 if value < 2.0**-126 else 2.0 ** (math.floor(math.log2(value)) - 23)


@pytest.fixture(scope="module")
def rope():
    return posenc.create("rope", head_dim=8)


# -- RoPE: cos and sin within half an fp32 ulp + 2^-29 of the exact value -------------------
def test_rope_cos_sin_at_a_million_within_proved_bound(rope):
    # Bound (docs/precision.md): angle in float64 from float64 inv_freq, error <= 2^-30 at
    # p <= 2^20; cos/sin in float64; one rounding to float32: |c32 - c| <= ulp32(c)/2 + 2^-29.
    mpmath.mp.prec = 120
    positions = torch.cat([torch.arange(P - 1024, P + 1), torch.arange(0, 16)])
    for dtype in LOW:  # bf16 and fp16 activations use float32 tables
        cos, sin = rope.cos_sin(positions, torch.promote_types(dtype, torch.float32))
        assert cos.dtype == sin.dtype == torch.float32
    inv_freq = [mpmath.mpf(10000) ** (-mpmath.mpf(2 * i) / 8) for i in range(4)]
    worst = 0.0
    for row, p in enumerate(positions.tolist()):
        for i, f in enumerate(inv_freq):
            for table, fn in ((cos, mpmath.cos), (sin, mpmath.sin)):
                exact = float(fn(p * f))
                err = abs(float(table[row, i]) - exact)
                assert err <= fp32_ulp(exact) / 2 + 2.0**-29, (p, i, err)
                worst = max(worst, err)
    assert worst <= 2.0**-25  # never more than half an ulp of 1


@pytest.mark.parametrize("dtype", LOW)
def test_rope_rotation_in_low_precision_near_a_million(rope, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 6, 8, generator=g).to(dtype)
    positions = torch.tensor([P - 5, P - 4, P - 3, P - 2, P - 1, P])
    out, _ = rope.rotate(x, x, positions, positions)
    assert out.dtype == dtype
    xd = x.double()
    eps = torch.finfo(dtype).eps
    for t, p in enumerate(positions.tolist()):
        for i in range(4):
            theta = p * 10000.0 ** (-2.0 * i / 8)
            c, s = math.cos(theta), math.sin(theta)
            a, b = xd[..., t, i], xd[..., t, i + 4]
            for got, ref in ((out[..., t, i], a * c - b * s), (out[..., t, i + 4], b * c + a * s)):
                # one rounding to the activation dtype, plus the float32 arithmetic before it
                bound = ref.abs() * eps / 2 + 2.0**-20 * (a.abs() + b.abs())
                assert ((got.double() - ref).abs() <= bound).all(), (p, i, got, ref)


# -- bias encodings: exact integer distances -----------------------------------------------
def far_positions():
    q = torch.tensor([P, P - 1, 1000])
    k = torch.tensor([0, 1, 7, P - 1_000, P - 1, P])
    return q, k


@pytest.mark.parametrize("num_heads", [8, 12])
def test_alibi_bias_is_the_rounded_product_of_slope_and_exact_distance(num_heads):
    enc = posenc.create("alibi", num_heads=num_heads, bidirectional=True)
    q, k = far_positions()
    bias = enc.score_bias(q, k)  # (H, Tq, Tk) float32
    distance = (q[:, None] - k[None, :]).abs().double()  # exact integers
    slopes32 = enc.slopes.double()[:, None, None]
    # slope (24 bits) x distance (< 2^24) is exact in float64: one rounding to float32
    assert torch.equal(bias, (-slopes32 * distance).float())
    n0 = 2 ** int(math.log2(num_heads))
    exact = [2.0 ** (-8.0 * h / n0) for h in range(1, n0 + 1)]
    exact += [2.0 ** (-8.0 * h / (2 * n0)) for h in range(1, 2 * (num_heads - n0), 2)]
    ref = -torch.tensor(exact, dtype=torch.float64)[:, None, None] * distance
    assert ((bias.double() - ref).abs() <= ref.abs() * 2.0**-23).all()


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_near_a_million_matches_float64(variant):
    enc = posenc.create("kerple", num_heads=4, variant=variant)
    q, k = far_positions()
    bias = enc.score_bias(q, k).double()
    p, a = enc.bias_p.detach().double(), enc.bias_a.detach().double()
    ref = torch.empty_like(bias)
    for h in range(4):
        for i, qi in enumerate(q.tolist()):
            for j, kj in enumerate(k.tolist()):
                d = abs(qi - kj)
                ref[h, i, j] = -p[h] * math.log1p(a[h] * d) if variant == "log" else -a[h] * d ** p[h]
    assert ((bias - ref).abs() <= ref.abs() * 2.0**-20 + 1e-30).all()


def test_t5_buckets_near_a_million_match_the_reference_loop():
    q, k = far_positions()
    rel = k[None, :] - q[:, None]
    for bidirectional in (True, False):
        got = posenc.t5_relative_position_bucket(rel, bidirectional=bidirectional)
        ref = torch.tensor([[t5_bucket_reference(r, bidirectional, 32, 128) for r in row] for row in rel.tolist()])
        assert torch.equal(got, ref)


def test_fire_normalized_distance_near_a_million_matches_float64():
    enc = posenc.create("fire", num_heads=2)
    q, k = far_positions()
    got = enc.normalized_distance(q[:, None], k[None, :]).detach().double()
    c, L, eps = float(enc.c.detach()), float(enc.threshold.detach()), enc.eps
    for i, qi in enumerate(q.tolist()):
        for j, kj in enumerate(k.tolist()):
            ref = math.log(abs(c * (qi - kj)) + 1) / (math.log(abs(c * max(L, qi)) + 1) + eps)
            assert abs(float(got[i, j]) - ref) <= 2.0**-20 * abs(ref) + 1e-12, (qi, kj)


# -- xPos: keys only decay under the default per-query-block centre ------------------------
@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
def test_xpos_decoding_at_a_million_is_finite_and_exact(dtype):
    enc = posenc.create("xpos", head_dim=8)
    g = torch.Generator().manual_seed(2)
    kp = torch.tensor([0, 1, 500_000, P - 3000, P - 600, P - 50, P - 1, P])
    qp = kp[-1:]
    q = torch.randn(1, 1, 1, 8, generator=g).to(dtype)
    k = torch.randn(1, 1, kp.numel(), 8, generator=g).to(dtype)
    q_rot, k_rot = enc.rotate(q, k, qp, kp)
    assert torch.isfinite(q_rot).all() and torch.isfinite(k_rot).all()
    assert (k_rot[..., :3, :] == 0).all()  # zeta^(>=1900) underflows to 0: the correct limit
    scores = (q_rot.double() @ k_rot.double().transpose(-2, -1))[0, 0, 0]
    eps = torch.finfo(dtype).eps
    for m in range(kp.numel()):
        ref = xpos_reference_score(q[0, 0, 0].double(), k[0, 0, m].double(), P, int(kp[m]))
        assert abs(float(scores[m]) - ref) <= 8 * eps * (1 + abs(ref)), (int(kp[m]), float(scores[m]), ref)


def test_xpos_query_block_too_long_for_float16_raises_naming_the_argument():
    enc = posenc.create("xpos", head_dim=8)
    positions = torch.arange(P - 6000, P)  # a span of 6000 > ~4,500 for float16
    x = torch.randn(1, 1, positions.numel(), 8)
    with pytest.raises(ValueError, match="q_positions.*float16"):
        enc.rotate(x.half(), x.half(), positions, positions)
    q_rot, k_rot = enc.rotate(x, x, positions, positions)  # float32: within range
    assert torch.isfinite(q_rot).all() and torch.isfinite(k_rot).all()


def test_xpos_per_row_centres_for_batched_positions():
    enc = posenc.create("xpos", head_dim=8, scale_base=16.0)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 3, 8, generator=g), torch.randn(2, 1, 6, 8, generator=g)
    kp = torch.stack([torch.arange(6), torch.arange(6) + P - 5])  # one row near 0, one near 1M
    qp = kp[:, -3:]
    q_rot, k_rot = enc.rotate(q, k, qp, kp)
    scores = (q_rot.double() @ k_rot.double().transpose(-2, -1))
    for b in range(2):
        for i in range(3):
            for j in range(6):
                n, m = int(qp[b, i]), int(kp[b, j])
                ref = xpos_reference_score(q[b, 0, i].double(), k[b, 0, j].double(), n, m, scale_base=16.0)
                assert abs(float(scores[b, 0, i, j]) - ref) <= 1e-4 * (1 + abs(ref))


# -- every registered encoding, bf16 and fp16, near a million, eager and sdpa --------------
#: Encodings whose parameters multiply the position (a learned rotation's generator): cast to
#: bf16 they are another rotation, p 2^-9 |A| radians away near position p, which their
#: docstrings say (keep them float32); their reference is their own rounded parameters in
#: float64, so that what is checked is the arithmetic on positions, as for every encoding.
LEARNED_ANGLES = ("liere", "comrope", "grape")


@pytest.fixture(scope="module")
def encodings_fp32_and_fp64():
    torch.manual_seed(0)
    pairs = {}
    for name in posenc.available():
        if name in ("sinusoidal", "learned"):
            continue
        base = make_encoding(name, d_model=32, num_heads=4).float()
        pairs[name] = (base, copy.deepcopy(base).double())
    return pairs


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", [n for n in posenc.available() if n not in ("sinusoidal", "learned")])
def test_every_attention_encoding_near_a_million_is_finite_and_close_to_float64(name, dtype, encodings_fp32_and_fp64):
    base, ref_enc = encodings_fp32_and_fp64[name]
    enc = copy.deepcopy(base).to(dtype)
    if name in LEARNED_ANGLES:
        ref_enc = copy.deepcopy(enc).double()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, t, 8, generator=g).to(dtype) for t in (8, 64, 64))
    kp = torch.cat([torch.tensor([0, 1, 2, 500_000]), torch.arange(P - 59, P + 1)])
    qp = kp[-8:]
    extras = attention_extras(ref_enc, 2, 4, 64, generator=g)  # float64 gates; the model's are float32
    ref = posenc.attention(q.double(), k.double(), v.double(), ref_enc, q_positions=qp, k_positions=kp, backend="eager",
                           **extras)
    extras = {name: value.float() for name, value in extras.items()}
    # 8 roundings of the activation dtype on outputs of size |v|: a position rounded in bf16
    # (4096 apart near 2^20) or an overflowed bias would be off by O(1) or NaN.
    tol = 8 * torch.finfo(dtype).eps * float(v.abs().max())
    backends = ["eager"] if "content" in enc.hooks and enc.content_on_values else ["eager", "sdpa"]
    for backend in backends:
        out = posenc.attention(q, k, v, enc, q_positions=qp, k_positions=kp, backend=backend, **extras)
        assert out.dtype == dtype and torch.isfinite(out).all(), backend
        assert (out.double() - ref).abs().max() <= tol, backend


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
def test_embed_encodings_near_a_million(dtype):
    positions = torch.tensor([0, 1, P - 1, P])
    x = torch.zeros(1, 4, 16, dtype=dtype)
    out = posenc.create("sinusoidal", dim=16).embed(x, positions)
    ref = torch.empty(4, 16, dtype=torch.float64)
    for t, p in enumerate(positions.tolist()):
        for i in range(8):
            ref[t, 2 * i] = math.sin(p * 10000.0 ** (-2.0 * i / 16))
            ref[t, 2 * i + 1] = math.cos(p * 10000.0 ** (-2.0 * i / 16))
    assert torch.isfinite(out).all()
    assert ((out[0].double() - ref).abs() <= torch.finfo(dtype).eps / 2 + 2.0**-24).all()
    learned = posenc.create("learned", num_positions=P + 1, dim=4).to(dtype)
    out = learned.embed(torch.zeros(1, 4, 4, dtype=dtype), positions)
    assert torch.equal(out[0], learned.weight[positions])
