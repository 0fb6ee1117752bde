"""RoPE and its context extensions, with Hugging Face interop: the public face (re-exports only).

>>> import json, posenc.rope
>>> rope = posenc.rope.from_hf_config(json.load(open("config.json")))     # doctest: +SKIP
>>> rope.to_hf_dict()                                   # the same RoPE fields back    # doctest: +SKIP
>>> report = posenc.rope.inspect_config(config)                                       # doctest: +SKIP
>>> posenc.rope.plot_rope_inspection(report, "rope.png")                              # doctest: +SKIP

Where things live: the scalings themselves (linear / PI, ntk, dynamic, yarn, llama3,
longrope), one :class:`~posenc.encodings.rope.scaling.RopeType` record each, in
:mod:`posenc.encodings.rope.scaling`; :func:`rope_frequencies` (dispatching on a Hugging Face
``rope_scaling`` dict) and :class:`RoPE` in :mod:`posenc.encodings.rope.rotary`;
:func:`apply_rotary` in :mod:`posenc.kernels.rotary_torch`; config.json interop
(:func:`read_hf_config`, :func:`write_hf_config`, :func:`inspect_config`) and the context
extensions (:func:`extension_scaling`, :data:`EXTENSION_METHODS`) in
:mod:`posenc.hf_config.rope`; :func:`from_hf_config` and :func:`to_hf_dict` in
:mod:`posenc.hf_config.encoding`; the figure :func:`plot_rope_inspection` in
:mod:`posenc.hf_config.rope_figure` (matplotlib imported only when one is drawn, so ``import
posenc.rope`` needs torch and numpy only; nothing here imports the lab).
"""

from __future__ import annotations

from posenc.encodings.rope.rotary import RoPE, rope_frequencies
from posenc.encodings.rope.scaling import (
    LENGTH_DEPENDENT,
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    rope_type_of,  # noqa: F401 (importable from here before the split)
    yarn_correction_dim,  # noqa: F401
)
from posenc.hf_config.encoding import from_hf_config, to_hf_dict
from posenc.hf_config.rope import (
    EXTENSION_METHODS,
    HF_ROPE_FIELDS,
    RopeInspection,
    extension_scaling,
    inspect_config,
    read_hf_config,
    write_hf_config,
)
from posenc.hf_config.rope_figure import plot_rope_inspection
from posenc.kernels.rotary_torch import apply_rotary

__all__ = [
    "RoPE", "rope_frequencies", "apply_rotary", "ROPE_INIT_FUNCTIONS", "LENGTH_DEPENDENT", "HF_ROPE_FIELDS",
    "from_hf_config", "to_hf_dict", "inspect_config", "RopeInspection", "plot_rope_inspection",
    "EXTENSION_METHODS", "extension_scaling", "ROPE_TYPES", "read_hf_config", "write_hf_config",
]

