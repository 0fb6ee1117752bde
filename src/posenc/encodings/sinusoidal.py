"""The sinusoidal encoding (Vaswani et al. 2017, section 3.5), added to token embeddings.

Shapes: B batch, T sequence length, d d_model.
"""

from __future__ import annotations


import torch
from torch import Tensor

from posenc._validation import check_even, check_number, check_positions, check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument


SINUSOIDAL_LAYOUTS = ("interleaved", "concat")


def sinusoidal_angles(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Angles p * base^(-2i/dim), computed in float64: positions (...) -> (..., dim // 2)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    return positions.to(torch.float64).unsqueeze(-1) * inv_freq


def sinusoidal_encode(positions: Tensor, dim: int, base: float = 10000.0, layout: str = "interleaved",
                      dtype: torch.dtype = torch.float32) -> Tensor:
    """Sinusoidal vectors for integer ``positions`` (...), (..., dim) in ``dtype`` (float32 by
    default; float64 keeps the float64 angles' sin and cos unrounded).

    ``layout="interleaved"`` is Vaswani et al. (2017, section 3.5): PE(p, 2i) = sin(p w_i),
    PE(p, 2i+1) = cos(p w_i), w_i = base^(-2i/dim). ``layout="concat"`` is the
    [sin || cos] layout of fairseq, x-transformers and Transformer-XL.
    """
    angles = sinusoidal_angles(positions, dim, base)
    sin, cos = angles.sin(), angles.cos()
    if layout == "interleaved":
        table = torch.stack((sin, cos), dim=-1).flatten(-2)
    elif layout == "concat":
        table = torch.cat((sin, cos), dim=-1)
    else:
        raise InvalidArgument(f"layout must be one of {SINUSOIDAL_LAYOUTS}, got {layout!r}")
    return table.to(dtype)


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """The sinusoidal table of Vaswani et al. (2017), eq. in section 3.5.

    Returns a float32 tensor (num_positions, dim) with ``PE[p, 2i] = sin(p / base^(2i/dim))``
    and ``PE[p, 2i+1] = cos(p / base^(2i/dim))`` (even columns sin, odd columns cos). Angles
    are computed in float64 and cast at the end.

    Raises:
        ValueError: ``num_positions`` < 1, ``dim`` not a positive even integer, or ``base`` not
            a finite number > 1.
    """
    check_positive_int(num_positions, "num_positions")
    check_even(dim, "dim")
    check_number(base, "base", gt=1)
    return sinusoidal_encode(torch.arange(num_positions), dim, base)


class Sinusoidal(PositionalEncoding):
    """Fixed sinusoidal absolute encoding (Vaswani et al., 2017, section 3.5), added to x.

    Args:
        dim: d_model, the width of the vectors (positive, even).
        base: the wavelength base, 10000 in the paper.
        layout: "interleaved" (Vaswani, default) or "concat" ([sin || cos], fairseq).

    Hook: ``embed``. Unbounded: any non-negative position has a vector.
    """

    name = "sinusoidal"
    hooks = frozenset({Hook.EMBED})
    model_sizes = {"dim": "d_model"}

    def __init__(self, dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        check_even(dim, "dim")
        if layout not in SINUSOIDAL_LAYOUTS:
            raise InvalidArgument(f"layout must be one of {SINUSOIDAL_LAYOUTS}, got {layout!r}")
        check_number(base, "base", gt=1)
        self.dim, self.base, self.layout = dim, float(base), layout

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise InvalidArgument(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        # >= 0 reads the values (a graph break under torch.compile): checked outside it only
        check_positions(positions[..., :0] if torch.compiler.is_compiling() else positions)
        wide = torch.promote_types(x.dtype, torch.float32)  # float64 x: float64 vectors
        pe = sinusoidal_encode(positions.to(x.device), self.dim, self.base, self.layout, dtype=wide)
        return x + pe.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, layout={self.layout!r}"
