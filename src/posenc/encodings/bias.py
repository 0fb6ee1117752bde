"""Score-bias encodings: a per-head scalar b(h, i, j) added to the attention logits.

Each encoding writes its math once, as :meth:`ScoreBias.bias`, an elementwise function of
(query position, key position, head) on broadcastable tensors, and says whether it depends on
the distance only (:attr:`~posenc.PositionalEncoding.translation_invariant`). Every other form
is derived from that one function: :meth:`ScoreBias.score_bias` materializes it,
:meth:`~posenc.PositionalEncoding.score_mod` is the FlexAttention form, and the attention
layer evaluates it in tiles of its own choosing.

Conventions: relative position = key - query (T5); the bias is added *after* the 1/sqrt(D)
scaling of q.k and is not itself scaled (ALiBi, Press et al. 2022, section 3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import PositionalEncoding
from .._validation import broadcast_shape, check_bool, check_number, check_positive_int


def _wide(parameter: Tensor) -> torch.dtype:
    """The dtype a bias is computed in: float32, or float64 for an encoding converted to
    float64 (``.double()``), so that float64 inputs get float64 arithmetic throughout."""
    return torch.promote_types(parameter.dtype, torch.float32)


class ScoreBias(PositionalEncoding):
    """Base for encodings that only add b(h, i, j) to the logits. Subclasses define
    :attr:`num_heads`, :meth:`bias` and, when true, ``translation_invariant = True``."""

    hooks = frozenset({"score_bias"})
    num_heads: int

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias: (Tq,), (Tk,) -> (H, Tq, Tk); (B, Tq), (B, Tk) -> (B, H, Tq, Tk), float32
        (float64 for an encoding converted with ``.double()``), :meth:`bias` on every (head,
        query, key): a new tensor nothing else references."""
        self.prepare_bias()
        q = q_positions.unsqueeze(-1).unsqueeze(-3)  # (..., 1, Tq, 1)
        k = k_positions.unsqueeze(-2).unsqueeze(-3)  # (..., 1, 1, Tk)
        head = torch.arange(self.num_heads, device=q_positions.device).view(-1, 1, 1)
        bias = self.bias(q, k, head)
        full = broadcast_shape(q.shape, k.shape, head.shape)
        return bias if bias.shape == full else bias.expand(full).contiguous()


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al., ICLR 2022, section 3), float32 (num_heads,).

    For n a power of two, m_h = 2^(-8h/n), h = 1..n (a geometric sequence starting at
    2^(-8/n)). Otherwise, with n0 = 2^floor(log2 n): the n0 slopes of the n0-head set,
    followed by every other slope of the 2*n0-head set (the odd h, 2^(-8h/(2 n0))) until
    there are n.

    Raises:
        ValueError: ``num_heads`` is not an integer >= 1.
    """
    check_positive_int(num_heads, "num_heads")
    n0 = 2 ** int(math.floor(math.log2(num_heads)))
    exponents = [-8.0 * h / n0 for h in range(1, n0 + 1)]
    exponents += [-8.0 * h / (2 * n0) for h in range(1, 2 * (num_heads - n0), 2)]
    return torch.tensor([2.0**e for e in exponents], dtype=torch.float64).to(torch.float32)


class ALiBi(ScoreBias):
    """Attention with Linear Biases (Press et al., ICLR 2022, section 3).

    b(h, i, j) = -m_h * (i - j) for the causal form (valid under a causal mask, where
    j <= i), or -m_h * |i - j| for the symmetric form used by bidirectional encoders;
    i, j are absolute query and key positions (flash-attn's bottom-right alignment follows
    from explicit positions).

    Args:
        num_heads: H; slopes from :func:`alibi_slopes`.
        bidirectional: the symmetric form -m|i - j|; default False (causal form).

    Hook: ``score_bias``. No parameters.
    """

    name = "alibi"
    translation_invariant = True

    def __init__(self, num_heads: int, *, bidirectional: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, num_layers=1, **kwargs):
        kwargs.setdefault("bidirectional", not causal)
        return cls(num_heads, **kwargs)

    def bias(self, q_positions, k_positions, head):
        distance = (q_positions - k_positions).to(_wide(self.slopes))
        if self.bidirectional:
            distance = distance.abs()
        return -self.slopes[head] * distance

    def linear_bias_slopes(self, causal: bool = True) -> Tensor | None:
        """The slopes: -m (i - j) is -m |i - j| for the keys a causal query sees; without the
        causal mask only the symmetric form is."""
        return self.slopes if causal or self.bidirectional else None

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, bidirectional={self.bidirectional}"


def t5_relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (Raffel et al., JMLR 2020, section 2.1; the
    ``_relative_position_bucket`` of the T5 and Hugging Face code).

    ``relative_position = key - query``. Bidirectional: half the buckets for keys after the
    query (rel > 0), the sign dropped. Causal: only n = max(-rel, 0) (keys before or at the
    query). Distances below num_buckets/2 (of the half, when bidirectional) get a bucket
    each; larger ones share logarithmically spaced buckets up to ``max_distance``, past
    which all fall in the last bucket. The logarithm runs in float32, as in T5.

    Args:
        relative_position: an integer tensor of any shape.

    Returns:
        LongTensor of the same shape with values in [0, num_buckets).

    Raises:
        TypeError: relative_position not an integer tensor.
        ValueError: num_buckets < 2 (bidirectional: < 4), or max_distance not larger than
            the exact range.
    """
    if not isinstance(relative_position, Tensor) or relative_position.dtype.is_floating_point \
            or relative_position.dtype.is_complex or relative_position.dtype == torch.bool:
        got = relative_position.dtype if isinstance(relative_position, Tensor) else type(relative_position).__name__
        raise TypeError(f"relative_position must be an integer torch.Tensor (key - query), got {got}")
    check_positive_int(num_buckets, "num_buckets")
    check_positive_int(max_distance, "max_distance")
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(
            f"num_buckets={num_buckets * (2 if bidirectional else 1)} and max_distance={max_distance} "
            "leave no logarithmic range: need num_buckets >= 2 (4 if bidirectional) and max_distance > num_buckets/2"
        )
    n = n.long()
    is_small = n < max_exact
    # n is clamped below at max_exact only to keep log() finite where is_small discards it.
    large = max_exact + (
        torch.log(n.clamp(min=max_exact).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


class T5RelativeBias(ScoreBias):
    """T5 bucketed relative position bias (Raffel et al., JMLR 2020, section 2.1).

    b(h, i, j) = table[bucket(j - i), h], a learned scalar per bucket and head; T5 shares one
    table across layers (so does the posenc model: one encoding instance per model).

    Args:
        num_heads: H.
        num_buckets: 32 in T5.
        max_distance: 128 in T5; larger distances share the last bucket.
        bidirectional: encoder-style buckets for both signs; False (a causal decoder) folds
            future keys into bucket 0.

    Hook: ``score_bias``. Parameters: ``relative_attention_bias``, an embedding (num_buckets, H).
    """

    name = "t5"
    translation_invariant = True

    def __init__(
        self, num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        t5_relative_position_bucket(torch.zeros(1, dtype=torch.long), bidirectional=self.bidirectional,
                                    num_buckets=num_buckets, max_distance=max_distance)  # validates now
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, num_layers=1, **kwargs):
        kwargs.setdefault("bidirectional", not causal)
        return cls(num_heads, **kwargs)

    def bias(self, q_positions, k_positions, head):
        bucket = self._bucket(k_positions - q_positions)
        weight = self.relative_attention_bias.weight
        return weight[bucket, head].to(_wide(weight))

    def _bucket(self, relative_position: Tensor) -> Tensor:
        return t5_relative_position_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


KERPLE_VARIANTS = ("log", "power")


class Kerple(ScoreBias):
    """KERPLE, kernelized relative positional embedding (Chi et al., NeurIPS 2022, section 4,
    eqs. for the logarithmic and power variants), as in the official ``ParallelKerpleLog`` /
    ``ParallelKerplePower`` (chijames/KERPLE, megatron/mpu/layers.py).

    With d = |i - j| (the official code's causal ``tril`` distances, i - j for j <= i):

    - ``variant="log"`` (the paper's best):  b(h, i, j) = -r1_h * ln(1 + r2_h * d),
      r1 = ``bias_p`` ~ U(0, 2), r2 = ``bias_a`` ~ U(0, 1);
    - ``variant="power"``:                   b(h, i, j) = -r1_h * d ** r2_h,
      r1 = ``bias_a`` ~ U(0, 1), r2 = ``bias_p`` ~ U(0, 2) (the official ``bias_p`` is the
      exponent here).

    Positivity, as the official code does it: before every use (:meth:`prepare_bias`, which
    ``score_bias``, ``score_mod`` and the attention call before evaluating the bias) the
    parameters' data are clamped in place to >= ``eps`` = 0.01, and the power variant's
    exponent also to <= 2 (0 < r2 <= 2 keeps -d^r2 a conditionally positive definite kernel).
    The clamp is on ``.data`` so gradients still flow to a parameter sitting at the bound.

    Args:
        num_heads: H.
        variant: "log" (default) or "power".
        eps: the lower clamp, 0.01 in the official code.

    Hook: ``score_bias``. Parameters ``bias_p`` and ``bias_a``, float32 (H,). Cost: O(H Tq Tk)
    elementwise, like ALiBi.

    Raises:
        ValueError: num_heads not an int >= 1, an unknown variant, eps not in (0, 1).
    """

    name = "kerple"
    translation_invariant = True

    def __init__(self, num_heads: int, *, variant: str = "log", eps: float = 1e-2) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        if variant not in KERPLE_VARIANTS:
            raise ValueError(f"variant must be one of {KERPLE_VARIANTS}, got {variant!r}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"eps must be a number in (0, 1), got {eps!r}")
        self.num_heads, self.variant, self.eps = num_heads, variant, float(eps)
        self.bias_p = nn.Parameter(torch.rand(num_heads) * 2.0)
        self.bias_a = nn.Parameter(torch.rand(num_heads))
        self.clamp_parameters_()

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, num_layers=1, **kwargs):
        return cls(num_heads, **kwargs)

    @torch.no_grad()
    def clamp_parameters_(self) -> None:
        """Clamp ``bias_p`` and ``bias_a`` in place into their allowed ranges (official code)."""
        # on .data, as the official code: the parameters' version counters do not move, so
        # a graph that saved them for backward (another layer, a compiled graph) stays valid
        self.bias_a.data.clamp_(min=self.eps)
        if self.variant == "power":
            self.bias_p.data.clamp_(min=self.eps, max=2.0)
        else:
            self.bias_p.data.clamp_(min=self.eps)

    def prepare_bias(self) -> None:
        self.clamp_parameters_()

    def bias(self, q_positions, k_positions, head):
        distance = (q_positions - k_positions).abs().to(_wide(self.bias_p))
        if self.variant == "log":
            return -self.bias_p[head] * torch.log1p(self.bias_a[head] * distance)
        return -self.bias_a[head] * distance.pow(self.bias_p[head])

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, variant={self.variant!r}, eps={self.eps}"


class FIRE(ScoreBias):
    """FIRE, functional interpolation for relative positions (Li et al., ICLR 2024, section 3,
    eq. 4 and the progressive interpolation with threshold of section 3.2; the code in its
    appendix).

        b(h, i, j) = f_theta( psi(i - j) / (psi(max(L, i)) + eps) )_h,    psi(x) = ln(|c x| + 1),

    i the **absolute** query position (so the normalizer stays right under a KV-cache offset:
    FIRE is deliberately not shift invariant once i > L), j the key position, f_theta an MLP
    1 -> ``mlp_width`` -> H with ReLU, c learned (init 0.1), L = |L_multiplier * init_L| with
    L_multiplier learned (init 1.0) and init_L = 512 fixed, eps = 1e-6. |.| inside psi follows
    the paper's code (``torch.abs(c * x)``). Causal use gives i - j >= 0; a future key
    (j > i) gets psi(|i - j|), the code's symmetric value.

    Args:
        num_heads: H.
        mlp_width: 32 in the paper.
        init_c: 0.1. init_L: 512.0. eps: 1e-6.

    Hook: ``score_bias``. Parameters: ``mlp`` (Linear(1, width), ReLU, Linear(width, H)), ``c``,
    ``L_multiplier``; buffer ``init_L``. Cost: the MLP runs on every (i, j) pair, O(width Tq Tk)
    memory and time (per batch row with (B, T) positions), versus O(H Tq Tk) for ALiBi.

    Raises:
        ValueError: num_heads or mlp_width not an int >= 1, init_L not a finite number > 0,
            init_c not finite, eps not a finite number >= 0.
    """

    name = "fire"

    def __init__(
        self, num_heads: int, *, mlp_width: int = 32, init_c: float = 0.1, init_L: float = 512.0, eps: float = 1e-6
    ) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        check_positive_int(mlp_width, "mlp_width")
        check_number(init_L, "init_L", gt=0)
        check_number(init_c, "init_c")
        check_number(eps, "eps", ge=0)
        self.num_heads, self.mlp_width, self.eps = num_heads, mlp_width, float(eps)
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(float(init_L)))

    @classmethod
    def for_model(cls, *, d_model, num_heads, head_dim, max_positions, causal=True, num_layers=1, **kwargs):
        return cls(num_heads, **kwargs)

    @property
    def threshold(self) -> Tensor:
        """L = |L_multiplier * init_L|, a 0-d float32 tensor (in positions)."""
        return (self.L_multiplier * self.init_L).abs()

    def normalized_distance(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """psi(i - j) / (psi(max(L, i)) + eps), float32 (float64 for a float64 encoding),
        broadcast shape of the positions."""
        return self._normalized(q_positions, k_positions, self.c, self.threshold)

    def _normalized(self, q_positions: Tensor, k_positions: Tensor, c: Tensor, threshold: Tensor) -> Tensor:
        wide = _wide(self.c)
        i = q_positions.to(wide)
        distance = (q_positions - k_positions).to(wide)  # int64 difference: exact below 2^24 (2^53)
        numerator = torch.log((c * distance).abs() + 1.0)
        denominator = torch.log((c * torch.maximum(i, threshold)).abs() + 1.0) + self.eps
        return numerator / denominator

    def piecewise_linear_mlp(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP f: R -> R^H as the piecewise-linear function it is (a ReLU network of one
        input): hidden unit u bends at x = -b1_u / w1_u, so between consecutive sorted bends
        f_h(x) = slope[h, s] * x + intercept[h, s], s the number of bends <= x.

        Returns ``(breakpoints (S-1,), slopes (H, S), intercepts (H, S))`` float32, summed in
        float64 from the current weights (no autograd).
        """
        with torch.no_grad():
            first, second = self.mlp[0], self.mlp[2]
            w1, b1 = first.weight[:, 0].double(), first.bias.double()
            w2, b2 = second.weight.double(), second.bias.double()
            bends = torch.sort(-b1[w1 != 0] / w1[w1 != 0]).values
            if bends.numel():  # a point inside each segment decides which units are on there
                inside = torch.cat((bends[:1] - 1, (bends[:-1] + bends[1:]) / 2, bends[-1:] + 1))
            else:
                inside = torch.zeros(1, dtype=torch.float64, device=w1.device)
            on = (inside.unsqueeze(-1) * w1 + b1 > 0).double()  # (S, width)
            slopes = (on * w1) @ w2.t()  # (S, H)
            intercepts = (on * b1) @ w2.t() + b2
        return bends.float(), slopes.t().float().contiguous(), intercepts.t().float().contiguous()

    def bias(self, q_positions, k_positions, head):
        """f_theta(normalized distance)_h. Outside autograd, for a (H', 1, 1) column of heads
        against a (..., 1, Tq, Tk) grid of positions (how whole tiles are asked for), the MLP
        is evaluated in its piecewise-linear form (:meth:`piecewise_linear_mlp`): one lookup and
        one multiply-add per entry and head instead of a 1 -> width -> H network per pair, and
        no (Tq, Tk, width) hidden tensor; equal to the network up to float32 rounding. Under
        autograd, inside FlexAttention (0-d arguments) or a compile, the network itself."""
        if head.dim() == 0:  # one score, inside FlexAttention's score_mod
            return self._one_score(q_positions, k_positions, head)
        x = self.normalized_distance(q_positions, k_positions)
        needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        grid = head.dim() == 3 and head.shape[1:] == (1, 1) and x.dim() >= 3 and x.shape[-3] == 1
        if grid and not needs_grad and not torch.compiler.is_compiling():
            return self._piecewise_bias(x.select(-3, 0), head.view(-1))
        if grid:  # (..., H', Tq, Tk) by moving the MLP's head axis: no broadcast gather, one graph for every length
            per_head = self.mlp(x.select(-3, 0).unsqueeze(-1).to(self.mlp[0].weight.dtype)).to(x.dtype)
            return per_head.movedim(-1, -3).index_select(-3, head.view(-1))
        per_head = self.mlp(x.unsqueeze(-1).to(self.mlp[0].weight.dtype)).to(x.dtype)  # (..., H)
        index = head.unsqueeze(-1)
        while index.dim() < per_head.dim():
            index = index.unsqueeze(0)
        while per_head.dim() < index.dim():
            per_head = per_head.unsqueeze(0)
        return torch.take_along_dim(per_head, index, dim=-1).squeeze(-1)

    def _one_score(self, q_position: Tensor, k_position: Tensor, head: Tensor) -> Tensor:
        """The same f_theta(normalized distance)_h for one (0-d) score, every parameter read by a
        gather whose index goes through the score's head (``zero = head * 0``): FlexAttention
        (torch 2.13, ``sdpa_dense_backward`` and the compiled kernels) differentiates a
        score_mod's captured parameters only when they are read that way, summing their
        gradients over the scores by scatter-adds; a plain product with a parameter there has no
        gradient (vmap refuses it)."""
        zero = head * 0
        units = torch.arange(self.mlp_width, device=head.device) + zero
        first, second = self.mlp[0], self.mlp[2]
        threshold = (self.L_multiplier.view(1)[zero] * self.init_L).abs()
        x = self._normalized(q_position, k_position, self.c.view(1)[zero], threshold).to(first.weight.dtype)
        hidden = torch.relu(first.weight.reshape(-1)[units] * x + first.bias[units])
        row = second.weight.reshape(-1)[head * self.mlp_width + units]  # flat gathers: one index tensor each
        return ((row * hidden).sum() + second.bias[head]).to(_wide(self.c))

    def _piecewise_bias(self, x: Tensor, heads: Tensor) -> Tensor:
        """x (..., Tq, Tk), heads (H',) -> (..., H', Tq, Tk) from the piecewise-linear MLP."""
        breakpoints, slopes, intercepts = self.piecewise_linear_mlp()
        slopes, intercepts = slopes.index_select(0, heads).to(x.dtype), intercepts.index_select(0, heads).to(x.dtype)
        segment = torch.bucketize(x, breakpoints.to(x.dtype), right=True).view(-1)
        out = x.new_empty(x.shape[:-2] + (heads.numel(),) + x.shape[-2:])
        slope, intercept = torch.empty_like(x), torch.empty_like(x)
        # one flat index_select per head into reused buffers: no (H', Tq, Tk) index tensor
        for h in range(heads.numel()):
            torch.index_select(slopes[h], 0, segment, out=slope.view(-1))
            torch.index_select(intercepts[h], 0, segment, out=intercept.view(-1))
            torch.addcmul(intercept, slope, x, out=out[..., h, :, :])
        return out

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_width={self.mlp_width}, eps={self.eps}"
