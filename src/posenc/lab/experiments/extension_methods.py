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
from posenc.encodings.rope.branched import branched
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument, InvalidType
from posenc.position_maps import MAP_METHODS
from posenc.rope import EXTENSION_METHODS, extension_scaling

__all__ = ["BRANCH_METHODS", "branch_defaults", "check_extension_method", "rope_like"]

#: The training-free branch-merge maps (:mod:`posenc.attention.branches`), rows ``rope+<name>``:
#: :func:`posenc.encodings.branched` of the trained RoPE with :func:`branch_defaults`. The
#: names of :data:`posenc.position_maps.MAP_METHODS`, in its order.
BRANCH_METHODS = tuple(MAP_METHODS)


def branch_defaults(method: str, training_length: int) -> dict[str, Any]:
    """A branch map's parameters for a model trained at L0 = ``training_length``: the
    reference's defaults for Llama 2 (L0 = 4096) with every window scaled by L0 / 4096
    (at least 1), ratios and counts kept: :meth:`posenc.position_maps.MapMethod.scaled_defaults`
    of the method's record (its reference and numbers are stated there).

    Raises:
        InvalidArgument: an unknown method.
    """
    if method not in MAP_METHODS:
        raise InvalidArgument(f"method must be one of {list(MAP_METHODS)}, got {method!r}")
    return MAP_METHODS[method].scaled_defaults(training_length)


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
    :func:`posenc.rope.extension_scaling` (method, s, L0). A branch-merge map of
    :data:`BRANCH_METHODS` is ``rope`` with that map (:func:`posenc.encodings.branched`), its
    parameters :func:`branch_defaults` (L0), the same at every length; the factor is unused but
    by a map that takes one (windowed_yarn's far YaRN, at the scalings' factor).

    Raises:
        InvalidArgument: an unknown method.
    """
    if method in EXTENSION_METHODS:
        return rope_like(rope, extension_scaling(method, params["factor"], params["original_max_position_embeddings"]))
    if method in BRANCH_METHODS:  # training-free: the same map at every length (but a map's own factor)
        rope_like(rope, None)  # the trained model's encoding must be a RoPE here too
        chosen = branch_defaults(method, params["original_max_position_embeddings"])
        if "factor" in chosen:  # windowed_yarn's far YaRN: the scalings' factor at this length
            chosen["factor"] = params["factor"]
        return branched(rope, method, **chosen)
    raise InvalidArgument(f"extension_methods: unknown method {method!r}; choose from "
                          f"{list(EXTENSION_METHODS) + list(BRANCH_METHODS)}")


def check_extension_method(method: str) -> None:
    """Raise as :func:`_extension_encoding` would for ``method`` (before any training)."""
    _extension_encoding(RoPE(8), method, {"factor": 2.0, "original_max_position_embeddings": 8})
