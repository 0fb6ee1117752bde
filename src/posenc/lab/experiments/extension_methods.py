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
from posenc.rope import EXTENSION_METHODS, extension_scaling

__all__ = ["BRANCH_METHODS", "branch_defaults", "check_extension_method", "rope_like"]

#: The training-free branch-merge maps (:mod:`posenc.attention.branches`), rows ``rope+<name>``:
#: :func:`posenc.encodings.branched` of the trained RoPE with :func:`branch_defaults`.
BRANCH_METHODS = ("self_extend", "rerope", "leaky_rerope", "dca", "string", "lm_infinite", "streaming_llm")

#: The context the references' defaults are stated for (Llama 2's 4096 tokens): the lab's
#: models train at a few hundred bytes, so each window scales by L0 / 4096.
REFERENCE_LENGTH = 4096


def branch_defaults(method: str, training_length: int) -> dict[str, Any]:
    """A branch map's parameters for a model trained at L0 = ``training_length``: the
    reference's defaults for Llama 2 (L0 = 4096) with every window scaled by L0 / 4096
    (at least 1), ratios and counts kept:

    - self_extend: group_size 8, neighbor_window 1024 -> L0 / 4 (datamllab/LongLM);
    - rerope: window 512 -> L0 / 8, training_length L0 (bojone/rerope);
    - leaky_rerope: window L0 / 8, scaling_factor 16, training_length L0;
    - dca: chunk_size 3 L0 / 4, local_size L0 / 16 (ChunkLlama's ``replace_with_chunkllama``);
    - string: training_length L0, shifted_offset int(0.33 L0) (its default), local_value
      128 -> L0 / 32 (HKUNLP/STRING);
    - lm_infinite: local_branch L0, global_branch 100 -> L0 / 40 (LM-Infinite's Llama 2 scripts);
    - streaming_llm: start_size 4, recent_size 512 -> L0 / 8 (mit-han-lab/streaming-llm).

    Raises:
        InvalidArgument: an unknown method.
    """
    def scaled(value: int) -> int:
        return max(1, round(value * training_length / REFERENCE_LENGTH))

    defaults = {
        "self_extend": {"group_size": 8, "neighbor_window": scaled(1024)},
        "rerope": {"window": scaled(512), "training_length": training_length},
        "leaky_rerope": {"window": scaled(512), "scaling_factor": 16, "training_length": training_length},
        "dca": {"chunk_size": scaled(3072), "local_size": scaled(256)},
        "string": {"training_length": training_length, "local_value": scaled(128)},
        "lm_infinite": {"local_branch": training_length, "global_branch": scaled(100)},
        "streaming_llm": {"start_size": 4, "recent_size": scaled(512)},
    }
    if method not in defaults:
        raise InvalidArgument(f"method must be one of {list(defaults)}, got {method!r}")
    return defaults[method]


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
    parameters :func:`branch_defaults` (L0), the same at every length (the factor unused).

    Raises:
        InvalidArgument: an unknown method.
    """
    if method in EXTENSION_METHODS:
        return rope_like(rope, extension_scaling(method, params["factor"], params["original_max_position_embeddings"]))
    if method in BRANCH_METHODS:  # training-free: the same map at every length (no factor)
        rope_like(rope, None)  # the trained model's encoding must be a RoPE here too
        return branched(rope, method, **branch_defaults(method, params["original_max_position_embeddings"]))
    raise InvalidArgument(f"extension_methods: unknown method {method!r}; choose from "
                          f"{list(EXTENSION_METHODS) + list(BRANCH_METHODS)}")


def check_extension_method(method: str) -> None:
    """Raise as :func:`_extension_encoding` would for ``method`` (before any training)."""
    _extension_encoding(RoPE(8), method, {"factor": 2.0, "original_max_position_embeddings": 8})
