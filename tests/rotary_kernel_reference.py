"""The float64 reference of the fused RoPE kernel's tests (CPU under the interpreter, and CUDA):
the formula pair by pair in float64, and the bound "the float64 value rounded to the dtype"."""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps


def partner_index(d: int, r: int, interleaved: bool) -> torch.Tensor:
    """For each of the D dimensions, the other member of its pair (itself past r)."""
    idx = torch.arange(d)
    if interleaved:
        idx[:r] = idx[:r] ^ 1
    else:
        idx[: r // 2] += r // 2
        idx[r // 2 : r] -= r // 2
    return idx


def angles64(positions, inv_freq, pair_axis=None):
    """float64 angles (..., T, P): positions (T,), (B, T), or (A, T) / (A, B, T) with pair_axis."""
    freq = inv_freq.double()
    if pair_axis is None:
        return positions.double().unsqueeze(-1) * freq
    rows = positions.double()[pair_axis]  # (P, T) or (P, B, T)
    return rows.movedim(0, -1) * freq


def rotate64(x, angle, interleaved, attention_factor=1.0, inverse=False):
    """x (B, H, T, D) rotated pair by pair in float64; angle (T, P) or (B, T, P); tail unchanged."""
    x = x.double()
    if angle.dim() == 3:
        angle = angle.unsqueeze(1)
    r = 2 * angle.shape[-1]
    cos, sin = angle.cos() * attention_factor, angle.sin() * attention_factor
    if inverse:
        sin = -sin
    out = x.clone()
    a_idx = torch.arange(0, r, 2) if interleaved else torch.arange(r // 2)
    b_idx = a_idx + 1 if interleaved else a_idx + r // 2
    xa, xb = x[..., a_idx], x[..., b_idx]
    out[..., a_idx] = xa * cos - xb * sin
    out[..., b_idx] = xb * cos + xa * sin
    return out


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at |v| (float64), subnormals included."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(v.abs().clamp_min(info.tiny))
    return torch.ldexp(torch.full_like(v, info.eps), exponent - 1)


def assert_rounded(out, expected, x, interleaved, r, dtype, attention_factor=1.0):
    """out is expected (float64) rounded to dtype, within the compute dtype's arithmetic error."""
    assert out.dtype == dtype and out.shape == expected.shape
    compute_eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    x = x.double()
    pair_sum = x.abs() + x[..., partner_index(x.shape[-1], r, interleaved)].abs()
    arithmetic = 2 * compute_eps * max(1.0, abs(attention_factor)) * pair_sum
    arithmetic[..., r:] = 0  # the tail passes through exactly
    bound = ulp(expected.abs() + arithmetic, dtype) / 2 + arithmetic
    err = (out.double() - expected).abs()
    worst = (err - bound).max()
    assert worst <= 0, f"off by more than the rounding of {dtype}: max excess {float(worst):.3g}, max err {float(err.max()):.3g}"


def frequencies(r: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)


def case(dtype, *, B=2, H=4, H_kv=2, Tq=5, Tk=7, D=16, seed=0, device="cpu"):
    """q (B, H, Tq, D), k (B, H_kv, Tk, D) of values of a few units; q positions per row (B, Tq),
    k positions shared (Tk,), up to 2^20."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, H, Tq, D, generator=g) * 3).to(dtype)
    k = (torch.randn(B, H_kv, Tk, D, generator=g) * 3).to(dtype)
    q_pos = torch.randint(0, 1 << 20, (B, Tq), generator=g)
    k_pos = torch.randint(0, 1 << 20, (Tk,), generator=g)
    return tuple(t.to(device) for t in (q, k, q_pos, k_pos))


