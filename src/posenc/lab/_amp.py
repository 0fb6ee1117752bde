"""Mixed precision for training and evaluation (private): ``torch.autocast`` by dtype name.

bf16 only: its exponent range is float32's, so no loss scaling is needed (fp16 would need a
GradScaler). The model's logits are float32 (``TransformerLM`` casts its head's output), so the
loss is computed in float32 either way.
"""

from __future__ import annotations

import contextlib

import torch
from posenc.errors import InvalidArgument

#: The dtype names ``autocast`` accepts (None: float32 throughout).
AUTOCAST_DTYPES = ("bfloat16",)


def check_autocast(value, argname: str = "autocast") -> None:
    """Raise ValueError unless ``value`` is None or one of :data:`AUTOCAST_DTYPES`."""
    if value is not None and value not in AUTOCAST_DTYPES:
        raise InvalidArgument(f"{argname} must be None (float32) or one of {AUTOCAST_DTYPES}, got {value!r}")


def autocast_context(device: torch.device | str, autocast: str | None):
    """``torch.autocast(device type, dtype)`` for a dtype name, or a no-op context for None."""
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, autocast))
