"""Argument validators shared by every layer of posenc (private).

Each raises with a message that names the argument and the allowed values, so that bad
input fails at construction time, in one line, wherever it enters (docs/errors.md).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from posenc.errors import InvalidArgument, InvalidType


def check_positions(positions: Tensor, argname: str = "positions") -> None:
    """Raise if ``positions`` is not a 1-D or 2-D integer tensor of non-negative values.

    Raises:
        TypeError: ``positions`` is not a tensor of an integer dtype.
        ValueError: it has the wrong rank or a negative entry.
    """
    if not isinstance(positions, Tensor):
        raise InvalidType(f"{argname} must be an integer torch.Tensor, got {type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise InvalidType(f"{argname} must have an integer dtype (e.g. torch.long), got {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise InvalidArgument(f"{argname} must have shape (T,) or (B, T), got {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise InvalidArgument(f"{argname} must be >= 0, got a minimum of {int(positions.min())}")


def check_position_values(positions: Tensor, argname: str = "positions") -> None:
    """Raise unless ``positions`` is an integer tensor (of any rank) of non-negative values.

    The values are read (a device sync, a graph break) only outside ``torch.compile``; the
    type and dtype are always checked.

    Raises:
        TypeError: ``positions`` is not a tensor of an integer dtype.
        ValueError: a negative entry.
    """
    if not isinstance(positions, Tensor):
        raise InvalidType(f"{argname} must be an integer torch.Tensor, got {type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise InvalidType(f"{argname} must have an integer dtype (e.g. torch.long), got {positions.dtype}")
    if positions.numel() and not torch.compiler.is_compiling() and int(positions.min()) < 0:
        raise InvalidArgument(f"{argname} must be >= 0, got a minimum of {int(positions.min())}")


def fits_sequence_positions(positions: Tensor, length: int, batch: int) -> bool:
    """Whether ``positions`` has the shape of one coordinate per token for a call of
    ``length`` tokens and ``batch`` rows: (length,), or (B, length) with B in {1, batch}."""
    if positions.dim() == 1:
        return positions.shape[0] == length
    return positions.dim() == 2 and positions.shape[1] == length and positions.shape[0] in (1, batch)


def check_sequence_positions(positions: Tensor, *, length: int, batch: int, argname: str = "positions") -> Tensor:
    """The positions of one attention call of ``length`` tokens and ``batch`` rows, checked:
    an integer tensor (T,) or (B, T), B in {1, batch}, of values >= 0 (read outside
    ``torch.compile`` only). Returns ``positions`` unchanged.

    Raises:
        TypeError: not an integer tensor.
        ValueError: another rank or shape (the message gives the allowed ones), a negative entry.
    """
    check_positions(positions[..., :0] if torch.compiler.is_compiling() else positions, argname)
    if not fits_sequence_positions(positions, length, batch):
        raise InvalidArgument(f"{argname} must have shape ({length},) or ({batch}, {length}), got {tuple(positions.shape)}")
    return positions


def check_even(value: int, argname: str) -> None:
    """Raise ValueError unless ``value`` is a positive even int (pairs of dimensions)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 2 or value % 2:
        raise InvalidArgument(f"{argname} must be a positive even integer, got {value!r}")


def check_positive_int(value: int, argname: str) -> None:
    """Raise ValueError unless ``value`` is an int >= 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{argname} must be an integer >= 1, got {value!r}")


def is_real_number(value) -> bool:
    """True for an int or float that is not a bool (True is not a size or a rate)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(value, argname: str, *, gt: float | None = None, ge: float | None = None) -> float:
    """Return ``value`` as a float; raise ValueError unless it is a finite real number (not a
    bool) with value > gt and >= ge (when given). The message names the argument and the range."""
    bound = f" > {gt:g}" if gt is not None else f" >= {ge:g}" if ge is not None else ""
    if not is_real_number(value) or not math.isfinite(value) or (gt is not None and not value > gt) \
            or (ge is not None and not value >= ge):
        raise InvalidArgument(f"{argname} must be a finite number{bound}, got {value!r}")
    return float(value)


def check_bool(value, argname: str) -> bool:
    """Raise TypeError unless ``value`` is a bool (a truthy string is not an answer)."""
    if not isinstance(value, bool):
        raise InvalidType(f"{argname} must be a bool (True or False), got {value!r}")
    return value


def broadcast_shape(*shapes: tuple[int, ...]) -> torch.Size:
    """The broadcast of ``shapes`` (NumPy rules), or ValueError.

    ``torch.broadcast_shapes`` would do, but its first call imports sympy (through
    torch.fx's symbolic shapes): a third of a second and ~40 MB inside the first forward.
    Written with plain loops and comparisons so that ``torch.compile`` traces it with
    symbolic sizes (``max(..., default=)`` and sets of sizes are not traceable).
    """
    ndim = 0
    for shape in shapes:
        ndim = max(ndim, len(shape))
    result = []
    for sizes in zip(*((1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes)):
        size = 1
        for other in sizes:
            if other != 1:
                if size != 1 and other != size:
                    raise InvalidArgument(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
                size = other
        result.append(size)
    return torch.Size(result)


def check_device(device, argname: str = "device") -> torch.device:
    """``device`` as a torch.device, refused unless this machine has it.

    Raises:
        ValueError: not a device string torch understands (the message gives examples), or a
            device type this torch build or machine lacks (CUDA on a CPU build, an index past
            the device count), named with what is available.
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidArgument(f"{argname} must be a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if parsed.type == "cpu":
        return parsed
    backend = getattr(torch, parsed.type, None)
    if parsed.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    available = backend is not None and hasattr(backend, "is_available") and backend.is_available()
    if not available:
        raise InvalidArgument(
            f"{argname}={str(device)!r}: this machine or torch build has no {parsed.type} device "
            f"(torch {torch.__version__}); use {argname}='cpu'"
        )
    count = backend.device_count() if hasattr(backend, "device_count") else None
    if parsed.index is not None and count is not None and parsed.index >= count:
        raise InvalidArgument(f"{argname}={str(device)!r}: only {count} {parsed.type} device(s) here (indices 0..{count - 1})")
    return parsed
