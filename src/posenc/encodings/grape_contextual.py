"""Contextual multiplicative GRAPE, Type I (Zhang et al. 2025, "Group Representational Position
Encoding", arXiv 2512.07805, ICLR 2026; phase-modulated, commuting): RoPE's planes and
learned spectrum, turned not by the token's position but by a phase the hidden state writes,
Phi_t = sum_{tau<t} omega_tau with omega_tau = softplus(w . x_tau + b) >= 0.

A query at i and a key at j then score q_i^T R(theta (Phi_i - Phi_j)) k_j: exactly relative in
the phase, and the phase between two tokens is what the tokens between them (the key's
included, the query's not) wrote. With every omega = 1 it is multiplicative GRAPE at the
token positions (:class:`~posenc.encodings.rope.grape.GRAPE`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._validation import check_bool, check_even, check_number, check_positive_int
from posenc.encodings.base import (
    Hook,
    PositionalEncoding,
    gate_input,
    layer_of_copies,
    sum_dtype,
)
from posenc.errors import InvalidArgument
from posenc.kernels.rotary_torch import apply_rotary


class ContextualGRAPE(PositionalEncoding):
    """Contextual GRAPE Type I (arXiv 2512.07805), as its official code computes it
    (model-architectures/GRAPE ``model/llama-mha-grape-m-ctx.py`` @73b2231,
    ``MSGRAPEContextType1`` and ``CausalSelfAttention._cumulative_phase``)::

        omega_t = softplus(omega_proj(x_t))           (B, T, 1), or (B, T, H) per head
        Phi_t   = sum_{tau < t} omega_tau             exclusive: Phi_0 = 0
        theta_a = exp(log_freq_a)                     started at base^(-2a/D), learned
        plane (a, a + D/2) of q_t and k_t turned by -Phi_t theta_a (the reference's direction,
        as :class:`~posenc.encodings.rope.grape.GRAPE`)

    ``omega_proj`` is ``Linear(d_model, 1 or H)`` with a bias, its weight started at zero and
    its bias at softplus^-1(``init_omega``) (1e-3: the model starts near a position-free
    attention, every phase near 0).

    Conventions. The turn is the ``content`` hook's term, q_i^T R k_j - q_i . k_j, from q, k
    and the ``gate`` hook's omega of every key (kept with the keys in a KV cache, as FoX's
    gates): the phase is a sum over the cache, so a cache that drops its oldest keys would
    change it (posenc's keeps every key). Positions are not read. The reference turns q and
    k *before* its QK-RMSNorm (whose learned weight does not commute with the turn); posenc
    turns the q and k it is given. Angles in float64 from float32 parameters (the reference
    rounds cos / sin to bfloat16); the phase sums run in float64 (float32 on MPS). Causal only
    (the phase of a query sums the tokens before it).

    Hooks: ``gate`` and ``content`` (the backends that take content terms). Cost per call: O(B H (Tq + Tk)
    D) for the turns and one more (Tq, Tk) product than plain attention.

    Args:
        d_model: the width of x.
        num_heads: H.
        head_dim: D (even).
        base: the initial spectrum's base (10000, the reference's ``grape_base``).
        per_head_phase: one phase per head (the reference's ``grape_ctx_per_head``); False
            (default): one scalar phase per token for every head.
        share_across_heads: one spectrum for every head (default True, the reference's
            ``grape_share_across_heads``); False: a spectrum per head.
        init_omega: the phase increment at initialization (1e-3, ``grape_ctx_init_omega``).
        learnable: log_freq a parameter (True) or a frozen buffer.
        num_layers: the number of attention layers, each with its own omega_proj and spectrum
            (:meth:`for_layer`); 1 (default): one shared by every layer.
        causal: must be True (the model's size; :meth:`for_model` passes it).

    Raises:
        ValueError: a size not an integer >= 1, D odd, base <= 1, init_omega <= 0, causal
            False (construction); x without shape (B, T, d_model) (:meth:`gate`); gates not
            (B, H, Tk) (:meth:`prepare_gates`). TypeError: a flag not a bool.
    """

    name = "grape_contextual"
    hooks = frozenset({Hook.GATE, Hook.CONTENT})
    model_sizes = ("d_model", "num_heads", "head_dim", "num_layers", "causal")
    causal_only = True
    content_on_values = False

    def __init__(self, d_model: int, num_heads: int, head_dim: int, base: float = 10000.0,
                 per_head_phase: bool = False, share_across_heads: bool = True, init_omega: float = 1e-3,
                 learnable: bool = True, num_layers: int = 1, causal: bool = True) -> None:
        super().__init__()
        for argname, value in (("d_model", d_model), ("num_heads", num_heads), ("num_layers", num_layers)):
            check_positive_int(value, argname)
        check_even(head_dim, "head_dim")
        check_number(base, "base", gt=1)
        check_number(init_omega, "init_omega", gt=0)
        for argname, flag in (("per_head_phase", per_head_phase), ("share_across_heads", share_across_heads),
                              ("learnable", learnable)):
            check_bool(flag, argname)
        if causal is not True:
            raise InvalidArgument(f"causal: contextual GRAPE's phase sums the tokens before the query (causal attention only), got {causal!r}")
        self.d_model, self.num_heads, self.head_dim, self.num_layers = d_model, num_heads, head_dim, num_layers
        self.base, self.per_head_phase, self.share_across_heads = float(base), per_head_phase, share_across_heads
        self.init_omega = float(init_omega)
        spectrum = 1.0 / self.base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        log_freq = spectrum.log().expand(1 if share_across_heads else num_heads, -1).clone()  # (1 or H, D/2)
        if learnable:
            self.log_freq = nn.Parameter(log_freq)
        else:
            self.register_buffer("log_freq", log_freq)
        self.omega_proj = nn.Linear(d_model, num_heads if per_head_phase else 1, bias=True)
        with torch.no_grad():
            nn.init.zeros_(self.omega_proj.weight)
            self.omega_proj.bias.fill_(math.log(math.expm1(self.init_omega)))  # softplus^-1
        self.deeper_layers = nn.ModuleList(
            ContextualGRAPE(d_model, num_heads, head_dim, base, per_head_phase, share_across_heads, init_omega, learnable)
            for _ in range(num_layers - 1)
        )

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance; layer l > 0 the l-th of ``deeper_layers``."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def gate(self, x: Tensor) -> Tensor:
        """omega of every token: x (B, T, d_model) -> (B, H, T), >= 0, float32 (float64 for
        float64 x and parameters); the scalar phase's omega repeated for every head."""
        x, wide = gate_input(x, self.d_model, self.omega_proj.weight)
        omega = F.softplus(self.omega_proj(x).to(wide))  # (B, T, 1 or H)
        return omega.transpose(1, 2).expand(-1, self.num_heads, -1)

    def prepare_gates(self, gates: Tensor) -> Tensor:
        """Phi of every key: the exclusive cumulative sum of omega, (B, H, Tk), float64
        (float32 on MPS)."""
        if gates.dim() != 3:
            raise InvalidArgument(f"gates must have shape (B, H, Tk) (ContextualGRAPE.gate(x): omega), got {tuple(gates.shape)}")
        omega = gates.to(sum_dtype(gates))
        return omega.cumsum(-1) - omega

    def gate_bias(self, state, q_index, k_index, *, causal):
        """None: the turn acts on q and k, so it is a content term (:meth:`content_scores`)."""

    def _turn(self, x: Tensor, phase: Tensor) -> Tensor:
        """x (B, H, T, D) turned plane by plane by -phase (B, H, T) theta."""
        theta = self.log_freq.to(phase.dtype).exp()  # (1 or H, D/2); the gradient flows through
        angles = phase.unsqueeze(-1) * theta[:, None, :]  # (B, H, T, D/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return apply_rotary(x, torch.cat((cos, cos), -1), -torch.cat((sin, sin), -1))

    def content_scores(self, q, k, q_positions, k_positions, *, mask=None, gate_state=None):
        """q_i^T R(theta (Phi_i - Phi_j)) k_j - q_i . k_j: (B, H, Tq, Tk) before the 1/sqrt(D)
        scale, float32 (float64 for float64 q); q (B, H, Tq, D) are the last
        Tq of the keys k (B, H, Tk, D). Positions and ``mask`` are not read."""
        phase = gate_state
        wide = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(wide), k.to(wide)
        num_queries = q.shape[-2]
        q_turned = self._turn(q, phase[..., phase.shape[-1] - num_queries:])
        k_turned = self._turn(k, phase)
        return q_turned @ k_turned.transpose(-2, -1) - q @ k.transpose(-2, -1)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, base={self.base:g}, "
                f"per_head_phase={self.per_head_phase}, share_across_heads={self.share_across_heads}, "
                f"num_layers={self.num_layers}")
