"""posenc: transformer positional encodings behind one API.

>>> import posenc
>>> rope = posenc.create("rope", head_dim=64)
>>> out = posenc.attention(q, k, v, rope, causal=True)        # doctest: +SKIP

``import posenc`` needs only torch and numpy; figures, the CLI and interop import their
libraries when used.
"""

from __future__ import annotations

from posenc import rope
from posenc._version import __version__
from posenc.attention import BACKENDS, attention
from posenc.encodings import (
    REGISTRY,
    Hook,
    ALiBi,
    LearnedAbsolute,
    NoPE,
    PositionalEncoding,
    ProportionalRoPE,
    RoPE,
    ScoreBias,
    Sinusoidal,
    T5RelativeBias,
    FIRE,
    IRoPE,
    Kerple,
    Shaw,
    TransformerXL,
    XPos,
    MRoPE,
    AxialRoPE,
    mrope_position_ids,
    VideoRoPE,
    videorope_position_ids,
    MHRoPE,
    CoPE,
    FoX,
    PaTH,
    FoPE,
    LieRE,
    ComRoPE,
    VORoPE,
    GRAPE,
    GRAPEAdditive,
    ContextualGRAPE,
    alibi_slopes,
    apply_rotary,
    available,
    create,
    create_for_model,
    rope_frequencies,
    sinusoidal_table,
    t5_relative_position_bucket,
)


__all__ = [
    "__version__", "attention", "BACKENDS", "available", "create", "create_for_model", "REGISTRY",
    "Hook", "PositionalEncoding", "NoPE", "Sinusoidal", "LearnedAbsolute", "RoPE", "ALiBi", "T5RelativeBias", "ScoreBias",
    "XPos", "ProportionalRoPE", "FoPE", "LieRE", "ComRoPE", "VORoPE", "GRAPE", "GRAPEAdditive", "ContextualGRAPE", "Kerple", "FIRE", "Shaw", "TransformerXL",
    "MRoPE", "AxialRoPE", "mrope_position_ids", "VideoRoPE", "videorope_position_ids", "MHRoPE",
    "IRoPE",
    "CoPE", "FoX", "PaTH",
    "sinusoidal_table", "alibi_slopes", "t5_relative_position_bucket", "rope_frequencies", "apply_rotary",
]
