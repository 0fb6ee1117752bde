"""Learned absolute positions (GPT-2, BERT, OPT), added to token embeddings.

Shapes: B batch, T sequence length, d d_model.
"""

from __future__ import annotations


import torch
from torch import Tensor, nn

from posenc._validation import check_number, check_positions, check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument, InvalidType


class LearnedAbsolute(PositionalEncoding):
    """A learned table of absolute position vectors (GPT-2 / BERT style), added to x.

    Args:
        num_positions: the positions the table holds: 0 .. num_positions - 1.
        dim: d_model.
        init_std: the normal initialisation's standard deviation (GPT-2 uses 0.01-0.02).
        offset: rows stored before position 0 (default 0): the table has ``num_positions +
            offset`` rows and position p reads row ``p + offset``, so positions from
            ``-offset`` on are accepted. OPT's table (transformers' ``OPTLearnedPositionalEmbedding``)
            has offset 2: its padding tokens get position -1 (row 1) from the attention mask.

    Hook: ``embed``. Raises ValueError, naming the table size, for positions outside the table.
    """

    name = "learned"
    hooks = frozenset({Hook.EMBED})
    model_sizes = {"dim": "d_model", "num_positions": "max_positions"}

    def __init__(self, num_positions: int, dim: int, *, init_std: float = 0.02, offset: int = 0) -> None:
        super().__init__()
        check_positive_int(num_positions, "num_positions")
        check_positive_int(dim, "dim")
        check_number(init_std, "init_std", ge=0)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidType(f"offset must be an int, got {type(offset).__name__}")
        if offset < 0:
            raise InvalidArgument(f"offset must be >= 0, got {offset}")
        self.offset = offset
        self.weight = nn.Parameter(torch.randn(num_positions + offset, dim) * init_std)

    @property
    def max_positions(self) -> int:
        return self.weight.shape[0] - self.offset

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, dim) + weight[positions + offset]. Raises ValueError for positions past the
        table or below ``-offset``: outside torch.compile only (the check reads the values;
        under torch.compile it is skipped, and an out-of-range index is the indexing kernel's
        error)."""
        rows = positions + self.offset if self.offset else positions
        if torch.compiler.is_compiling():
            check_positions(rows[..., :0])
            return x + self.weight[rows].to(x.dtype)
        if self.offset and rows.numel() and int(rows.min()) < 0:
            raise InvalidArgument(f"positions: the learned table starts at position {-self.offset}, "
                                  f"got {int(positions.min())}")
        check_positions(rows)
        if rows.numel() and int(rows.max()) >= self.weight.shape[0]:
            raise InvalidArgument(
                f"positions: the learned table holds positions {-self.offset}..{self.max_positions - 1}, "
                f"got {int(positions.max())}; build it with a larger num_positions"
            )
        return x + self.weight[rows].to(x.dtype)

    def extra_repr(self) -> str:
        offset = f", offset={self.offset}" if self.offset else ""
        return f"num_positions={self.max_positions}, dim={self.weight.shape[1]}{offset}"
