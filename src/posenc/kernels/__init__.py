"""Optional fused kernels (Triton on CUDA, C++ on the CPU) and the rules that decide when
posenc uses them.

The kernels live in submodules that import ``triton`` (the optional ``gpu`` extra:
``pip install posenc[gpu]``); this package itself imports only torch, so ``import posenc``
never needs Triton. The encodings ask :func:`use_triton` before each call; it says yes on a
CUDA tensor, outside ``torch.compile`` (the compiler fuses the torch rotation itself), when
Triton imports and the switch is on.

The switch: :data:`TRITON_ENABLED`, read from the environment variable ``POSENC_TRITON``
(``0`` turns the kernels off) when posenc is imported, and settable at run time::

    import posenc.kernels
    posenc.kernels.TRITON_ENABLED = False   # every call takes the plain torch path

The fused CPU kernels (:mod:`posenc.kernels.rotary_cpu`, RoPE's rotation in one pass over
memory, bit-identical to the torch path; :mod:`~posenc.kernels.fire_cpu`, FIRE's attention
forward; :mod:`~posenc.kernels.relpos_cpu`, the attention of Shaw, Transformer-XL, T5, ALiBi,
Kerple and FoX, forward and backward) are compiled from C++ at their first use, **by default**
(issue 38: the defaults are the measured numbers): the first build on a machine runs g++ and
ninja (seconds per kernel), later processes load it from torch's extension cache. They share
one build, lock and load helper (:mod:`posenc.kernels._build`) and run as ``torch.ops.posenc.*``
operators (``rotary_cpu``, ``fire_attention_cpu``, ``relpos_attention_cpu`` and its backward),
which the profiler names and ``torch.compile`` traces. The rule, asked before each uncompiled
CPU call (:func:`use_cpu_kernel` for RoPE, ``usable`` in each kernel's module):

- The environment variable ``POSENC_CPU_KERNEL``, read at import: unset or ``1``, a kernel is
  built (or loaded) at its first CPU call and used wherever it covers the call (RoPE: float32,
  bfloat16, float16, last dimension contiguous; ``apply_rotary``'s ``out=``, allocating and in
  place calls and the backward of the allocating one), the torch path elsewhere; ``0`` never
  uses them (nor builds them on a call). :data:`CPU_KERNEL_ENABLED` (``False`` = off) and
  :data:`CPU_KERNEL_AUTOBUILD` are settable at run time.
- ``posenc.kernels.build_cpu_rotary()`` (``build_cpu_fire``, ``build_cpu_relpos``) builds or
  loads one now, e.g. before timing, or with ``CPU_KERNEL_AUTOBUILD = False``.
- Under ``torch.compile`` the torch formula is traced as before (the compiler fuses it; the
  operator ``torch.ops.posenc.rotary_cpu`` traces too, for code that calls it itself).
- A machine without a compiler (or ninja, which the package requires): one ``RuntimeWarning``
  per kernel at its first call, then the torch path.

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

def _env_switch(name: str) -> str:
    return os.environ.get(name, "").strip().lower()


#: Whether posenc may use its fused CPU kernel once built (``POSENC_CPU_KERNEL=0`` turns it off).
CPU_KERNEL_ENABLED: bool = _env_switch("POSENC_CPU_KERNEL") not in ("0", "false", "off", "no")

#: Whether a kernel's first uncompiled CPU call builds it (default; ``POSENC_CPU_KERNEL=0`` does not).
CPU_KERNEL_AUTOBUILD: bool = CPU_KERNEL_ENABLED

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


_cpu_rotary: ModuleType | None = None


def cpu_rotary_kernel() -> ModuleType:
    """The :mod:`posenc.kernels.rotary_cpu` module (imported on first use; building is separate)."""
    global _cpu_rotary
    if _cpu_rotary is None:
        _cpu_rotary = importlib.import_module(".rotary_cpu", __name__)
    return _cpu_rotary


def build_cpu_rotary(verbose: bool = False) -> bool:
    """Build (or load from torch's extension cache) the fused CPU RoPE kernel into this process,
    after which ``apply_rotary`` uses it on CPU tensors (the rule: this module's docstring).

    Returns True when it is loaded; False, with one ``RuntimeWarning``, where it cannot be built
    (no C++ compiler or ninja, an unwritable cache), and every call keeps the torch path. The
    first build on a machine takes seconds (g++ -O3 -march=native), later ones load the cache.
    """
    return cpu_rotary_kernel().build(verbose)


def build_cpu_fire(verbose: bool = False) -> bool:
    """Build (or load) the fused CPU forward of FIRE attention (:mod:`posenc.kernels.fire_cpu`,
    under the same switch and rules as the RoPE kernel); True when loaded, else one warning."""
    return importlib.import_module(".fire_cpu", __name__).build(verbose)


def build_cpu_relpos(verbose: bool = False) -> bool:
    """Build (or load) the fused CPU attention of Shaw and Transformer-XL
    (:mod:`posenc.kernels.relpos_cpu`); the same switch and return value as :func:`build_cpu_rotary`."""
    return importlib.import_module(".relpos_cpu", __name__).build(verbose)


def use_cpu_kernel(*tensors: Tensor) -> bool:
    """True when the fused CPU kernel should be tried on these tensors: the switch
    :data:`CPU_KERNEL_ENABLED` is on, every tensor is on the CPU, the call is not being traced
    by ``torch.compile``, and the kernel is built (or :data:`CPU_KERNEL_AUTOBUILD` builds it now)."""
    if not CPU_KERNEL_ENABLED or torch.compiler.is_compiling():
        return False
    if not all(t.device.type == "cpu" for t in tensors):
        return False
    module = cpu_rotary_kernel()
    if module.is_built():
        return True
    return CPU_KERNEL_AUTOBUILD and module.build()


__all__ = ["CPU_KERNEL_AUTOBUILD", "CPU_KERNEL_ENABLED", "KERNEL_DEVICES", "TRITON_ENABLED", "build_cpu_fire", "build_cpu_relpos", "build_cpu_rotary",
           "cpu_rotary_kernel", "rotary_kernels", "use_cpu_kernel", "use_triton"]
