"""xPos, Kerple, FIRE, Shaw and Transformer-XL against independent references.

Each reference is its paper's formula written out in float64 with explicit Python loops over
query i and key j (math.cos, math.log, ...), sharing no code with posenc; full attention
outputs are compared, not only the position terms. Sizes are tiny to keep the loops fast.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.encodings.transformer_xl import relative_shift
from posenc.encodings.rope.xpos import xpos_zeta
from rope_reference import xpos_reference_score
from loop_reference import dot, softmax_average

B, H, D = 2, 2, 4
ATOL = 2e-5  # float32 arithmetic against a float64 reference
EPS32 = float(torch.tensor(0.01))  # Kerple's clamp, as stored in a float32 parameter


# -- the naive reference attention ---------------------------------------------------------
def naive_attention(q, k, v, logit, *, q_pos, k_pos, causal=True, value_extra=None):
    """softmax_j(logit(b, h, i, j)) over allowed j, then sum_j p_ij (v_j + value_extra(b, h, i, j)).

    q_pos, k_pos: python lists of per-row position lists; causal keeps j <= i + Tk - Tq.
    """
    q, k, v = q.double(), k.double(), v.double()
    nb, nh, tq, d = q.shape
    tk = k.shape[2]
    out = torch.zeros(nb, nh, tq, d, dtype=torch.float64)
    for b in range(nb):
        for h in range(nh):
            for i in range(tq):
                keys = [j for j in range(tk) if not causal or j <= i + tk - tq]
                logits = [logit(b, h, i, j) for j in keys]
                rows = [v[b, h, j] if value_extra is None else v[b, h, j] + value_extra(b, h, i, j) for j in keys]
                out[b, h, i] = softmax_average(logits, rows)
    return out


def rows(positions, nb):
    positions = positions if positions.dim() == 2 else positions.expand(nb, -1)
    return positions.tolist()


def qkv(tq, tk, seed=0, d=D):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, tq, d, generator=g), torch.randn(B, H, tk, d, generator=g),
            torch.randn(B, H, tk, d, generator=g))


def run(enc, q, k, v, qp, kp, causal=True, backend="eager"):
    return posenc.attention(q, k, v, enc, q_positions=qp, k_positions=kp, causal=causal, backend=backend)


# -- xPos -----------------------------------------------------------------------------------
def xpos_logit_fn(q, k, qpos, kpos, *, scale_base, gamma=0.4, rope_base=10000.0):
    """Sun et al. 2022: q_n R(n theta) zeta^(n/B) . k_m R(m theta) zeta^(-m/B), half-split pairs (p, p + D/2)."""
    d = q.shape[-1]
    half = d // 2

    def rotated(x, pos, sign):
        out = [0.0] * d
        for p in range(half):
            theta = rope_base ** (-2.0 * p / d)
            zeta = (2.0 * p / d + gamma) / (1.0 + gamma)
            s = zeta ** (sign * pos / scale_base)
            a, b = float(x[p]), float(x[p + half])
            out[p] = s * (a * math.cos(pos * theta) - b * math.sin(pos * theta))
            out[p + half] = s * (a * math.sin(pos * theta) + b * math.cos(pos * theta))
        return out

    def logit(b, h, i, j):
        return dot(rotated(q[b, h, i], qpos[b][i], 1), rotated(k[b, h, j], kpos[b][j], -1)) / math.sqrt(d)

    return logit


def test_xpos_zeta_matches_torchscale_constants():
    # torchscale: (arange(0, d, 2) + 0.4 d) / (1.4 d); d = 8 -> 3.2/11.2, 5.2/11.2, 7.2/11.2, 9.2/11.2
    expected = torch.tensor([3.2, 5.2, 7.2, 9.2], dtype=torch.float64) / 11.2
    torch.testing.assert_close(xpos_zeta(8), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("center", [0, 37, "call"])
def test_xpos_attention_matches_paper_formula(center):
    q, k, v = qkv(3, 6)
    qp, kp = torch.arange(3, 6), torch.arange(6)
    enc = posenc.create("xpos", head_dim=D, scale_base=4.0, center=center)  # small B: the decay is visible
    ref = naive_attention(q, k, v, xpos_logit_fn(q, k, rows(qp, B), rows(kp, B), scale_base=4.0),
                          q_pos=qp, k_pos=kp)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp).double(), ref, atol=ATOL, rtol=0)


def test_xpos_scores_relative_and_split_consistent():
    enc = posenc.create("xpos", head_dim=8, scale_base=16.0)
    q, k, _ = qkv(5, 5, d=8)
    pos = torch.arange(5)

    def scores(qp, kp, split):
        if split:  # keys rotated alone (a KV cache), queries in a later call
            _, k_rot = enc.rotate(k, k, kp, kp)
            q_rot, _ = enc.rotate(q, q, qp, qp)
        else:
            q_rot, k_rot = enc.rotate(q, k, qp, kp)
        return q_rot @ k_rot.transpose(-2, -1)

    base = scores(pos, pos, split=False)
    torch.testing.assert_close(scores(pos + 1000, pos + 1000, split=False), base, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(scores(pos, pos, split=True), base, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores(pos + 1000, pos + 1000, split=True), base, atol=1e-4, rtol=1e-5)


def test_xpos_call_centre_is_only_consistent_within_one_call():
    # documented limitation of center="call": keys rotated in another call get another centre
    enc = posenc.create("xpos", head_dim=8, scale_base=16.0, center="call")
    q, k, _ = qkv(1, 6, d=8)
    kp, qp = torch.arange(6), torch.tensor([5])
    q_rot, k_rot = enc.rotate(q, k, qp, kp)
    _, k_alone = enc.rotate(k, k, kp, kp)
    q_alone, _ = enc.rotate(q, q, qp, qp)
    assert not torch.allclose(q_alone @ k_alone.transpose(-2, -1), q_rot @ k_rot.transpose(-2, -1), atol=1e-3)


@pytest.mark.parametrize("center,offset", [(0, 0), ("call", 50_000)])
def test_xpos_float32_safe_at_16k_positions(center, offset):
    enc = posenc.create("xpos", head_dim=16, center=center)
    g = torch.Generator().manual_seed(1)
    num = 16_384
    k = torch.randn(1, 1, num, 16, generator=g)
    q = torch.randn(1, 1, 1, 16, generator=g)
    kp = torch.arange(num) + offset
    qp = kp[-1:]
    q_rot, k_rot = enc.rotate(q, k, qp, kp)
    assert torch.isfinite(q_rot).all() and torch.isfinite(k_rot).all()
    scores = (q_rot @ k_rot.transpose(-2, -1))[0, 0, 0]
    for m in (0, 1, 4096, 8191, 12_000, num - 2, num - 1):
        ref = xpos_reference_score(q[0, 0, 0], k[0, 0, m], int(qp), int(kp[m]))
        assert abs(float(scores[m]) - ref) <= 1e-5 * (1 + abs(ref)), (m, float(scores[m]), ref)
    out = posenc.attention(q, k, k, enc, q_positions=qp, k_positions=kp)
    assert torch.isfinite(out).all()


def test_xpos_out_of_range_raises_and_names_the_argument():
    enc = posenc.create("xpos", head_dim=8, center=0)  # fixed centre 0: about 33k positions are safe in float32
    q = torch.randn(1, 1, 2, 8)
    with pytest.raises(ValueError, match="k_positions.*center"):
        enc.rotate(q, q, torch.tensor([100_000, 100_001]), torch.tensor([100_000, 100_001]))
    with pytest.raises(ValueError, match="k_positions"):
        enc.rotate(q.half(), q.half(), torch.tensor([0, 1]), torch.tensor([9000, 9001]))


# -- Kerple ---------------------------------------------------------------------------------
def kerple_logit_fn(q, k, qpos, kpos, enc):
    p, a = enc.bias_p.detach().tolist(), enc.bias_a.detach().tolist()

    def logit(b, h, i, j):
        dist = abs(qpos[b][i] - kpos[b][j])
        if enc.variant == "log":  # Chi et al. 2022: -r1 ln(1 + r2 |m - n|), r1 = bias_p, r2 = bias_a
            bias = -p[h] * math.log(1.0 + a[h] * dist)
        else:  # -r1 |m - n|^r2, r1 = bias_a, r2 = bias_p
            bias = -a[h] * dist ** p[h]
        return dot(q[b, h, i], k[b, h, j]) / math.sqrt(q.shape[-1]) + bias

    return logit


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_matches_paper_formula(variant):
    torch.manual_seed(0)
    enc = posenc.create("kerple", num_heads=H, variant=variant)
    q, k, v = qkv(4, 7)
    qp, kp = torch.arange(3, 7), torch.arange(7)
    ref = naive_attention(q, k, v, kerple_logit_fn(q, k, rows(qp, B), rows(kp, B), enc), q_pos=qp, k_pos=kp)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp).double(), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, backend="sdpa").double(), ref, atol=ATOL, rtol=0)


def test_kerple_initialisation_follows_official_code():
    torch.manual_seed(0)
    log = posenc.create("kerple", num_heads=64)
    p, a = log.bias_p.detach(), log.bias_a.detach()  # r1 ~ U(0, 2), r2 ~ U(0, 1), clamped >= 0.01
    assert EPS32 <= float(p.min()) and float(p.max()) <= 2.0 and float(p.mean()) > 0.5
    assert EPS32 <= float(a.min()) and float(a.max()) <= 1.0 and float(a.mean()) < 0.75


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_parameters_stay_positive_after_a_step_pushing_them_negative(variant):
    enc = posenc.create("kerple", num_heads=3, variant=variant)
    opt = torch.optim.SGD(enc.parameters(), lr=100.0)
    pos = torch.arange(6)
    enc.score_bias(pos, pos).sum().neg().backward()  # d(-bias)/dparam > 0: SGD drives them below 0
    opt.step()
    assert float(enc.bias_a.detach().min()) < 0 or float(enc.bias_p.detach().min()) < 0
    bias = enc.score_bias(pos, pos)  # the official code clamps before every use
    assert float(enc.bias_a.detach().min()) >= EPS32 and float(enc.bias_p.detach().min()) >= EPS32
    if variant == "power":
        assert float(enc.bias_p.detach().max()) <= 2.0
    assert torch.isfinite(bias).all() and float(bias.detach().max()) <= 0.0
    enc.zero_grad()
    enc.score_bias(pos, pos).sum().backward()  # still trainable at the bound
    assert enc.bias_a.grad.abs().sum() > 0 and enc.bias_p.grad.abs().sum() > 0


def test_kerple_power_exponent_clamped_above_at_two():
    enc = posenc.create("kerple", num_heads=2, variant="power")
    with torch.no_grad():
        enc.bias_p.fill_(5.0)
    enc.score_bias(torch.arange(3), torch.arange(3))
    assert float(enc.bias_p.detach().max()) == 2.0


# -- FIRE -----------------------------------------------------------------------------------
def fire_bias_fn(enc):
    """Li et al. 2024: f_theta(psi(i - j) / psi(max(L, i))), psi(x) = ln(|c x| + 1), eps 1e-6."""
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()
    c, big_l = enc.c.item(), abs(enc.L_multiplier.item() * 512.0)

    def bias(h, i, j):
        x = math.log(abs(c * (i - j)) + 1.0) / (math.log(abs(c * max(big_l, i)) + 1.0) + 1e-6)
        hidden = [max(0.0, w * x + bb) for w, bb in zip(w1, b1)]
        return sum(w * z for w, z in zip(w2[h], hidden)) + b2[h]

    return bias


@pytest.mark.parametrize("q_start", [20, 600])  # below and past the threshold L = 512
def test_fire_matches_paper_formula_under_a_cache_offset(q_start):
    torch.manual_seed(0)
    enc = posenc.create("fire", num_heads=H)
    with torch.no_grad():
        enc.c.fill_(0.7)
        enc.L_multiplier.fill_(-1.0)  # L = |L_mult * 512|: the paper's abs makes this L = 512
    q, k, v = qkv(3, 8)
    qp, kp = torch.arange(q_start, q_start + 3), torch.arange(q_start - 5, q_start + 3)  # a cache of 5 keys
    fb = fire_bias_fn(enc)

    def logit(b, h, i, j):
        return dot(q[b, h, i], k[b, h, j]) / math.sqrt(D) + fb(h, int(qp[i]), int(kp[j]))

    ref = naive_attention(q, k, v, logit, q_pos=qp, k_pos=kp)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp).double(), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, backend="sdpa").double(), ref, atol=ATOL, rtol=0)
    bias = enc.score_bias(qp, kp).detach()
    for h in range(H):
        for i in range(3):
            for j in range(8):
                assert abs(float(bias[h, i, j]) - fb(h, int(qp[i]), int(kp[j]))) < 1e-5


def test_fire_piecewise_linear_form_matches_the_network():
    """Outside autograd FIRE evaluates its MLP as slopes and intercepts between the hidden
    units' bends: against the network written out in float64, on the bends themselves, between
    them and past both ends, with a unit whose input weight is 0 (a constant)."""
    torch.manual_seed(1)
    enc = posenc.create("fire", num_heads=H, mlp_width=16)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.normal_()
        enc.mlp[0].weight[3, 0] = 0.0
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()
    bends, slopes, intercepts = enc.piecewise_linear_mlp()
    assert bends.numel() == 15 and slopes.shape == intercepts.shape == (H, 16)
    xs = torch.cat((bends, torch.linspace(-30, 30, 601))).tolist()
    for x in xs:
        segment = int(torch.bucketize(torch.tensor(x), bends, right=True))
        for h in range(H):
            network = sum(w * max(0.0, a * x + c) for w, a, c in zip(w2[h], w1, b1)) + b2[h]
            pieces = float(slopes[h, segment]) * x + float(intercepts[h, segment])
            assert abs(pieces - network) <= 1e-5 * (1 + abs(network))
    fb = fire_bias_fn(enc)
    qp, kp = torch.arange(590, 610), torch.arange(0, 610, 7)
    with torch.no_grad():
        bias = enc.score_bias(qp, kp)
    for h in range(H):
        for i in range(0, 20, 3):
            for j in range(kp.numel()):
                assert abs(float(bias[h, i, j]) - fb(h, int(qp[i]), int(kp[j]))) < 1e-5


def test_fire_normalizer_is_absolute_as_the_paper_specifies():
    torch.manual_seed(0)
    enc = posenc.create("fire", num_heads=H)  # L = 512
    pos = torch.arange(8)
    # below the threshold the normalizer is psi(L): a shift that keeps i <= L changes nothing
    torch.testing.assert_close(enc.score_bias(pos + 100, pos + 100), enc.score_bias(pos, pos))
    # past it, the normalizer is psi(i) of the absolute query position: the same distance maps
    # to a smaller input, and the key at 0 always maps to ~1 (progressive interpolation into [0, 1])
    psi = lambda x: math.log(0.1 * x + 1.0)  # noqa: E731
    for i in (600, 1000, 5000):
        x = enc.normalized_distance(torch.tensor([i]), torch.tensor([i - 10, 0])).detach()
        assert abs(float(x[0]) - psi(10) / (psi(i) + 1e-6)) < 1e-6
        assert abs(float(x[1]) - 1.0) < 1e-5
    far = enc.normalized_distance(torch.tensor([2000]), torch.tensor([1990])).detach()
    near = enc.normalized_distance(torch.tensor([1000]), torch.tensor([990])).detach()
    assert float(far) < float(near)
    # so the bias is not shift invariant once i > L, by design
    assert not torch.allclose(enc.score_bias(pos + 1000, pos + 1000), enc.score_bias(pos, pos))


def test_fire_single_query_with_cache_matches_full_attention_row():
    torch.manual_seed(0)
    enc = posenc.create("fire", num_heads=H, init_L=4.0)
    q, k, v = qkv(10, 10)
    full = posenc.attention(q, k, v, enc)
    last = posenc.attention(q[:, :, -1:], k, v, enc)  # default q_positions = Tk - 1: absolute
    torch.testing.assert_close(last, full[:, :, -1:], atol=1e-6, rtol=1e-6)


def test_fire_score_mod_agrees_with_materialized_bias():
    torch.manual_seed(0)
    enc = posenc.create("fire", num_heads=3)
    qp, kp = torch.arange(700, 704), torch.arange(698, 704)
    mod = enc.score_mod(qp, kp)
    dense = enc.score_bias(qp, kp).detach()
    for h in range(3):
        for i in range(4):
            for j in range(6):
                got = mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(h), torch.tensor(i), torch.tensor(j))
                assert abs(float(got.detach()) - float(dense[h, i, j])) < 1e-6


# -- Shaw -----------------------------------------------------------------------------------
def shaw_fns(q, k, qpos, kpos, enc):
    wk, wv, kk = enc.relative_key.detach().double(), enc.relative_value.detach().double(), enc.max_relative_position

    def clip_index(b, i, j):
        return max(-kk, min(kk, kpos[b][j] - qpos[b][i])) + kk

    def logit(b, h, i, j):  # Shaw et al. eq. 4: q_i (k_j + a^K_ij) / sqrt(d_z)
        return dot(q[b, h, i], k[b, h, j].double() + wk[clip_index(b, i, j)]) / math.sqrt(q.shape[-1])

    def value_extra(b, h, i, j):  # eq. 3: z_i = sum_j alpha_ij (v_j + a^V_ij)
        return wv[clip_index(b, i, j)]

    return logit, value_extra


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_matches_paper_formula(causal):
    torch.manual_seed(0)
    enc = posenc.create("shaw", head_dim=D, max_relative_position=2)  # clipping inside the test
    q, k, v = qkv(4, 7)
    qp = torch.tensor([[3, 4, 5, 6], [1, 2, 3, 4]])
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]])  # a left-padded row
    logit, extra = shaw_fns(q, k, rows(qp, B), rows(kp, B), enc)
    ref = naive_attention(q, k, v, logit, q_pos=qp, k_pos=kp, causal=causal, value_extra=extra)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, causal=causal).double(), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, causal=causal, backend="auto").double(), ref,
                               atol=ATOL, rtol=0)


def test_shaw_needs_eager_and_sdpa_says_so():
    enc = posenc.create("shaw", head_dim=D)
    q, k, v = qkv(3, 3)
    with pytest.raises(ValueError, match="eager"):
        posenc.attention(q, k, v, enc, backend="sdpa")


# -- Transformer-XL -------------------------------------------------------------------------
def txl_logit_fn(q, k, qpos, kpos, enc):
    """Dai et al. 2019: (q_i + u).k_j + (q_i + v).W_{k,R} R_{i-j}, R in [sin || cos], / sqrt(D)."""
    w = enc.r_net.weight.detach().double().view(enc.num_heads, enc.head_dim, enc.d_model)
    u, vb = enc.r_w_bias.detach().double(), enc.r_r_bias.detach().double()
    dm = enc.d_model

    def r_vec(dist):
        freqs = [10000.0 ** (-t / dm) for t in range(0, dm, 2)]
        return torch.tensor([math.sin(dist * f) for f in freqs] + [math.cos(dist * f) for f in freqs],
                            dtype=torch.float64)

    def logit(b, h, i, j):
        qi, kj = q[b, h, i].double(), k[b, h, j].double()
        wr = w[h] @ r_vec(qpos[b][i] - kpos[b][j])
        return (dot(qi + u[h], kj) + dot(qi + vb[h], wr)) / math.sqrt(q.shape[-1])

    return logit


@pytest.mark.parametrize(
    "tq,tk,qp,kp,causal",
    [
        (3, 7, None, None, True),  # a memory / cache of 4 before the queries: the relative shift
        (5, 5, None, None, False),  # bidirectional: negative distances
        (5, 3, torch.arange(10, 15), torch.arange(11, 14), False),  # Tq > Tk
        (3, 5, torch.tensor([[2, 3, 4], [0, 1, 2]]), torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]), True),  # gather
    ],
)
def test_transformer_xl_matches_paper_formula(tq, tk, qp, kp, causal):
    torch.manual_seed(0)
    enc = posenc.create("transformer_xl", d_model=6, num_heads=H, head_dim=D, init_std=0.5)
    q, k, v = qkv(tq, tk)
    qp = torch.arange(tk - tq, tk) if qp is None else qp
    kp = torch.arange(tk) if kp is None else kp
    ref = naive_attention(q, k, v, txl_logit_fn(q, k, rows(qp, B), rows(kp, B), enc), q_pos=qp, k_pos=kp,
                          causal=causal)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, causal=causal).double(), ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(run(enc, q, k, v, qp, kp, causal=causal, backend="sdpa").double(), ref,
                               atol=ATOL, rtol=0)


def test_relative_shift_equals_transformer_xl_rel_shift_where_it_is_defined():
    tq, tk = 4, 7
    x = torch.randn(2, 3, tq, tq + tk - 1)

    def rel_shift(bd):  # the reference's _rel_shift on [q, k, ...] layout, here (..., q, k)
        pad = torch.zeros(*bd.shape[:-1], 1)
        padded = torch.cat([pad, bd], dim=-1).view(*bd.shape[:-2], bd.shape[-1] + 1, bd.shape[-2])
        return padded[..., 1:, :].reshape(bd.shape)

    ref = rel_shift(x[..., :tk])  # the reference has klen columns: distances klen-1 .. 0
    ours = relative_shift(x, tk)
    allowed = torch.arange(tk) <= torch.arange(tq).unsqueeze(-1) + (tk - tq)
    torch.testing.assert_close(ours[..., allowed], ref[..., allowed], rtol=0, atol=0)


# -- properties shared by the five ----------------------------------------------------------
FIVE = ["xpos", "kerple", "fire", "shaw", "transformer_xl"]


def build(name):
    torch.manual_seed(0)
    return posenc.create_for_model(name, d_model=8, num_heads=H, head_dim=D, max_positions=64)


def scores(enc, q, k, qp, kp):
    """Every position-dependent logit of the encoding, (B, H, Tq, Tk)."""
    if "rotate" in enc.hooks:
        q, k = enc.rotate(q, k, qp, kp)
    out = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if "content" in enc.hooks:
        out = out + enc.content_scores(q, k, qp, kp) / math.sqrt(q.shape[-1])
    if "score_bias" in enc.hooks:
        out = out + enc.score_bias(qp, kp)
    return out


@pytest.mark.parametrize("name", ["xpos", "kerple", "shaw", "transformer_xl"])
def test_relative_property_shift_all_positions(name):
    enc = build(name)
    q, k, _ = qkv(4, 6)
    qp, kp = torch.arange(2, 6), torch.arange(6)
    for offset in (1, 37, 3000):
        torch.testing.assert_close(scores(enc, q, k, qp + offset, kp + offset), scores(enc, q, k, qp, kp),
                                   atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", FIVE)
def test_eager_and_auto_backends_agree_and_gradients_flow(name):
    enc = build(name)
    q, k, v = (t.requires_grad_() for t in qkv(5, 5))
    eager = posenc.attention(q, k, v, enc, backend="eager")
    auto = posenc.attention(q, k, v, enc, backend="auto")
    torch.testing.assert_close(auto, eager, atol=1e-6, rtol=1e-5)
    if not enc.content_on_values or "content" not in enc.hooks:
        torch.testing.assert_close(posenc.attention(q, k, v, enc, backend="sdpa"), eager, atol=1e-6, rtol=1e-5)
    eager.square().sum().backward()
    assert q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    for pname, param in enc.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname


@pytest.mark.parametrize(
    "name,kwargs,argname",
    [
        ("xpos", {"head_dim": 8, "center": "middle"}, "center"),
        ("xpos", {"head_dim": 8, "scale_base": 0}, "scale_base"),
        ("xpos", {"head_dim": 8, "gamma": -1.0}, "gamma"),
        ("xpos", {"head_dim": 7}, "head_dim"),
        ("kerple", {"num_heads": 4, "variant": "cubic"}, "variant"),
        ("kerple", {"num_heads": 0}, "num_heads"),
        ("kerple", {"num_heads": 2, "eps": 0.0}, "eps"),
        ("fire", {"num_heads": 2, "mlp_width": 0}, "mlp_width"),
        ("fire", {"num_heads": 2, "init_L": -1.0}, "init_L"),
        ("fire", {"num_heads": 2.5}, "num_heads"),
        ("shaw", {"head_dim": 4, "max_relative_position": 0}, "max_relative_position"),
        ("shaw", {"head_dim": -4}, "head_dim"),
        ("transformer_xl", {"d_model": 7, "num_heads": 2, "head_dim": 4}, "d_model"),
        ("transformer_xl", {"d_model": 8, "num_heads": 0, "head_dim": 4}, "num_heads"),
        ("transformer_xl", {"d_model": 8, "num_heads": 2, "head_dim": 4, "base": 1.0}, "base"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(name, kwargs, argname):
    with pytest.raises(ValueError, match=argname):
        posenc.create(name, **kwargs)


def test_bad_call_inputs_name_the_argument():
    q, k, v = qkv(3, 3)
    with pytest.raises(ValueError, match="head_dim"):
        posenc.attention(q, k, v, posenc.create("shaw", head_dim=8))
    with pytest.raises(ValueError, match="num_heads"):
        posenc.attention(q, k, v, posenc.create("transformer_xl", d_model=8, num_heads=3, head_dim=D))
    with pytest.raises(ValueError, match="head_dim"):
        posenc.attention(q, k, v, posenc.create("xpos", head_dim=8))
