"""The encodings and their registry: one line per encoding in :data:`REGISTRY`."""

from __future__ import annotations

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.sinusoidal import Sinusoidal, sinusoidal_table
from posenc.encodings.learned import LearnedAbsolute
from posenc.encodings.rope.multiaxis import AxialRoPE, MRoPE, mrope_position_ids
from posenc.encodings.score_bias import ScoreBias
from posenc.encodings.alibi import ALiBi, alibi_slopes
from posenc.encodings.t5 import T5RelativeBias, t5_relative_position_bucket
from posenc.encodings.kerple import Kerple
from posenc.encodings.fire import FIRE
from posenc.encodings.cope import CoPE
from posenc.encodings.fox import FoX
from posenc.encodings.path import PaTH
from posenc.encodings.grape_additive import GRAPEAdditive
from posenc.encodings.grape_contextual import ContextualGRAPE
from posenc.encodings.shaw import Shaw
from posenc.encodings.transformer_xl import TransformerXL
from posenc.encodings.rope import ProportionalRoPE, RoPE, XPos, apply_rotary, rope_frequencies
from posenc.encodings.rope.fope import FoPE, fope_frequencies
from posenc.encodings.rope.liere import LieRE
from posenc.encodings.rope.comrope import COMROPE_VARIANTS, ComRoPE
from posenc.encodings.rope.vo_rope import VORoPE
from posenc.encodings.rope.grape import GRAPE
from posenc.encodings.rope.videorope import VideoRoPE, videorope_position_ids
from posenc.encodings.rope.mhrope import MHRoPE
from posenc.encodings.irope import IRoPE
from posenc.encodings.rope.branched import BRANCHED_METHODS, BranchedRoPE, branched
from posenc.errors import InvalidArgument

#: name -> encoding class. A new encoding is one file (or one class in its family's file)
#: and one line here; its class declares ``hooks`` and ``model_sizes`` (encodings/base.py).
REGISTRY: dict[str, type[PositionalEncoding]] = {
    cls.name: cls
    for cls in (
        NoPE, Sinusoidal, LearnedAbsolute, RoPE, XPos, ALiBi, T5RelativeBias, Kerple, FIRE, Shaw, TransformerXL,
        ProportionalRoPE,
        MRoPE, AxialRoPE, VideoRoPE, MHRoPE,
        IRoPE,
        CoPE, FoX, PaTH,
        FoPE,
        LieRE, ComRoPE,
        VORoPE, GRAPE,
        GRAPEAdditive, ContextualGRAPE,
    )
}


def available() -> list[str]:
    """The registered encoding names, in registry order."""
    return list(REGISTRY)


def encoding_class(name: str) -> type[PositionalEncoding]:
    """The class registered under ``name``.

    Raises:
        ValueError: an unknown name; the message lists the available ones.
    """
    if not isinstance(name, str) or name not in REGISTRY:
        raise InvalidArgument(f"unknown encoding {name!r}; available: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def create(name: str, **kwargs) -> PositionalEncoding:
    """Build the encoding registered under ``name`` with its constructor's arguments,
    e.g. ``create("rope", head_dim=64)``, ``create("alibi", num_heads=8)``.

    Raises:
        ValueError: an unknown name (the message lists the available ones), or an invalid
            argument. TypeError: a missing or unexpected argument.
    """
    return encoding_class(name)(**kwargs)


def create_for_model(
    name: str, *, d_model: int, num_heads: int, head_dim: int, max_positions: int, causal: bool = True,
    num_layers: int = 1, **kwargs
) -> PositionalEncoding:
    """Build ``name`` sized for a transformer: :meth:`PositionalEncoding.for_model`, which
    passes the constructor the sizes its class declares in ``model_sizes``; ``kwargs`` are the
    encoding's own options.

    Raises:
        ValueError: an unknown name (the message lists the available ones), or an invalid
            argument. TypeError: an option that is one of the encoding's sizes, or unexpected.
    """
    return encoding_class(name).for_model(
        d_model=d_model, num_heads=num_heads, head_dim=head_dim, max_positions=max_positions, causal=causal,
        num_layers=num_layers, **kwargs
    )


__all__ = [
    "REGISTRY", "available", "create", "create_for_model", "encoding_class",
    "Hook", "PositionalEncoding", "NoPE", "Sinusoidal", "LearnedAbsolute", "RoPE", "ALiBi", "T5RelativeBias", "ScoreBias",
    "XPos", "ProportionalRoPE", "FoPE", "LieRE", "ComRoPE", "COMROPE_VARIANTS", "VORoPE", "GRAPE", "GRAPEAdditive", "ContextualGRAPE", "Kerple", "FIRE", "Shaw", "TransformerXL",
    "MRoPE", "AxialRoPE", "mrope_position_ids", "VideoRoPE", "videorope_position_ids", "MHRoPE",
    "IRoPE",
    "CoPE", "FoX", "PaTH",
    "BranchedRoPE", "branched", "BRANCHED_METHODS",
    "sinusoidal_table", "alibi_slopes", "t5_relative_position_bucket", "rope_frequencies", "fope_frequencies", "apply_rotary",
]
