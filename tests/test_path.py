"""PaTH attention (posenc.encodings.path): against the explicit products of Householder-like
matrices, against a float64 re-implementation of flash-linear-attention's reference
(fla-org/flash-linear-attention @bc3b101, ``fla/ops/path_attn/naive.py``, ``naive_path_attn``;
its decoding step in ``fla/layers/path_attn.py``), gradients, the KV cache and bad inputs."""

import math

import pytest
import torch

import posenc
from posenc.errors import InvalidArgument

D = 8


def _inputs(batch=2, heads=4, kv_heads=None, length=11, d_model=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    enc = posenc.PaTH(d_model, heads, D, num_kv_heads=kv_heads).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    x = torch.randn(batch, length, d_model, generator=gen, dtype=torch.float64)
    kv = kv_heads or heads
    q = torch.randn(batch, heads, length, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(batch, kv, length, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return enc, x, q, k, v


def _householder(w, beta):
    return torch.eye(w.shape[-1], dtype=w.dtype) - beta * torch.outer(w, w)


def _explicit(q, k, v, w, beta, *, order="reference"):
    """softmax(q_i^T H_i ... H_{j+1} k_j / sqrt(D)) v, one product per pair (float64);
    order="reversed": H_{j+1} ... H_i, the wrong order."""
    batch, heads, length, dim = q.shape
    groups = heads // k.shape[1]
    scores = torch.full((batch, heads, length, length), float("-inf"), dtype=q.dtype)
    for b in range(batch):
        for h in range(heads):
            kv = h // groups
            for i in range(length):
                product = torch.eye(dim, dtype=q.dtype)
                for j in range(i, -1, -1):
                    scores[b, h, i, j] = q[b, h, i] @ product @ k[b, kv, j]
                    step = _householder(w[b, kv, j], beta[b, kv, j])
                    product = product @ step if order == "reference" else step @ product
    v = v.repeat_interleave(groups, dim=1)
    return torch.softmax(scores / math.sqrt(dim), dim=-1) @ v


def _kv_values(enc, x):
    """w (B, H_kv, T, D) and beta (B, H_kv, T) per key/value head, from the gates."""
    gates = enc.gate(x)[:, :: enc.num_heads // enc.num_kv_heads]
    return gates[..., :-1], gates[..., -1]


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_equals_the_explicit_products(kv_heads):
    enc, x, q, k, v = _inputs(kv_heads=kv_heads)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    w, beta = _kv_values(enc, x)
    assert (out - _explicit(q, k, v, w, beta)).abs().max() < 1e-12
    # the check sees the product's order: the reversed one is far off
    assert (out - _explicit(q, k, v, w, beta, order="reversed")).abs().max() > 1e-2


def _fla_naive(q, k, v, w, beta, scale, chunk=4):
    """fla's ``naive_path_attn`` (its algorithm, written here in float64, g = 0): within a
    chunk the UT transform by forward substitution, across chunks the query turned by each
    earlier chunk's product, walking left. q (B, HQ, T, D); k, v, w (B, H, T, D); beta (B, H, T)."""
    heads, kv = q.shape[1], k.shape[1]
    k, v, w, beta = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v, w, beta))
    batch, heads, length, dim = q.shape
    pad = (-length) % chunk
    q, k, w = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
    beta = torch.nn.functional.pad(beta, (0, pad))
    total, n = length + pad, (length + pad) // chunk
    wb = w * beta[..., None]

    def split(t):
        return t.reshape(batch, heads, n, chunk, dim)

    qc, kc, wc, wbc = split(q), split(k), split(w), split(wb)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu()
    t_mat = -(wbc @ wc.transpose(-1, -2)).masked_fill(upper, 0)
    for i in range(1, chunk):  # forward substitution: (I + L)^{-1}
        t_mat[..., i, :i] = t_mat[..., i, :i].clone() + (t_mat[..., i, :, None].clone() * t_mat[..., :, :i].clone()).sum(-2)
    t_mat = t_mat + torch.eye(chunk, dtype=q.dtype)
    t_wbk = t_mat @ (wbc @ kc.transpose(-1, -2)).masked_fill(upper, 0)
    qw = (qc @ wc.transpose(-1, -2)).tril()
    t_wb = t_mat @ wbc
    local = (qc @ kc.transpose(-1, -2)).tril() - qw @ t_wbk
    qc = qc - qw @ t_wb
    kc = kc - t_wbk.transpose(-1, -2) @ wc
    chunk_product = wc.transpose(-1, -2) @ t_wb  # I - H_chunk
    scores = torch.zeros(batch, heads, total, total, dtype=q.dtype)
    for a in range(n):
        q_a = qc[:, :, a].clone()
        for b in range(a - 1, -1, -1):
            scores[:, :, a * chunk:(a + 1) * chunk, b * chunk:(b + 1) * chunk] = q_a @ kc[:, :, b].transpose(-1, -2)
            q_a = q_a - q_a @ chunk_product[:, :, b]
        scores[:, :, a * chunk:(a + 1) * chunk, a * chunk:(a + 1) * chunk] = local[:, :, a]
    scores = scores.masked_fill(~torch.ones(total, total, dtype=torch.bool).tril(), float("-inf"))[:, :, :length, :length]
    return torch.softmax(scores * scale, dim=-1) @ v


@pytest.mark.parametrize("kv_heads,length", [(None, 11), (2, 16), (1, 13)])
def test_fla_reference(kv_heads, length):
    enc, x, q, k, v = _inputs(kv_heads=kv_heads, length=length)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    w, beta = _kv_values(enc, x)
    assert (out - _fla_naive(q, k, v, w, beta, 1 / math.sqrt(D))).abs().max() < 1e-12
    # a wrong beta (the reference's 2 sigmoid halved) is seen
    assert (out - _fla_naive(q, k, v, w, beta / 2, 1 / math.sqrt(D))).abs().max() > 1e-3


def test_gate_is_the_reference_layer():
    """fla's ``PaTHAttention``: w = l2_norm(w_proj(x)) (low-rank, no bias), beta = 2 sigmoid(bt_proj(x))."""
    enc, x, *_ = _inputs(kv_heads=2)
    low, high = enc.w_proj[0].weight, enc.w_proj[1].weight
    w = (x @ low.T @ high.T).view(2, 11, 2, D)
    w = w / torch.sqrt(w.square().sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(x @ enc.bt_proj.weight.T + enc.bt_proj.bias)
    gates = enc.gate(x)
    assert gates.shape == (2, 4, 11, D + 1)
    for h in range(4):  # query head h reads key/value head h // 2
        assert torch.allclose(gates[:, h, :, :D], w[:, :, h // 2], atol=1e-14)
        assert torch.allclose(gates[:, h, :, D], beta[..., h // 2], atol=1e-14)


def test_decoding_equals_the_reference_recurrence_and_the_full_pass():
    """The reference's decoding turns every cached key by the new token's H; posenc keeps the
    raw keys and the gates. Both, token by token, equal the full pass."""
    enc, x, q, k, v = _inputs(batch=1, length=10)
    gates = enc.gate(x)
    full = posenc.attention(q, k, v, enc, gates=gates)
    w, beta = _kv_values(enc, x)
    turned = k[:, :, :0]
    for t in range(10):
        out = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, gates=gates[:, :, :t + 1])
        assert (out - full[:, :, t:t + 1]).abs().max() < 1e-12
        # the reference: past_k <- past_k - beta (past_k . w) w, then the new raw key appended
        wt, bt = w[:, :, t:t + 1], beta[:, :, t:t + 1, None]
        turned = turned - bt * (turned * wt).sum(-1, keepdim=True) * wt
        turned = torch.cat((turned, k[:, :, t:t + 1]), dim=2)
        logits = (q[:, :, t:t + 1] @ turned.transpose(-1, -2)) / math.sqrt(D)
        assert (torch.softmax(logits, -1) @ v[:, :, :t + 1] - full[:, :, t:t + 1]).abs().max() < 1e-12


def test_bad_inputs():
    enc, x, q, k, v = _inputs(length=5)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x), causal=False)
    with pytest.raises(InvalidArgument, match=r"\(B, H, Tk, F\)"):
        posenc.attention(q, k, v, enc, gates=enc.gate(x)[..., 0])
    with pytest.raises(InvalidArgument, match="gates"):
        posenc.attention(q, k, v, enc)
    with pytest.raises(InvalidArgument, match="num_kv_heads"):
        posenc.PaTH(32, 4, D, num_kv_heads=3)
    with pytest.raises(InvalidArgument, match="causal"):
        posenc.create_for_model("path", d_model=32, num_heads=4, head_dim=8, max_positions=64, causal=False)
    with pytest.raises(InvalidArgument, match="w_rank"):
        posenc.PaTH(32, 4, D, w_rank=0)
    with pytest.raises(InvalidArgument, match="d_model"):
        enc.gate(x[..., :16])


def test_path_fox_is_the_reference_with_its_gate_inside_the_scale():
    """fla's PaTH-FoX (``use_forget_gate``): the gate cumsums join q.k before the scale (its
    naive reference: ``A + g_cumsum_i - g_cumsum_j``, then ``* scale``)."""
    gen = torch.Generator().manual_seed(3)
    enc = posenc.PaTH(32, 4, D, num_kv_heads=2, forget_gate=True).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    x = torch.randn(2, 10, 32, generator=gen, dtype=torch.float64)
    q = torch.randn(2, 4, 10, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 10, D, generator=gen, dtype=torch.float64) for _ in range(2))
    gates = enc.gate(x)
    assert gates.shape == (2, 4, 10, D + 2)
    out = posenc.attention(q, k, v, enc, gates=gates)
    log_f = torch.nn.functional.logsigmoid(x @ enc.g_proj.weight.T + enc.g_proj.bias).transpose(1, 2)  # (B, H, T)
    assert torch.allclose(gates[..., -1], log_f, atol=1e-14)
    w, beta = gates[:, ::2, :, :D], gates[:, ::2, :, D]
    c = log_f.cumsum(-1)
    scale = 1 / math.sqrt(D)
    heads = 4
    k4, v4, w4, b4 = (t.repeat_interleave(2, dim=1) for t in (k, v, w, beta))
    scores = torch.full((2, heads, 10, 10), float("-inf"), dtype=torch.float64)
    for b in range(2):
        for h in range(heads):
            for i in range(10):
                product = torch.eye(D, dtype=torch.float64)
                for j in range(i, -1, -1):
                    scores[b, h, i, j] = (q[b, h, i] @ product @ k4[b, h, j] + c[b, h, i] - c[b, h, j]) * scale
                    product = product @ _householder(w4[b, h, j], b4[b, h, j])
    assert (out - torch.softmax(scores, -1) @ v4).abs().max() < 1e-12
    # FoX's convention (the gate after the scale) is a different model: seen
    after = scores + (1 - scale) * (c[..., :, None] - c[..., None, :])
    assert (out - torch.softmax(after, -1) @ v4).abs().max() > 1e-3
    # the KV cache: one token at a time equals the full pass
    for t in (0, 5, 9):
        step = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, gates=gates[:, :, :t + 1])
        assert (step - out[:, :, t:t + 1]).abs().max() < 1e-12


def _shortconv_inputs(kv_heads=2, length=12, seed=4):
    gen = torch.Generator().manual_seed(seed)
    enc = posenc.PaTH(32, 4, D, num_kv_heads=kv_heads, w_shortconv=True).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    x = torch.randn(2, length, 32, generator=gen, dtype=torch.float64)
    q = torch.randn(2, 4, length, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, kv_heads, length, D, generator=gen, dtype=torch.float64) for _ in range(2))
    return enc, x, q, k, v


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_short_convolution_is_the_reference_layers(kv_heads):
    """fla's ``PaTHAttention`` with ``use_w_shortconv`` (its default), training path: w_proj, then
    ``ShortConvolution(kv_dim, 3)`` (nn.Conv1d depthwise, padding 2, the first T outputs, SiLU),
    then l2_norm, then the transforms; here the explicit products on that w."""
    enc, x, q, k, v = _shortconv_inputs(kv_heads)
    out = posenc.attention(q, k, v, enc, gates=enc.gate(x))
    conv = torch.nn.functional.conv1d(enc.w_proj(x).transpose(1, 2), enc.w_conv1d.weight, padding=2,
                                      groups=enc.w_conv1d.weight.shape[0])[..., :12]
    w = torch.nn.functional.silu(conv).transpose(1, 2).reshape(2, 12, kv_heads, D)
    w = (w / torch.sqrt(w.square().sum(-1, keepdim=True) + 1e-6)).transpose(1, 2)
    beta = (2 * torch.sigmoid(x @ enc.bt_proj.weight.T + enc.bt_proj.bias)).transpose(1, 2)
    assert (out - _explicit(q, k, v, w, beta)).abs().max() < 1e-12
    # without the convolution it is another model: the check sees it
    plain = posenc.PaTH(32, 4, D, num_kv_heads=kv_heads).double()
    plain.load_state_dict({n: t for n, t in enc.state_dict().items() if "conv" not in n})
    assert (posenc.attention(q, k, v, plain, gates=plain.gate(x)) - out).abs().max() > 1e-3


def test_short_convolution_decodes_token_by_token_and_trains():
    enc, x, q, k, v = _shortconv_inputs(length=9)
    gates = enc.gate(x)
    full = posenc.attention(q, k, v, enc, gates=gates)
    for t in range(9):
        step = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, gates=gates[:, :, :t + 1])
        assert (step - full[:, :, t:t + 1]).abs().max() < 1e-12
    full.square().sum().backward()
    assert enc.w_conv1d.weight.grad is not None and enc.w_conv1d.weight.grad.abs().max() > 0
    small, *_ = _shortconv_inputs(length=5)
    g = small.gate(x[:1, :5]).detach().requires_grad_()
    qs, ks, vs = (t[:1, :, :5].clone().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v, g: posenc.attention(q, k, v, small, gates=g), (qs, ks, vs, g))
    with pytest.raises(InvalidArgument, match="w_shortconv"):
        posenc.PaTH(32, 4, D, w_shortconv=1)
