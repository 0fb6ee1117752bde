"""FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions"): an MLP
of the progressively interpolated, log-transformed distance. Conventions:
:mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor, nn

from posenc._validation import check_number, check_positive_int
from posenc.encodings.base import bias_kernel_attention
from posenc.encodings.score_bias import ScoreBias, _wide
from posenc.kernels.fused_bias import FusedBias, relu_pieces
from posenc.mask_rules import position_at

#: Entries of a FIRE tile whose features are made at once (:func:`_hinge_product`): the
#: (K + 2, entries) features stay in the L2 cache.
_CHUNK_ENTRIES = 1 << 15
#: The largest scratch buffer kept per thread and slot (entries): 4 MiB of float32, a tile's
#: (Tq, Tk) input at T = 8192 with 64-row blocks.
_SCRATCH_ENTRIES = 1 << 20


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
    memory and time (per batch row with (B, T) positions), versus O(H Tq Tk) for ALiBi; outside
    autograd O((K + 2) H Tq Tk) time, K <= width the bends the tile's inputs cross, and
    :meth:`bias_into` writes a tile into the attention layer's buffer; on the CPU
    :meth:`fused_attention` gives the attention layer's whole forward with the bias computed
    inside the attention (no tile), and for training the forward and backward of the
    relative-position kernel's piecewise term (O(T) memory); on CUDA,
    ``backend="triton"`` computes it inside the fused kernel, forward and backward
    (:meth:`fused_bias`).

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

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias:
        """``log_distance_mlp``: the MLP's weights, c and the threshold L (gradients flow back to
        ``L_multiplier`` through :attr:`threshold`)."""
        first, last = self.mlp[0], self.mlp[2]
        return FusedBias("log_distance_mlp", {"w1": first.weight[:, 0], "b1": first.bias, "w2": last.weight, "b2": last.bias,
                                  "c": self.c.reshape(1), "threshold": self.threshold.reshape(1)}, eps=self.eps)

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
        bends, slopes, intercepts = self._pieces()
        return bends.float(), slopes.float().contiguous(), intercepts.float().contiguous()

    def _pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`piecewise_linear_mlp` in float64: bends (S-1,), slopes and intercepts (H, S)."""
        with torch.no_grad():
            first, second = self.mlp[0], self.mlp[2]
            w1, b1 = first.weight[:, 0].double(), first.bias.double()
            w2, b2 = second.weight.double(), second.bias.double()
            bends, on, _ = relu_pieces(w1, b1)  # (S - 1,), (S, width)
            slopes = (on * w1) @ w2.t()  # (S, H)
            intercepts = (on * b1) @ w2.t() + b2
        return bends, slopes.t(), intercepts.t()

    def bias(self, q_positions, k_positions, head):
        """f_theta(normalized distance)_h. Outside autograd and torch.compile, for a (H', 1, 1)
        column of heads against a (..., 1, Tq, Tk) grid of positions (how whole tiles are
        asked for), psi is evaluated once per distance when the positions are consecutive
        runs, and the MLP in its piecewise-linear form (:meth:`piecewise_linear_mlp`) as one
        (H', K + 2) x (K + 2, Tq Tk) product, K the bends inside the tile's range of x
        (:meth:`_piecewise_bias`): no (Tq, Tk, width) hidden tensor; equal to the network up
        to float32 rounding. Under autograd the same product, with the network's gradients
        (:class:`_PiecewiseTile`). Inside FlexAttention (0-d arguments) or a compile, the
        network itself."""
        if head.dim() == 0:  # one score, inside FlexAttention's score_mod
            return self._one_score(q_positions, k_positions, head)
        if self._fast_grid(q_positions, k_positions, head):
            return self._piecewise_bias(self._grid_distance(q_positions, k_positions), head.view(-1))
        x = self.normalized_distance(q_positions, k_positions)
        grid = head.dim() == 3 and head.shape[1:] == (1, 1) and x.dim() >= 3 and x.shape[-3] == 1
        if grid and not torch.compiler.is_compiling() and self.mlp[0].weight.dtype == x.dtype:
            # under autograd: the same piecewise product, differentiated by _PiecewiseTile
            first, second = self.mlp[0], self.mlp[2]
            return _PiecewiseTile.apply(x.select(-3, 0), head.view(-1), self, first.weight, first.bias,
                                        second.weight, second.bias)
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

    def _score_units(self) -> tuple[Tensor, ...]:
        """The parameters a score reads, each a tensor of its own: c, L_multiplier, b2 (H,), and
        per hidden unit u its w1_u (1,), b1_u (1,) and w2[:, u] (H,), as differentiable copies.

        FlexAttention's compiled backward (Inductor, torch 2.11-2.13, CUDA) refuses a tensor
        requiring grad that a score_mod indexes more than once ("Using multiple indexing
        operations on the same tensor that requires gradients"); read through these copies, each
        is indexed once per score, and autograd sums their gradients back into the parameters
        (the copies: 3 x mlp_width + 3 small tensors per score_mod, about (2 + H) x mlp_width floats)."""
        first, second = self.mlp[0], self.mlp[2]
        w1, b1 = first.weight[:, 0], first.bias
        units = []
        for unit in range(self.mlp_width):
            units += [w1[unit:unit + 1], b1[unit:unit + 1], second.weight[:, unit]]
        # clones, not views: Dynamo traces a captured view back to its base, and Inductor's CPU
        # flex kernel then refuses the slice computed inside the score_mod's subgraph
        return tuple(t.clone() for t in (self.c.view(1), self.L_multiplier.view(1), second.bias, *units))

    def _one_score(self, q_position: Tensor, k_position: Tensor, head: Tensor,
                   units: tuple[Tensor, ...] | None = None) -> Tensor:
        """The same f_theta(normalized distance)_h for one (0-d) score, every parameter read by a
        gather whose index goes through the score's head (``zero = head * 0``): FlexAttention
        (torch 2.13, ``sdpa_dense_backward`` and the compiled kernels) differentiates a
        score_mod's captured parameters only when they are read that way, summing their
        gradients over the scores by scatter-adds; a plain product with a parameter there has no
        gradient (vmap refuses it). ``units``: :meth:`_score_units`, built once outside the
        score_mod (:meth:`score_mod` does), so that each captured tensor is read once.

        The hidden layer is summed unit by unit (a loop over ``mlp_width``, not over the
        sequence): a score_mod must lower to a pointwise kernel, and Inductor refuses a
        (width,) intermediate there ("Buffers cannot be created while lowering a pointwise
        subgraph", torch 2.11-2.13, CPU and CUDA)."""
        c, l_multiplier, b2, *per_unit = self._score_units() if units is None else units
        zero = head * 0
        threshold = (l_multiplier[zero] * self.init_L).abs()
        x = self._normalized(q_position, k_position, c[zero], threshold).to(b2.dtype)
        total = b2[head]
        for w1, b1, w2 in zip(per_unit[0::3], per_unit[1::3], per_unit[2::3]):
            total = total + w2[head] * torch.relu(w1[zero] * x + b1[zero])
        return total.to(_wide(self.c))

    def score_mod(self, q_positions: Tensor | None = None, k_positions: Tensor | None = None):
        """The bias as a FlexAttention ``score_mod`` (:meth:`PositionalEncoding.score_mod`'s
        contract), each parameter captured as its own view (:meth:`_score_units`) so that the
        compiled backward differentiates them."""
        self.prepare_bias()
        units = self._score_units()

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + self._one_score(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx),
                                           h.long(), units)

        return score_mod

    def bias_into(self, q_positions: Tensor, k_positions: Tensor, head: Tensor, out: Tensor) -> Tensor | None:
        """:meth:`bias` written into ``out``, for how the attention layer asks for tiles: a
        (H', 1, 1) column of heads against (..., 1, Tq, 1) query and (..., 1, 1, Tk) key
        positions, ``out`` a contiguous float tensor of the broadcast shape (..., H', Tq, Tk)
        in the encoding's dtype. Outside autograd and torch.compile only (it reads the tile's
        range of x to pick the MLP's pieces); returns ``out``, or None where it does not apply
        (the caller then calls :meth:`bias`)."""
        if not self._fast_grid(q_positions, k_positions, head) or out.dtype != _wide(self.c) \
                or not out.is_contiguous():
            return None
        x = self._grid_distance(q_positions, k_positions)
        if out.shape != x.shape[:-2] + (head.numel(),) + x.shape[-2:]:
            return None
        return self._piecewise_bias(x, head.view(-1), out)

    def fused_attention(self, q: Tensor, k: Tensor, v: Tensor, *, q_positions: Tensor, k_positions: Tensor,
                        causal: bool, mask: Tensor | None, scale: float, gate_state: object = None) -> Tensor | None:
        """softmax(scale q.k^T + b + causal mask) v with this bias computed inside the attention
        by a fused CPU kernel: no bias tile written or read. With something to differentiate
        (FIRE's parameters, q, k or v under grad mode) the relative-position kernel's piecewise
        term with its backward (:func:`posenc.encodings.base.bias_kernel_attention`, which says
        what it declines); else the forward-only kernel (:mod:`posenc.kernels.fire_cpu`). Returns
        None where they do not apply, and the caller runs its own path: the kernel off or not
        built (the rule of :func:`posenc.kernels.use_cpu_kernel`, under the same switch), not
        float32 CPU tensors, a float64 encoding, torch.compile, a ``mask``, key-value
        heads fewer than query heads, positions other than one 1-D consecutive ascending run
        each, causal with Tq > Tk, a head size the kernel lacks, a normalizer that is not
        finite and > 0 (c = eps = 0).

        q (B, H, Tq, D), k and v (B, H, Tk, D); causal: key index j visible to query i iff
        j <= i + Tk - Tq (bottom-right, as the attention layer's tiles). Returns (B, H, Tq, D) float32."""
        from posenc.kernels import fire_cpu

        if torch.is_grad_enabled() and (self._needs_grad() or any(t.requires_grad for t in (q, k, v))):
            # training: the relative-position kernel's piecewise term, with its backward (checked
            # before fire_cpu.use_kernel: a training call must not build a kernel it cannot use)
            return bias_kernel_attention(self, q, k, v, q_positions=q_positions, k_positions=k_positions,
                                         causal=causal, mask=mask, scale=scale)
        if (mask is not None or torch.compiler.is_compiling() or _wide(self.c) != torch.float32
                or not fire_cpu.use_kernel(q, k, v, q_positions, k_positions)):
            return None
        if not (_ascending_run(q_positions) and _ascending_run(k_positions)) or q.shape[1] > self.num_heads:
            return None
        num_queries, num_keys = q.shape[2], k.shape[2]
        if num_queries == 0 or num_keys == 0:
            return None
        with torch.no_grad():
            # the float operations of _grid_distance: psi once per distance, one normalizer per row
            high = q_positions[-1] - k_positions[0]
            distance = (high - torch.arange(fire_cpu.table_length(num_queries, num_keys))).to(torch.float32)
            psi = torch.log((self.c * distance).abs() + 1.0)
            i = q_positions.to(torch.float32)
            den = torch.log((self.c * torch.maximum(i, self.threshold)).abs() + 1.0) + self.eps
            if not (bool(torch.isfinite(psi).all()) and bool((den > 0).all()) and bool(torch.isfinite(den).all())):
                return None
            bends, slopes, intercepts = self._cached_pieces()
            return fire_cpu.attention(q, k, v, psi=psi, den=den, bends=bends, slopes=slopes[:q.shape[1]],
                                      intercepts=intercepts[:q.shape[1]], scale=scale, causal=causal)

    def _fast_grid(self, q_positions: Tensor, k_positions: Tensor, head: Tensor) -> bool:
        """A whole grid (heads (H', 1, 1), queries (..., 1, Tq, 1), keys (..., 1, 1, Tk)) with
        nothing to differentiate, outside torch.compile: the piecewise-linear evaluation."""
        grid = (head.dim() == 3 and head.shape[1:] == (1, 1) and q_positions.dim() >= 3
                and q_positions.shape[-3:-1] == (1, q_positions.shape[-2]) and q_positions.shape[-1] == 1
                and k_positions.dim() >= 3 and k_positions.shape[-3:-1] == (1, 1))
        return grid and not self._needs_grad() and not torch.compiler.is_compiling()

    def _needs_grad(self) -> bool:
        """Whether autograd records a tile: grad mode on and a tensor the tile reads requiring grad."""
        first, second = self.mlp[0], self.mlp[2]
        tensors = (self.c, self.L_multiplier, first.weight, first.bias, second.weight, second.bias)
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def _grid_distance(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The normalized distance of a grid, (..., Tq, Tk). For 1-D runs of consecutive
        positions psi is evaluated once per distance: the tile's rows, last query first, are
        then a Hankel (strided) view of those Tq + Tk - 1 values, each divided by its row's
        normalizer (the same float operations as :meth:`normalized_distance` on Tq + Tk - 1
        values instead of Tq Tk), and the rows put back in order. The result lives in a
        per-thread scratch buffer: valid until the next tile (callers outside autograd only)."""
        q_run, k_run = q_positions.reshape(-1), k_positions.reshape(-1)
        runs = (q_positions.dim() == 3 and k_positions.dim() == 3 and q_run.numel() > 0 and k_run.numel() > 0
                and all(bool((r.diff() == 1).all()) for r in (q_run, k_run)))
        if not runs:
            return self.normalized_distance(q_positions, k_positions).select(-3, 0)
        wide = _wide(self.c)
        num_queries, num_keys = q_run.numel(), k_run.numel()
        high = q_run[-1] - k_run[0]  # the largest distance, at the last query and first key
        # column m of the flat table: distance high - m; query row i (from the last) starts at m = i
        distance = (high - torch.arange(num_queries + num_keys - 1, device=q_run.device)).to(wide)
        numerator = torch.log((self.c * distance).abs() + 1.0)
        i = q_run.flip(0).to(wide)  # the rows in the table's order: last query first
        denominator = torch.log((self.c * torch.maximum(i, self.threshold)).abs() + 1.0) + self.eps
        rows = numerator.as_strided((num_queries, num_keys), (1, 1))
        # out= everywhere: torch lays out a result like its inputs, and this view overlaps itself
        descending = torch.div(rows, denominator.unsqueeze(-1), out=_scratch(num_queries, num_keys, numerator, 1))
        reverse = torch.arange(num_queries - 1, -1, -1, device=descending.device)
        return torch.index_select(descending, 0, reverse, out=_scratch(num_queries, num_keys, numerator, 2))

    def _piecewise_bias(self, x: Tensor, heads: Tensor, out: Tensor | None = None) -> Tensor:
        """x (..., Tq, Tk), heads (H',) -> (..., H', Tq, Tk) from the piecewise-linear MLP
        (into ``out`` when given).

        Written from the top: with ``top`` the segment of the tile's largest x and beta_k the
        K bends inside the tile's range of x (k = first .. top - 1),

            f_h(x) = slope[h, top] x + intercept[h, top] + sum_k C[h, k] (beta_k - min(x, beta_k)),
            C[h, k] = slope[h, k + 1] - slope[h, k]

        (f is continuous: crossing bend k leftwards changes the slope by C[h, k]; bends at or
        below the smallest x never act), i.e. one (H', K + 2) x (K + 2, entries) product over
        the features [1, x, min(x, beta_k)...], shared by the heads: no per-entry lookup, no
        (Tq, Tk, width) hidden tensor. Equal to the network up to float32 rounding."""
        bends, slopes, intercepts = self._cached_pieces()
        num_heads = heads.numel()
        if out is None:
            out = x.new_empty(x.shape[:-2] + (num_heads,) + x.shape[-2:])
        if x.numel() == 0:
            return out
        low, high = (float(v) for v in torch.aminmax(x))  # the caller keeps this out of torch.compile
        if not (math.isfinite(low) and math.isfinite(high)):  # c = eps = 0 and the like: the network decides
            per_head = self.mlp(x.unsqueeze(-1).to(self.mlp[0].weight.dtype)).to(x.dtype)
            return out.copy_(per_head.movedim(-1, -3).index_select(-3, heads))
        first = int(torch.searchsorted(bends, low, right=True))  # segment of the smallest x
        top = int(torch.searchsorted(bends, high, right=True))  # and of the largest
        slopes, intercepts = slopes.index_select(0, heads), intercepts.index_select(0, heads)
        active = bends[first:top]
        hinges = slopes[:, first + 1:top + 1] - slopes[:, first:top]  # (H', K)
        constant = intercepts[:, top:top + 1] + hinges @ active.unsqueeze(-1)
        weights = torch.cat((constant, slopes[:, top:top + 1], -hinges), dim=-1).to(x.dtype)  # (H', K + 2)
        caps = torch.cat((active.new_full((1,), math.inf), active)).to(x.dtype)  # min(x, inf) = x
        _hinge_product(x, out, weights, caps)
        return out

    def _cached_pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`_pieces`, recomputed only when the MLP's weights differ from those it was
        computed from (compared entry by entry: an optimizer step, ``load_state_dict``, an
        edit through ``.data``): every tile of an attention call reads the same pieces."""
        first, second = self.mlp[0], self.mlp[2]
        weights = torch.cat([t.detach().reshape(-1) for t in (first.weight, first.bias, second.weight, second.bias)])
        cached = self.__dict__.get("_pieces_cache")
        if (cached is None or cached[0].dtype != weights.dtype or cached[0].device != weights.device
                or not torch.equal(cached[0], weights)):
            cached = (weights, self._pieces())
            self.__dict__["_pieces_cache"] = cached
        return cached[1]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_width={self.mlp_width}, eps={self.eps}"


def _hinge_product(x: Tensor, out: Tensor, weights: Tensor, caps: Tensor) -> None:
    """out (..., H', R, W) = weights @ [1, min(x, caps[0]), min(x, caps[1]), ...] for x
    (..., R, W): weights (H', K + 2), caps (K + 1,). A few rows at a time, each chunk's
    product written straight into ``out``; the features of a chunk live in a reused
    per-thread buffer (in cache, on warm pages: a fresh megabyte-sized tensor costs more in
    page faults on this CPU than the arithmetic done in it)."""
    if x.dim() > 2:  # per-batch positions: each batch row on its own
        for index in range(x.shape[0]):
            _hinge_product(x[index], out[index], weights, caps)
        return
    num_rows, width = x.shape
    if num_rows == 0 or width == 0:
        return
    step = max(1, _CHUNK_ENTRIES // width)
    features = _scratch(caps.shape[0] + 1, min(num_rows, step) * width, x)
    features[0] = 1.0
    for row in range(0, num_rows, step):  # chunks of one tile's rows, not of the sequence
        rows = min(step, num_rows - row)
        chunk = features[:, :rows * width]
        torch.minimum(x[row:row + rows].unsqueeze(0), caps.view(-1, 1, 1), out=chunk[1:].view(-1, rows, width))
        torch.mm(weights, chunk, out=out[:, row:row + rows].view(out.shape[0], rows * width))


def _ascending_run(positions: Tensor) -> bool:
    """Whether positions are one 1-D run p0, p0 + 1, ... (at least one position)."""
    if positions.dim() != 1 or positions.numel() == 0 or positions.is_floating_point():
        return False
    return positions.numel() == 1 or bool((positions.diff() == 1).all())


_SCRATCH = threading.local()


def _scratch(rows: int, columns: int, like: Tensor, slot: int = 0) -> Tensor:
    """A (rows, columns) tensor of ``like``'s dtype and device from a buffer kept per thread
    and ``slot`` (grown, never shrunk, at most ``_SCRATCH_ENTRIES``: slot 0 holds the
    features of :func:`_hinge_product`, slots 1 and 2 one tile's (Tq, Tk) inputs). Its contents are
    garbage; it is valid until the next call for the same slot on the same thread."""
    if rows * columns > _SCRATCH_ENTRIES:  # a whole dense (T, T) grid: not kept
        return like.new_empty(rows, columns)
    key = (like.dtype, like.device, slot)
    cache = _SCRATCH.__dict__.setdefault("buffers", {})
    buffer = cache.get(key)
    if buffer is None or buffer.numel() < rows * columns:
        buffer = cache[key] = like.new_empty(rows * columns)
    return buffer[:rows * columns].view(rows, columns)


class _PiecewiseTile(torch.autograd.Function):
    """FIRE's tile f(x)_h for heads (H',) from x (..., Tq, Tk) as :meth:`FIRE._piecewise_bias`
    computes it, with the gradients of the network f(x) = b2 + w2 relu(w1 x + b1) in x, w1, b1,
    w2 and b2 (relu' = 0 at 0, as torch's). Units whose bend lies outside the tile's range of x
    are on or off on the whole tile: their sums reduce to sum_e g and sum_e g x per head; the K
    others (bend within the range) take one (H', E) x (E, K) product and K masked sums over the
    E = Tq Tk entries, instead of autograd through an (E, width) hidden layer."""

    @staticmethod
    def forward(ctx, x, heads, encoding, w1, b1, w2, b2):
        ctx.save_for_backward(x, heads, w1, b1, w2, b2)
        return encoding._piecewise_bias(x, heads)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, heads, w1, b1, w2, b2 = ctx.saved_tensors
        num_heads = heads.numel()
        g = grad.movedim(-3, 0).reshape(num_heads, -1)  # (H', E)
        xf = x.reshape(-1)
        w1v, w2h = w1[:, 0], w2.index_select(0, heads)  # (U,), (H', U)
        if xf.numel() == 0:
            low = high = 0.0
        else:
            low, high = (float(v) for v in torch.aminmax(xf))
        bend = -b1 / torch.where(w1v == 0, torch.ones_like(w1v), w1v)
        active = (w1v != 0) & (bend >= low) & (bend <= high)  # relu's kink inside the range
        always_on = ((w1v * low + b1 > 0) & ~active).to(x.dtype)  # the others: one sign throughout
        total, moment = g.sum(-1), g @ xf  # sum_e g and sum_e g x, (H',)
        grad_w2 = total.unsqueeze(-1) * (always_on * b1) + moment.unsqueeze(-1) * (always_on * w1v)
        grad_b1, grad_w1 = always_on * (w2h.t() @ total), always_on * (w2h.t() @ moment)
        grad_x = (w2h @ (always_on * w1v)) @ g  # (E,)
        units = active.nonzero().squeeze(-1)
        if units.numel():
            z = torch.addmm(b1[units].unsqueeze(-1), w1v[units].unsqueeze(-1), xf.unsqueeze(0))  # (K, E)
            on = z > 0
            grad_w2[:, units] = g @ z.clamp_min_(0).t()
            per_unit = (w2h[:, units].t() @ g).mul_(on)  # sum_h w2_hu g_h where unit u is on
            grad_b1[units], grad_w1[units] = per_unit.sum(-1), per_unit @ xf
            grad_x = grad_x + w1v[units] @ per_unit
        grad_b2 = torch.zeros_like(b2).index_add_(0, heads, total)
        grad_w2 = torch.zeros_like(w2).index_add_(0, heads, grad_w2)
        return grad_x.view(x.shape), None, None, grad_w1.unsqueeze(-1), grad_b1, grad_w2, grad_b2

