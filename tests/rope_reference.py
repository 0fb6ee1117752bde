"""Independent float64 references for the RoPE scalings: explicit loops, the math module only."""

from __future__ import annotations

import math


def ref_default(d, b):
    return [b ** (-(2 * i) / d) for i in range(d // 2)]


def _yarn_bounds(d, b, sc, truncate):
    """YaRN's ramp bounds (low, high) over the pairs: the correction dimensions of beta_fast and
    beta_slow (YaRN eq. 17 solved for the dimension), rounded out when ``truncate``, clamped to
    [0, d - 1], high nudged by 0.001 when they meet (every reference's guard)."""
    L0 = sc["original_max_position_embeddings"]

    def dim_of(r):
        return d * math.log(L0 / (r * 2 * math.pi)) / (2 * math.log(b))

    lo, hi = dim_of(sc.get("beta_fast") or 32), dim_of(sc.get("beta_slow") or 1)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    return lo, (hi + 0.001 if lo == hi else hi)


def ref_inv_freq(d, b, sc, seq_len=None):
    """(inv_freq list, attention_factor), each rope_type's formula from its paper / HF doc."""
    t = sc.get("rope_type", sc.get("type"))
    theta = ref_default(d, b)
    if t == "linear":
        return [x / sc["factor"] for x in theta], 1.0
    if t == "ntk":
        return ref_default(d, b * sc["factor"] ** (d / (d - 2))), 1.0
    if t == "dynamic":
        L0 = sc["original_max_position_embeddings"]
        L = L0 if seq_len is None else max(seq_len, L0)
        s = sc["factor"]
        return ref_default(d, b * (s * L / L0 - (s - 1)) ** (d / (d - 2))), 1.0
    if t == "dynamic_yarn":
        # YaRN (below) at the factor of the current length, s = max(1, L / L0); plain RoPE within L0
        L0 = sc["original_max_position_embeddings"]
        if seq_len is None or seq_len <= L0:
            return theta, 1.0
        keys = ("beta_fast", "beta_slow", "truncate")
        return ref_inv_freq(d, b, {"rope_type": "yarn", "factor": seq_len / L0, "original_max_position_embeddings": L0,
                                   **{k: sc[k] for k in keys if k in sc}})
    if t == "yarn":
        s = sc["factor"]
        lo, hi = _yarn_bounds(d, b, sc, sc.get("truncate", True))
        out = []
        for i in range(d // 2):
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            out.append(theta[i] / s * ramp + theta[i] * (1 - ramp))
        if sc.get("attention_factor") is not None:
            af = sc["attention_factor"]
        elif sc.get("mscale") and sc.get("mscale_all_dim"):
            af = (0.1 * sc["mscale"] * math.log(s) + 1) / (0.1 * sc["mscale_all_dim"] * math.log(s) + 1)
        else:
            af = 0.1 * math.log(s) + 1 if s > 1 else 1.0
        return out, af
    if t in ("yarn_log", "telechat3_yarn"):
        # vLLM's grok1_scaling_rope.py (yarn_log) and telechat3_scaling_rope.py, line by line in float64
        s = sc["factor"]
        lo, hi = _yarn_bounds(d, b, sc, t == "yarn_log" or sc.get("truncate", True))
        out = []
        for i in range(d // 2):
            extrapolation, interpolation = theta[i], 1.0 / (s * (b ** (2 * i / d)))
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            if t == "telechat3_yarn":
                out.append(interpolation * ramp + extrapolation * (1 - ramp))
                continue
            mask = (1 - ramp) * sc.get("extrapolation_factor", 1.0)
            out.append(math.exp(math.log(extrapolation) * mask + math.log(interpolation) * (1.0 - mask)))
        if t == "yarn_log":
            return out, 1.0  # the reference's cos / sin are not multiplied by its mscale
        return out, (0.07 * math.log(s) + 1.0 if s > 1 else 1.0)
    if t == "theta_scale":
        s, L0 = sc["factor"], sc["original_max_position_embeddings"]
        new_base = b ** (math.log(L0 * s / (2 * math.pi)) / math.log(L0 / (2 * math.pi)))
        return [1.0 / new_base ** (2 * i / d) for i in range(d // 2)], 1.0
    if t == "llama3":
        s, lo, hi, L0 = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], sc["original_max_position_embeddings"]
        out = []
        for x in theta:
            lam = 2 * math.pi / x
            if lam < L0 / hi:
                out.append(x)
            elif lam > L0 / lo:
                out.append(x / s)
            else:
                sm = (L0 / lam - lo) / (hi - lo)
                out.append((1 - sm) * x / s + sm * x)
        return out, 1.0
    if t == "longrope":
        L0 = sc["original_max_position_embeddings"]
        ext = sc["long_factor"] if seq_len is not None and seq_len > L0 else sc["short_factor"]
        af = sc.get("attention_factor")
        if af is None:
            s = sc["factor"]
            af = math.sqrt(1 + math.log(s) / math.log(L0)) if s > 1 else 1.0
        return [x / e for x, e in zip(theta, ext)], af
    raise AssertionError(t)


def xpos_reference_score(qv, kv, n, m, scale_base=512.0):
    """xPos (Sun et al. 2022): the float64 score of one (query n, key m) pair in its relative
    form zeta_p^((n-m)/B) R((n-m) theta_p), half-split pairs (p, p + D/2), never large."""
    d = qv.shape[-1]
    half, delta, total = d // 2, n - m, 0.0
    for p in range(half):
        theta, zeta = 10000.0 ** (-2.0 * p / d), (2.0 * p / d + 0.4) / 1.4
        c, s, decay = math.cos(delta * theta), math.sin(delta * theta), zeta ** (delta / scale_base)
        a, b, x, y = (float(t) for t in (qv[p], qv[p + half], kv[p], kv[p + half]))
        total += decay * ((a * x + b * y) * c + (a * y - b * x) * s)
    return total


L0 = 16
#: One valid dict per rope_type at rotary dim 8: a new rope_type must add one here.
SAMPLES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": L0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "dynamic_yarn": {"rope_type": "dynamic_yarn", "factor": 4.0, "original_max_position_embeddings": L0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": L0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0],
                 "original_max_position_embeddings": L0, "factor": 8.0},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
    "freq_factors": {"rope_type": "freq_factors", "freq_factors": [1.0, 1.5, 4.0, 8.0], "attention_factor": 1.25},
    "yarn_log": {"rope_type": "yarn_log", "factor": 4.0, "original_max_position_embeddings": L0},
    "theta_scale": {"rope_type": "theta_scale", "factor": 4.0, "original_max_position_embeddings": L0},
    "telechat3_yarn": {"rope_type": "telechat3_yarn", "factor": 4.0, "original_max_position_embeddings": L0},
}
