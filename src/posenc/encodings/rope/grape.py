"""Multiplicative GRAPE, commuting (Zhang et al. 2025, "Group Representational Position
Encoding", arXiv 2512.07805, sec. 3.1, ICLR 2026): a position n acts as exp(n omega L) with
rank-2 skew generators on the canonical coordinate planes and *learned* angular frequencies
omega = exp(log_freq), started at RoPE's log-uniform spectrum: RoPE whose spectrum trains.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._validation import check_bool, check_even, check_number, check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument
from posenc.kernels.rotary_torch import apply_rotary


class GRAPE(PositionalEncoding):
    """Commuting multiplicative GRAPE (MS-GRAPE with canonical planes; arXiv 2512.07805, sec.
    3.1), as its official code trains it (model-architectures/GRAPE
    ``model/llama-mha-grape-m-nonctx.py`` @135ee30, ``MSGRAPECommuting`` and its
    ``apply_rotary_emb``).

    Plane j pairs dimensions (j, j + D/2) (half-split) and turns by angle t omega_j,
    omega_j = exp(log_freq_j), log_freq started at log(base^(-2j/D)) (RoPE's spectrum) and
    trained; the reference's rotation direction:

        y_j = x_j cos(t omega_j) + x_{j+D/2} sin(t omega_j)
        y_{j+D/2} = -x_j sin(t omega_j) + x_{j+D/2} cos(t omega_j)

    i.e. RoPE's rotation by -t omega_j: a query at i and a key at j score
    q^T R(omega (i - j)) k, RoPE's score at the mirrored positions c - i, c - j (tested). Exactly
    relative (the planes commute). With ``learnable=False`` and the initial spectrum it is that
    mirrored RoPE. The reference takes angles in float32 and rounds cos/sin to bfloat16; posenc
    takes them in float64 from the float32 parameters and rounds once. The learned log_freq
    multiplies the position: cast to bf16 it is another spectrum (p 2^-9 omega radians off near
    position p); keep it float32 (autocast does).

    Args:
        head_dim: D (positive, even).
        num_key_value_heads: 1 (default): one spectrum for every head (the reference's
            ``share_across_heads=True``); H_kv: a spectrum per key/value head
            (``share_across_heads=False``; query head h reads h // (H / H_kv)).
        base: the initial spectrum's base (10000, the reference's ``grape_base``).
        learnable: log_freq a parameter (True, the reference's default) or a frozen buffer.

    Raises:
        ValueError: head_dim not positive even; num_key_value_heads not a positive integer;
            base <= 1; at rotate time, head counts that are not multiples of
            num_key_value_heads.
        TypeError: learnable not a bool.
    """

    name = "grape"
    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("head_dim",)

    def __init__(self, head_dim: int, num_key_value_heads: int = 1, *, base: float = 10000.0,
                 learnable: bool = True) -> None:
        super().__init__()
        check_even(head_dim, "head_dim")
        check_positive_int(num_key_value_heads, "num_key_value_heads")
        check_number(base, "base", gt=1)
        check_bool(learnable, "learnable")
        self.head_dim, self.num_key_value_heads, self.base = head_dim, num_key_value_heads, float(base)
        spectrum = 1.0 / self.base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        log_freq = spectrum.log().expand(num_key_value_heads, -1).clone()  # (H_kv, D/2)
        if learnable:
            self.log_freq = nn.Parameter(log_freq)
        else:
            self.register_buffer("log_freq", log_freq)

    @property
    def inv_freq(self) -> Tensor:
        """float32 (H_kv, D/2), radians per token: exp(log_freq), the current spectrum."""
        return self.log_freq.detach().exp()

    def _turn(self, x: Tensor, positions: Tensor, what: str) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{what}: last dimension {x.shape[-1]} != head_dim {self.head_dim}")
        heads = x.shape[1]
        if heads % self.num_key_value_heads:
            raise InvalidArgument(f"{what}: {heads} heads is not a multiple of grape's {self.num_key_value_heads} "
                                  "spectra (num_key_value_heads)")
        omega = self.log_freq.to(torch.float64).exp()  # (H_kv, D/2); the gradient flows through
        angles = positions.to(torch.float64)[..., None, :, None] * omega[:, None, :]  # (..., H_kv, T, D/2)
        if heads > self.num_key_value_heads:
            angles = angles.repeat_interleave(heads // self.num_key_value_heads, dim=-3)
        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        # the reference turns by -angle: RoPE's formula with sin negated, half-split pairs
        return apply_rotary(x, torch.cat((cos, cos), -1), -torch.cat((sin, sin), -1))

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) turned at their positions ((T,) or (B, T)),
        each in its own dtype (float32 arithmetic, float64 for float64 inputs).

        Raises:
            ValueError: a last dimension other than head_dim; head counts that are not
                multiples of num_key_value_heads.
        """
        return self._turn(q, q_positions, "q"), self._turn(k, k_positions, "k")

    def extra_repr(self) -> str:
        learn = "learnable" if isinstance(self.log_freq, nn.Parameter) else "frozen"
        return (f"head_dim={self.head_dim}, spectra={self.num_key_value_heads}, base={self.base:g}, {learn}, "
                f"omega in [{math.exp(float(self.log_freq.min())):.3g}, {math.exp(float(self.log_freq.max())):.3g}]")
