"""The extension methods of ``posenc extrapolate``'s ``rope+<method>`` rows, and the one place
that turns a method into the encoding the trained RoPE model runs with (:func:`_extension_encoding`).

Apart from :mod:`posenc.lab.experiments.rope_extension` (which runs the rows) so that the
config (:mod:`posenc.lab.experiments.extrapolation_config`) checks a method name with the same
function, without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.encodings.base import PositionalEncoding
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument, InvalidType
from posenc.rope import EXTENSION_METHODS, extension_scaling

__all__ = ["BRANCH_METHODS", "check_extension_method", "rope_like"]

#: The training-free branch-merge maps (:mod:`posenc.attention.branches`), rows ``rope+<name>``
#: once :func:`_extension_encoding` builds them.
BRANCH_METHODS = ("self_extend", "rerope", "leaky_rerope", "dca", "string", "lm_infinite", "streaming_llm")


def rope_like(rope: RoPE, scaling: Mapping[str, Any] | None) -> RoPE:
    """A RoPE with ``rope``'s geometry (head_dim, rotary_dim, base, layout) and ``scaling``."""
    if not isinstance(rope, RoPE):
        raise InvalidType(f"the model's encoding must be a posenc RoPE to rescale, got {type(rope).__name__}")
    return RoPE(rope.head_dim, rotary_dim=rope.rotary_dim, base=rope.base, interleaved=rope.interleaved, scaling=scaling)


def _extension_encoding(rope: RoPE, method: str, params: Mapping[str, Any]) -> PositionalEncoding:
    """The encoding row ``rope+method`` runs the trained model with, from its RoPE ``rope``.

    ``params``: ``factor`` (s >= 1; 1 is the plain RoPE) and ``original_max_position_embeddings``
    (L0, the training length), plus the method's own. A RoPE scaling of
    :data:`posenc.rope.EXTENSION_METHODS` is a RoPE of ``rope``'s geometry with
    :func:`posenc.rope.extension_scaling` (method, s, L0).

    Raises:
        InvalidArgument: a branch-merge map (:data:`BRANCH_METHODS`): not yet an extension row;
            any other unknown method.
    """
    if method in EXTENSION_METHODS:
        return rope_like(rope, extension_scaling(method, params["factor"], params["original_max_position_embeddings"]))
    if method in BRANCH_METHODS:
        raise InvalidArgument(f"extension_methods: {method!r} (a branch-merge map of posenc.attention.branches) is not "
                              f"an extension row yet; today's: {list(EXTENSION_METHODS)}")
    raise InvalidArgument(f"extension_methods: unknown method {method!r}; choose from {list(EXTENSION_METHODS)}")


def check_extension_method(method: str) -> None:
    """Raise as :func:`_extension_encoding` would for ``method`` (before any training)."""
    _extension_encoding(RoPE(8), method, {"factor": 2.0, "original_max_position_embeddings": 8})
