"""FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions"): an MLP
of the progressively interpolated, log-transformed distance. Conventions:
:mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations


import torch
from torch import Tensor, nn

from posenc._validation import check_number, check_positive_int
from posenc.encodings.score_bias import ScoreBias, _wide


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
    model_sizes = ("num_heads",)

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
        gradient (vmap refuses it).

        The hidden layer is summed unit by unit (a loop over ``mlp_width``, not over the
        sequence): a score_mod must lower to a pointwise kernel, and Inductor refuses a
        (width,) intermediate there ("Buffers cannot be created while lowering a pointwise
        subgraph", torch 2.11-2.13, CPU and CUDA)."""
        zero = head * 0
        first, second = self.mlp[0], self.mlp[2]
        threshold = (self.L_multiplier.view(1)[zero] * self.init_L).abs()
        x = self._normalized(q_position, k_position, self.c.view(1)[zero], threshold).to(first.weight.dtype)
        w1, w2 = first.weight.reshape(-1), second.weight.reshape(-1)  # flat: one index per gather
        row = head * self.mlp_width
        total = second.bias[head]
        for unit in range(self.mlp_width):
            total = total + w2[row + unit] * torch.relu(w1[zero + unit] * x + first.bias[zero + unit])
        return total.to(_wide(self.c))

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
