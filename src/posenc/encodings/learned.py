"""Learned absolute positions (GPT-2, BERT), added to token embeddings.

Shapes: B batch, T sequence length, d d_model.
"""

from __future__ import annotations


import torch
from torch import Tensor, nn

from posenc._validation import check_number, check_positions, check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument


class LearnedAbsolute(PositionalEncoding):
    """A learned table of absolute position vectors (GPT-2 / BERT style), added to x.

    Args:
        num_positions: rows in the table; positions must be < num_positions.
        dim: d_model.
        init_std: the normal initialisation's standard deviation (GPT-2 uses 0.01-0.02).

    Hook: ``embed``. Raises ValueError, naming the table size, for positions past the table.
    """

    name = "learned"
    hooks = frozenset({Hook.EMBED})
    model_sizes = {"dim": "d_model", "num_positions": "max_positions"}

    def __init__(self, num_positions: int, dim: int, *, init_std: float = 0.02) -> None:
        super().__init__()
        check_positive_int(num_positions, "num_positions")
        check_positive_int(dim, "dim")
        check_number(init_std, "init_std", ge=0)
        self.weight = nn.Parameter(torch.randn(num_positions, dim) * init_std)

    @property
    def max_positions(self) -> int:
        return self.weight.shape[0]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, dim) + weight[positions]. Raises ValueError for positions past the table or
        negative ones: outside torch.compile only (the check reads the values; under torch.compile
        it is skipped, and an out-of-range index is the indexing kernel's error)."""
        if torch.compiler.is_compiling():
            check_positions(positions[..., :0])
            return x + self.weight[positions].to(x.dtype)
        check_positions(positions)
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise InvalidArgument(
                f"positions: the learned table holds positions 0..{self.max_positions - 1}, "
                f"got {int(positions.max())}; build it with a larger num_positions"
            )
        return x + self.weight[positions].to(x.dtype)

    def extra_repr(self) -> str:
        return f"num_positions={self.weight.shape[0]}, dim={self.weight.shape[1]}"
