"""NoPE: no positional encoding.
"""

from __future__ import annotations



from posenc.encodings.base import PositionalEncoding


class NoPE(PositionalEncoding):
    """No positional encoding (Kazemnejad et al., NeurIPS 2023, "The Impact of Positional
    Encoding on Length Generalization in Transformers").

    Uses no hook. Order reaches the model only through the causal mask; a bidirectional
    encoder without positions is permutation-equivariant.
    """

    name = "nope"
    hooks = frozenset()
