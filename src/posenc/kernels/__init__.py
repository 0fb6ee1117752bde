"""Optional fused kernels (Triton) and the rule that decides when posenc uses them.

The kernels live in submodules that import ``triton`` (the optional ``gpu`` extra:
``pip install posenc[gpu]``); this package itself imports only torch, so ``import posenc``
never needs Triton. The encodings ask :func:`use_triton` before each call; it says yes on a
CUDA tensor, outside ``torch.compile`` (the compiler fuses the torch rotation itself), when
Triton imports and the switch is on.

The switch: :data:`TRITON_ENABLED`, read from the environment variable ``POSENC_TRITON``
(``0`` turns the kernels off) when posenc is imported, and settable at run time::

    import posenc.kernels
    posenc.kernels.TRITON_ENABLED = False   # every call takes the plain torch path

Layer: imported by ``encodings/`` (docs/design.md); imports only torch, ``triton`` and
``_validation``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch
from torch import Tensor

#: Whether posenc may use its Triton kernels (``POSENC_TRITON=0`` in the environment turns them off).
TRITON_ENABLED: bool = os.environ.get("POSENC_TRITON", "1").strip().lower() not in ("0", "false", "off", "no")

#: The device types whose tensors go to the Triton kernels. Only CUDA in normal use; the
#: tests add "cpu" together with ``TRITON_INTERPRET=1`` (Triton's interpreter runs kernels on
#: CPU tensors) to exercise the kernel path of :class:`~posenc.RoPE` and ``apply_rotary``.
KERNEL_DEVICES: tuple[str, ...] = ("cuda",)

_rotary: ModuleType | None = None
_rotary_failed = False


def rotary_kernels() -> ModuleType | None:
    """The :mod:`posenc.kernels.rotary_triton` module, or None where Triton does not import.

    Imported on first use (a CUDA call), never by ``import posenc``; an import failure
    (no Triton, a broken install) is remembered, and every call then takes the torch path.
    """
    global _rotary, _rotary_failed
    if _rotary is None and not _rotary_failed:
        if importlib.util.find_spec("triton") is None:
            _rotary_failed = True
        else:
            try:
                _rotary = importlib.import_module(".rotary_triton", __name__)
            except ImportError:
                _rotary_failed = True
    return _rotary


def use_triton(*tensors: Tensor) -> bool:
    """True when the Triton kernels should run on these tensors: the switch is on, every
    tensor's device type is in :data:`KERNEL_DEVICES`, the call is not being traced by
    ``torch.compile``, and Triton imports. Reads no tensor values (no device sync)."""
    if not TRITON_ENABLED or torch.compiler.is_compiling():
        return False
    if not all(t.device.type in KERNEL_DEVICES for t in tensors):
        return False
    return rotary_kernels() is not None


__all__ = ["TRITON_ENABLED", "KERNEL_DEVICES", "rotary_kernels", "use_triton"]
