"""The documented import path of :mod:`posenc.sequences`: positions and masks for padded and
packed batches, and the FlexAttention mask_mods (documents, key padding, sliding window,
chunks). Re-exports only; each name is the object in :mod:`posenc.sequences`."""

from __future__ import annotations

from posenc.sequences import (  # noqa: F401 (re-exported)
    MaskMod,
    check_padding_mask,
    chunked_mask_mod,
    document_ids_from_positions,
    document_mask,
    document_mask_mod,
    key_padding_mask,
    key_padding_mask_mod,
    positions_from_document_ids,
    positions_from_padding_mask,
    sliding_window_mask_mod,
)
from posenc.sequences import __all__  # noqa: F401 (the same public names)
