"""The RoPE wing: the rope_type table (:mod:`.scaling`), RoPE and p-RoPE (:mod:`.rotary`), xPos
(:mod:`.xpos`), multi-axis RoPE (M-RoPE, axial; :mod:`.multiaxis`), Ministral 3's query-scaled
RoPE (:mod:`.query_scaled`). The rotation itself is
written once per kernel in :mod:`posenc.kernels` (``rotary_torch``, ``rotary_triton``).
"""

from posenc.encodings.rope.multiaxis import AxialRoPE, MRoPE, mrope_position_ids
from posenc.encodings.rope.query_scaled import QueryScaledRoPE, llama_4_attn_scale
from posenc.encodings.rope.rotary import ProportionalRoPE, RoPE, rope_frequencies
from posenc.encodings.rope.xpos import XPos
from posenc.kernels.rotary_torch import apply_rotary

__all__ = ["RoPE", "ProportionalRoPE", "XPos", "MRoPE", "AxialRoPE", "mrope_position_ids", "rope_frequencies", "apply_rotary",
           "QueryScaledRoPE", "llama_4_attn_scale"]
