"""Kerple (Chi et al., NeurIPS 2022): kernelized relative positional embeddings, the
logarithmic and power variants. Conventions: :mod:`posenc.encodings.score_bias`.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc._validation import check_positive_int
from posenc.encodings.base import bias_kernel_attention
from posenc.encodings.score_bias import ScoreBias, _wide
from posenc.errors import InvalidArgument
from posenc.kernels.fused_bias import FusedBias

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
    model_sizes = ("num_heads",)
    translation_invariant = True

    def __init__(self, num_heads: int, *, variant: str = "log", eps: float = 1e-2) -> None:
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        if variant not in KERPLE_VARIANTS:
            raise InvalidArgument(f"variant must be one of {KERPLE_VARIANTS}, got {variant!r}")
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise InvalidArgument(f"eps must be a number in (0, 1), got {eps!r}")
        self.num_heads, self.variant, self.eps = num_heads, variant, float(eps)
        self.bias_p = nn.Parameter(torch.rand(num_heads) * 2.0)
        self.bias_a = nn.Parameter(torch.rand(num_heads))
        self.clamp_parameters_()

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

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias:
        """``kerple_log`` or ``kerple_power`` with p = ``bias_p`` and a = ``bias_a``."""
        return FusedBias(f"kerple_{self.variant}", {"p": self.bias_p, "a": self.bias_a})

    #: The fused CPU kernel's whole attention with this bias, with autograd (float32, consecutive
    #: positions, the kernel built (at the first call by default); None elsewhere).
    fused_attention = bias_kernel_attention

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, variant={self.variant!r}, eps={self.eps}"
