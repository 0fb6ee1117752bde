"""``posenc.attention(..., softcap=, sinks=)`` against a float64 reference written here from the
Hugging Face formulas (Gemma 2's soft-capping, gpt-oss's sinks), on every backend that serves
them, with and without grouped-query heads, causal or not, with a user mask, KV-cache-aligned
positions, rows with no visible key, ALiBi and RoPE; gradients for q, k, v and the sinks; the
branch-merge backends; the refusals by name; and the real transformers functions.

The reference (:func:`reference`) is the textbook computation: scores, bias added, capped,
masked, softmax over [scores, s_h] with the sink column dropped. It never calls posenc.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

import posenc
from posenc.attention import tiling
from posenc.encodings import branched
from posenc.errors import InvalidArgument

B, H, D = 2, 4, 8
SOFTCAP = 1.5  # small enough that tanh bends the scores (|s| reaches a few units below)


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE in float64 (Su et al. 2021, Hugging Face's rotate_half layout)."""
    inv_freq = base ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float64) / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def reference(q, k, v, *, causal=True, mask=None, softcap=None, sinks=None, bias=None, scale=None):
    """float64: q (B, H, Tq, D), k, v (B, H_kv, Tk, D); mask broadcastable bool (True = may attend);
    bias (H, Tq, Tk); sinks (H,). A row without a visible key gives zeros."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    tq, tk = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.double()
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        allowed = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + (tk - tq)
    if mask is not None:
        allowed = allowed & mask
    allowed = allowed.expand(scores.shape)
    scores = scores.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        column = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    probs = torch.where(allowed.any(-1, keepdim=True), probs, 0.0)
    return probs @ v


def inputs(tq=6, tk=9, kv_heads=H, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, tq, D, generator=g) * spread
    k = torch.randn(B, kv_heads, tk, D, generator=g) * spread
    v = torch.randn(B, kv_heads, tk, D, generator=g)
    sinks = torch.randn(H, generator=g) * 2
    return q, k, v, sinks


def padding_mask(tq, tk):
    """(B, 1, Tq, Tk): row 0 keeps everything; row 1 hides its first two keys (left padding) and
    its first query sees nothing at all."""
    mask = torch.ones(B, 1, tq, tk, dtype=torch.bool)
    mask[1, :, :, :2] = False
    mask[1, :, 0, :] = False
    return mask


# ----------------------------------------------------------------- the reference can fail


def test_the_reference_differs_from_plain_softmax():
    q, k, v, sinks = inputs()
    plain = reference(q, k, v)
    assert (reference(q, k, v, softcap=SOFTCAP) - plain).abs().max() > 0.1
    assert (reference(q, k, v, sinks=sinks) - plain).abs().max() > 0.1


def test_the_reference_matches_transformers():
    """The test's reference is the transformers eager functions' (Gemma 2, gpt-oss), GQA included."""
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    q, k, v, sinks = inputs(tq=7, tk=7, kv_heads=2)
    q, k, v, sinks = q.double(), k.double(), v.double(), sinks.double()
    additive = torch.zeros(7, 7, dtype=torch.float64).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
    module = types.SimpleNamespace(training=False, num_key_value_groups=2, head_dim=D, sinks=sinks)
    hf_cap, _ = gemma2.eager_attention_forward(module, q, k, v, additive, scaling=D ** -0.5, softcap=SOFTCAP)
    hf_sink, _ = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=D ** -0.5)
    torch.testing.assert_close(hf_cap.transpose(1, 2), reference(q, k, v, softcap=SOFTCAP))
    torch.testing.assert_close(hf_sink.transpose(1, 2), reference(q, k, v, sinks=sinks))


# ----------------------------------------------------------------- forward on every backend

SERVES = {  # backend -> (softcap, sinks)
    "eager": (True, True),
    "sdpa": (False, True),
    "blocked": (True, True),
    "flex": (True, True),
}


def cases():
    for backend, (caps, sinks) in SERVES.items():
        for use_cap, use_sinks in ((True, False), (False, True), (True, True)):
            if (use_cap and not caps) or (use_sinks and not sinks):
                continue
            yield backend, use_cap, use_sinks


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocked runs several query blocks even at these sizes."""
    monkeypatch.setattr(tiling, "BLOCKED_TILE_ELEMENTS", 40)
    monkeypatch.setattr(tiling, "BLOCKED_VIEW_ROWS", 2)


@pytest.mark.parametrize("backend,use_cap,use_sinks", list(cases()))
@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("causal,tq,with_mask", [(True, 9, False), (True, 4, False), (False, 6, False), (True, 4, True),
                                                  (False, 9, True)])
def test_forward_matches_the_reference(backend, use_cap, use_sinks, kv_heads, causal, tq, with_mask, small_blocks):
    tk = 9
    q, k, v, sinks = inputs(tq, tk, kv_heads)
    mask = padding_mask(tq, tk) if with_mask else None
    kwargs = {"softcap": SOFTCAP if use_cap else None, "sinks": sinks if use_sinks else None}
    with torch.no_grad():
        got = posenc.attention(q, k, v, causal=causal, mask=mask, backend=backend, **kwargs)
    want = reference(q, k, v, causal=causal, mask=mask, **kwargs)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
    if with_mask:
        assert (got[1, :, 0] == 0).all(), "a row with no visible key gives zeros"


@pytest.mark.parametrize("backend", ["eager", "blocked", "flex", "sdpa"])
def test_alibi_bias_is_capped_after_it_is_added(backend, small_blocks):
    """The soft-cap applies to the biased score (ALiBi: m_h (k - q), Press et al.), KV cache aligned."""
    tq, tk = 5, 11
    q, k, v, sinks = inputs(tq, tk)
    alibi = posenc.create("alibi", num_heads=H)
    slopes = posenc.alibi_slopes(H).double()
    qpos, kpos = torch.arange(tk - tq, tk), torch.arange(tk)
    bias = slopes.view(-1, 1, 1) * (kpos[None, None, :] - qpos[None, :, None]).double()
    cap = None if backend == "sdpa" else SOFTCAP
    with torch.no_grad():
        got = posenc.attention(q, k, v, alibi, backend=backend, softcap=cap, sinks=sinks)
    torch.testing.assert_close(got.double(), reference(q, k, v, bias=bias, softcap=cap, sinks=sinks), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", ["eager", "blocked", "flex", "sdpa"])
def test_rope_with_softcap_and_sinks(backend, small_blocks):
    tq, tk = 4, 10
    q, k, v, sinks = inputs(tq, tk, kv_heads=2)
    rope = posenc.create("rope", head_dim=D)
    qpos, kpos = torch.arange(tk - tq, tk), torch.arange(tk)
    cap = None if backend == "sdpa" else SOFTCAP
    with torch.no_grad():
        got = posenc.attention(q, k, v, rope, backend=backend, softcap=cap, sinks=sinks)
    want = reference(rope_rotate(q.double(), qpos), rope_rotate(k.double(), kpos), v, softcap=cap, sinks=sinks)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def test_auto_serves_softcap_and_sinks():
    q, k, v, sinks = inputs()
    with torch.no_grad():
        got = posenc.attention(q, k, v, softcap=SOFTCAP, sinks=sinks)
    torch.testing.assert_close(got.double(), reference(q, k, v, softcap=SOFTCAP, sinks=sinks), atol=2e-5, rtol=2e-5)


# ----------------------------------------------------------------- gradients


def reference_grads(q, k, v, sinks, **kwargs):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    out = reference(*leaves[:3], sinks=leaves[3], **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)
    (out * weights).sum().backward()
    return [t.grad for t in leaves]


def posenc_grads(q, k, v, sinks, *, backend, encoding=None, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    out = posenc.attention(*leaves[:3], encoding, sinks=leaves[3], backend=backend, **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)
    (out * weights.to(out.dtype)).sum().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("with_mask", [False, True])
def test_gradients_match_the_reference(backend, kv_heads, with_mask, small_blocks):
    tq, tk = 5, 9
    q, k, v, sinks = inputs(tq, tk, kv_heads)
    q, k, v, sinks = q.double(), k.double(), v.double(), sinks.double()
    mask = padding_mask(tq, tk) if with_mask else None
    cap = None if backend == "sdpa" else SOFTCAP
    got = posenc_grads(q, k, v, sinks, backend=backend, softcap=cap, mask=mask)
    want = reference_grads(q, k, v, sinks, softcap=cap, mask=mask)
    for name, g, w in zip(["q", "k", "v", "sinks"], got, want):
        torch.testing.assert_close(g, w, atol=1e-9, rtol=1e-7, msg=f"d{name} on {backend}")


def test_blocked_gradient_through_a_learned_bias_and_the_cap(small_blocks):
    """T5's learned table gets its gradient through the cap on blocked as on eager (the eager
    backend is checked against the reference above)."""
    q, k, v, sinks = (t.double() for t in inputs(5, 9))
    grads = {}
    for backend in ("eager", "blocked"):
        torch.manual_seed(0)  # the same table for both
        t5 = posenc.create("t5", num_heads=H).double()
        out = posenc.attention(q, k, v, t5, backend=backend, softcap=SOFTCAP, sinks=sinks)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)).sum().backward()
        grads[backend] = next(p.grad for p in t5.parameters())
    assert grads["eager"].abs().max() > 0
    torch.testing.assert_close(grads["blocked"], grads["eager"], atol=1e-10, rtol=1e-8)


def test_flex_sinks_gradient_on_the_cpu():
    """On the CPU torch's FlexAttention has no q, k, v backward; the sinks' gradient still flows."""
    q, k, v, sinks = (t.double() for t in inputs(5, 9))
    leaf = sinks.clone().requires_grad_()
    out = posenc.attention(q, k, v, backend="flex", softcap=SOFTCAP, sinks=leaf)
    (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)).sum().backward()
    want = reference_grads(q, k, v, sinks, softcap=SOFTCAP)[3]
    torch.testing.assert_close(leaf.grad, want, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("path", ["merged_lse", "sink_key"])
@pytest.mark.parametrize("causal,tq", [(True, 9), (True, 5), (False, 5)])
def test_sdpa_sinks_on_both_of_its_paths(path, causal, tq):
    """sdpa's two ways to the sinks: the CPU kernel's log-sum-exp when only the sinks need a
    gradient, the extra key when q, k or v do; both against the reference, sinks' gradient too."""
    q, k, v, sinks = (t.double() for t in inputs(tq, 9, kv_heads=2))
    if path == "sink_key":
        q = q.clone().requires_grad_()
    leaf = sinks.clone().requires_grad_()
    mask = padding_mask(tq, 9)
    out = posenc.attention(q, k, v, backend="sdpa", causal=causal, mask=mask, sinks=leaf)
    torch.testing.assert_close(out.detach(), reference(q.detach(), k, v, causal=causal, mask=mask, sinks=sinks),
                               atol=1e-9, rtol=1e-7)
    (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view(out.shape)).sum().backward()
    want = reference_grads(q, k, v, sinks, causal=causal, mask=mask)[3]
    torch.testing.assert_close(leaf.grad, want, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked", "auto"])
def test_sinks_with_a_value_head_narrower_than_the_query_head(backend, small_blocks):
    """MiMo-V2-Flash and Hy V4 attend with value heads narrower than their query heads; torch's
    CPU flash kernel (sdpa's merged log-sum-exp path) refuses that, so sdpa takes its sink key."""
    q, k, v, sinks = inputs(6, 9, kv_heads=2)
    v = v[..., : D // 2].contiguous()
    with torch.no_grad():
        got = posenc.attention(q, k, v, causal=True, sinks=sinks, backend=backend)
    assert got.shape[-1] == D // 2
    torch.testing.assert_close(got.double(), reference(q, k, v, causal=True, sinks=sinks), atol=2e-5, rtol=2e-5)


# ----------------------------------------------------------------- branch-merge attention


def branched_reference(encoding, q, k, v, *, mask=None, softcap=None, sinks=None):
    """The map's branches evaluated one by one in float64: per branch, RoPE at the branch's
    positions, capped scores, its keys; one softmax over the union (and the sink)."""
    tq, tk = q.shape[2], k.shape[2]
    groups = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    logits = torch.full((q.shape[0], q.shape[1], tq, tk), -math.inf, dtype=torch.float64)
    for branch in encoding.map.branches(tq, tk):
        qr, kr = rope_rotate(q.double(), branch.q_positions), rope_rotate(k, branch.k_positions)
        scores = qr @ kr.transpose(-1, -2) * D ** -0.5
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        logits = torch.where(branch.key_mask, scores, logits)
    if mask is not None:
        logits = logits.masked_fill(~mask, -math.inf)
    if sinks is not None:
        column = sinks.double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        probs = torch.softmax(torch.cat([logits, column], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(logits, -1)
    probs = torch.where(torch.isfinite(logits).any(-1, keepdim=True), probs, 0.0)
    return probs @ v


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked", "flex"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_branches_take_softcap_sinks_and_a_padding_mask(backend, with_mask):
    tq, tk = 4, 12
    q, k, v, sinks = inputs(tq, tk, kv_heads=2)
    encoding = branched(None, "self_extend", head_dim=D, group_size=2, neighbor_window=3)
    mask = padding_mask(tq, tk) if with_mask else None
    cap = None if backend == "sdpa" else SOFTCAP
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding, backend=backend, mask=mask, softcap=cap, sinks=sinks)
        plain = posenc.attention(q, k, v, encoding, backend=backend, mask=mask)
    want = branched_reference(encoding, q, k, v, mask=mask, softcap=cap, sinks=sinks)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(plain.double(), branched_reference(encoding, q, k, v, mask=mask), atol=2e-5, rtol=2e-5)
    if with_mask:
        assert (got[1, :, 0] == 0).all()


@pytest.mark.parametrize("backend", ["eager", "blocked"])
def test_branch_gradients_reach_the_sinks(backend):
    q, k, v, sinks = (t.double() for t in inputs(4, 12, kv_heads=2))
    encoding = branched(None, "self_extend", head_dim=D, group_size=2, neighbor_window=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = posenc.attention(*leaves[:3], encoding, backend=backend, softcap=SOFTCAP, sinks=leaves[3])
    out.sum().backward()
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    branched_reference(encoding, *ref_leaves[:3], softcap=SOFTCAP, sinks=ref_leaves[3]).sum().backward()
    for name, g, w in zip(["q", "k", "v", "sinks"], leaves, ref_leaves):
        torch.testing.assert_close(g.grad, w.grad, atol=1e-9, rtol=1e-7, msg=f"d{name} on {backend}")


# ----------------------------------------------------------------- refusals


def test_sdpa_refuses_softcap_by_name():
    q, k, v, _ = inputs()
    with pytest.raises(InvalidArgument, match="sdpa.*softcap"):
        posenc.attention(q, k, v, backend="sdpa", softcap=SOFTCAP)
    encoding = branched(None, "self_extend", head_dim=D, group_size=2, neighbor_window=3)
    with pytest.raises(InvalidArgument, match="sdpa.*softcap"):
        posenc.attention(q, k, v, encoding, backend="sdpa", softcap=SOFTCAP)


def test_flash_attention_2_refuses_sinks_and_capped_alibi(monkeypatch):
    from posenc.attention import flash_attention_2
    monkeypatch.setattr(flash_attention_2, "flash_attn_func", lambda: object)
    alibi = posenc.create("alibi", num_heads=H)
    assert "sinks" in flash_attention_2.unsupported(None, sinks=torch.zeros(H))
    assert "softcap" in flash_attention_2.unsupported(alibi, softcap=SOFTCAP)
    assert flash_attention_2.unsupported(None, softcap=SOFTCAP) is None
    q, k, v, _ = inputs()
    arguments = flash_attention_2.flash_attn_arguments(q, k, v, slopes=None, causal=True, scale=0.3, softcap=SOFTCAP)
    assert arguments["softcap"] == SOFTCAP
    assert "softcap" not in flash_attention_2.flash_attn_arguments(q, k, v, slopes=None, causal=True, scale=0.3)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "50"])
def test_bad_softcap_is_named(bad):
    q, k, v, _ = inputs()
    with pytest.raises(InvalidArgument, match="softcap"):
        posenc.attention(q, k, v, softcap=bad)


@pytest.mark.parametrize("bad,error", [(torch.zeros(H + 1), ValueError), (torch.zeros(1, H), ValueError),
                                       (torch.zeros(H, dtype=torch.long), TypeError), ([0.0] * H, TypeError)])
def test_bad_sinks_are_named(bad, error):
    q, k, v, _ = inputs()
    with pytest.raises(error, match="sinks"):
        posenc.attention(q, k, v, sinks=bad)
