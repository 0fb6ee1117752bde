"""A GGUF file's metadata and a few small tensors, read with every length checked first.

The layout is the GGUF format of llama.cpp (``ggml/include/gguf.h``, ``ggml/src/gguf.cpp``,
``gguf_init_from_file_impl``; versions 2 and 3, little-endian)::

    "GGUF"  u32 version  u64 tensor_count  u64 kv_count
    kv_count x   (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to general.alignment (default 32), then the tensor data

where a string is ``u64 length`` + UTF-8 bytes and an array value is ``u32 element_type,
u64 count`` + the elements.

Why not ``gguf.GGUFReader``: it parses every field and every tensor of the file up front and
trusts the counts written in it (an array of 2^40 strings is a Python loop of 2^40 steps, a
truncated file an ``IndexError`` of numpy's). This reader is for position metadata only: it
memory-maps the file, checks each count and length against the bytes that are left
*before* reading or allocating anything (a count of n elements needs n x their smallest
size in the file), keeps the scalar values and the small numeric arrays (at most
:data:`MAX_KEPT_ARRAY` elements, not under ``tokenizer.``), skips the rest, and reads a tensor's
data only when asked, for the 1-D float tensors of a few hundred values that hold position
factors. Every failure is an :class:`~posenc.errors.InvalidArgument` of one line naming the
file and what is wrong; nothing else escapes.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.errors import InvalidArgument

__all__ = ["VALUE_TYPES", "GGUFFile", "TensorInfo", "read_gguf"]

#: GGUF value types (``enum gguf_type``, ggml/include/gguf.h): code -> (name, struct format or None).
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
    4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"),
    8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"), 12: ("FLOAT64", "<d"),
}
_STRING, _ARRAY = 8, 9
#: ggml tensor types this reader decodes (``enum ggml_type``): code -> (name, bytes per element, format).
TENSOR_TYPES: dict[int, tuple[str, int, str]] = {0: ("F32", 4, "f"), 1: ("F16", 2, "e")}
#: Numeric arrays longer than this are skipped, not kept (per-layer arrays are at most
#: LLAMA_MAX_LAYERS = 512 long; sections 4).
MAX_KEPT_ARRAY = 65536
#: The longest string value kept (architecture names, scaling types); longer ones are skipped.
MAX_KEPT_STRING = 4096
#: The most dimensions of a tensor (GGML_MAX_DIMS).
MAX_DIMS = 4


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: name, shape (ggml order: fastest dimension first), ggml type code and
    byte offset from the start of the data section."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFFile:
    """What :func:`read_gguf` kept of a file.

    Attributes:
        path: the file.
        version: the GGUF version (2 or 3).
        metadata: key -> value for the scalar keys (ints, floats, bools, strings up to
            :data:`MAX_KEPT_STRING` bytes) and the numeric or bool arrays of at most
            :data:`MAX_KEPT_ARRAY` elements (as lists) outside ``tokenizer.``.
        types: key -> its GGUF value type name (``"FLOAT32"``, ``"ARRAY[INT32]"``, ...), for
            every key of the file, kept or not.
        tensors: name -> :class:`TensorInfo`, for every tensor of the file.
        data_start: the byte offset of the data section.
        size: the file's size in bytes.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    types: dict[str, str]
    tensors: dict[str, TensorInfo]
    data_start: int
    size: int

    def tensor_values(self, name: str, *, count: int) -> list[float]:
        """The ``count`` values of the 1-D F32 / F16 tensor ``name``, as Python floats.

        Raises:
            InvalidArgument: no such tensor, not 1-D of ``count`` elements, another ggml type, or
                its data past the end of the file.
        """
        info = self.tensors.get(name)
        if info is None:
            raise self.error(f"no tensor {name!r}")
        if info.shape != (count,):
            raise self.error(f"tensor {name!r} has shape {list(info.shape)}, expected [{count}]")
        if info.ggml_type not in TENSOR_TYPES:
            raise self.error(f"tensor {name!r} has ggml type {info.ggml_type}; position factors are read from "
                             f"{[t[0] for t in TENSOR_TYPES.values()]}")
        _, width, fmt = TENSOR_TYPES[info.ggml_type]
        start, nbytes = self.data_start + info.offset, count * width
        if start + nbytes > self.size:
            raise self.error(f"tensor {name!r} ({nbytes} bytes at offset {info.offset}) runs past the end of the file")
        with open(self.path, "rb") as handle:
            handle.seek(start)
            raw = handle.read(nbytes)
        if len(raw) != nbytes:
            raise self.error(f"tensor {name!r}: the file changed while it was read")
        return [float(x) for x in struct.unpack(f"<{count}{fmt}", raw)]

    def error(self, text: str) -> InvalidArgument:
        return InvalidArgument(f"GGUF file {self.path}: {text}")


class _Cursor:
    """A position in the mapped file; every read checks the bytes left first."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.path, self.pos, self.size = data, path, 0, len(data)

    def error(self, text: str) -> InvalidArgument:
        return InvalidArgument(f"GGUF file {self.path}: {text}")

    def need(self, nbytes: int, what: str) -> None:
        if nbytes > self.size - self.pos:
            raise self.error(f"{what} needs {nbytes} bytes at offset {self.pos}, the file has {self.size - self.pos} "
                             f"left (truncated or corrupt)")

    def unpack(self, fmt: str, what: str) -> Any:
        width = struct.calcsize(fmt)
        self.need(width, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += width
        return value

    def count(self, what: str, smallest: int) -> int:
        """A u64 count of items of at least ``smallest`` bytes each, checked against the bytes left."""
        n = self.unpack("<Q", what)
        if n * smallest > self.size - self.pos:
            raise self.error(f"{what} is {n} items of at least {smallest} bytes each, more than the {self.size - self.pos} "
                             f"bytes left in the file")
        return n

    def string(self, what: str, keep: bool = True) -> str | None:
        n = self.count(f"{what} (a string's length)", 1)
        start = self.pos
        self.pos += n
        if not keep or n > MAX_KEPT_STRING:
            return None
        try:
            return bytes(self.data[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} is not UTF-8") from None


def _smallest(value_type: int) -> int:
    """The fewest bytes one value of this type takes in the file."""
    if value_type == _STRING:
        return 8
    if value_type == _ARRAY:
        return 12
    return struct.calcsize(VALUE_TYPES[value_type][1])


def _value_type(cursor: _Cursor, what: str) -> int:
    code = cursor.unpack("<I", what)
    if code not in VALUE_TYPES:
        raise cursor.error(f"{what} is value type {code}, not a GGUF type (0-12)")
    return code


def _read_value(cursor: _Cursor, key: str, code: int, depth: int = 0) -> tuple[Any, str]:
    """(value or None when skipped, its type name)."""
    name, fmt = VALUE_TYPES[code]
    if fmt is not None:
        return cursor.unpack(fmt, f"key {key!r}"), name
    if code == _STRING:
        return cursor.string(f"key {key!r}"), name
    element = _value_type(cursor, f"key {key!r} (its element type)")
    count = cursor.count(f"key {key!r} (an array)", _smallest(element))
    kind = f"ARRAY[{VALUE_TYPES[element][0]}]"
    element_fmt = VALUE_TYPES[element][1]
    if element_fmt is not None:
        nbytes = count * struct.calcsize(element_fmt)
        keep = count <= MAX_KEPT_ARRAY and not key.startswith("tokenizer.")
        values = list(struct.unpack_from(f"<{count}{element_fmt[1:]}", cursor.data, cursor.pos)) if keep else None
        cursor.pos += nbytes
        return values, kind
    if depth >= 1 and element == _ARRAY:
        raise cursor.error(f"key {key!r} nests arrays more than two deep")
    for _ in range(count):  # strings or arrays: each one's length is checked as it is skipped
        if element == _STRING:
            cursor.string(f"key {key!r} (an element)", keep=False)
        else:
            _read_value(cursor, key, element, depth + 1)
    return None, kind


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Read a GGUF file's metadata and tensor table (not its tensor data), bounded by its size.

    Args:
        path: a GGUF file (``*.gguf``).

    Returns:
        A :class:`GGUFFile`.

    Raises:
        InvalidArgument: no such file or not readable; not GGUF (magic), a version other than
            2 or 3 (a big-endian file reads as a huge version), a count or length past the end of
            the file, an unknown value type, a key not UTF-8, a tensor of more than 4 dimensions
            or whose data would lie past the end of the file. One line, naming the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        handle = open(path, "rb")  # noqa: SIM115 (closed by the with below; opening is what may fail)
    except OSError as error:
        raise InvalidArgument(f"GGUF file {path}: cannot read it ({error.strerror or error})") from None
    with handle:
        if size < 24:
            raise InvalidArgument(f"GGUF file {path}: {size} bytes, shorter than a GGUF header (24 bytes)")
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as error:
            raise InvalidArgument(f"GGUF file {path}: cannot map it ({error})") from None
        try:
            return _parse(_Cursor(data, path), path, size)
        finally:
            data.close()


def _parse(cursor: _Cursor, path: Path, size: int) -> GGUFFile:
    if bytes(cursor.data[:4]) != b"GGUF":
        raise cursor.error(f"not a GGUF file (magic {bytes(cursor.data[:4])!r}, expected b'GGUF')")
    cursor.pos = 4
    version = cursor.unpack("<I", "the version")
    if version not in (2, 3):
        raise cursor.error(f"GGUF version {version}; posenc reads versions 2 and 3, little-endian")
    tensor_count = cursor.unpack("<Q", "the tensor count")
    kv_count = cursor.count("the metadata count", 13)  # key length, one byte of key, type, one byte of value
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for index in range(kv_count):
        key = cursor.string(f"metadata key #{index}")
        if key is None:
            raise cursor.error(f"metadata key #{index} is longer than {MAX_KEPT_STRING} bytes")
        if key in types:
            raise cursor.error(f"key {key!r} appears twice")
        code = _value_type(cursor, f"key {key!r}")
        value, kind = _read_value(cursor, key, code)
        types[key] = kind
        if value is not None:
            metadata[key] = value
    if tensor_count * 24 > cursor.size - cursor.pos:  # name length, n_dims, type, offset
        raise cursor.error(f"the tensor count {tensor_count} needs more than the {cursor.size - cursor.pos} bytes left")
    tensors: dict[str, TensorInfo] = {}
    for index in range(tensor_count):
        name = cursor.string(f"tensor #{index}'s name")
        n_dims = cursor.unpack("<I", f"tensor {name!r}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cursor.error(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
        cursor.need(8 * n_dims, f"tensor {name!r}'s shape")
        shape = struct.unpack_from(f"<{n_dims}Q", cursor.data, cursor.pos)
        cursor.pos += 8 * n_dims
        ggml_type = cursor.unpack("<I", f"tensor {name!r}'s type")
        offset = cursor.unpack("<Q", f"tensor {name!r}'s offset")
        if name is not None:
            tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), ggml_type, offset)
    alignment = metadata.get("general.alignment", 32)
    if types.get("general.alignment", "UINT32") != "UINT32" or not isinstance(alignment, int) or alignment < 1 \
            or alignment & (alignment - 1):
        raise cursor.error(f"key 'general.alignment' must be a UINT32 power of two, got {alignment!r}")
    data_start = -(-cursor.pos // alignment) * alignment
    for info in tensors.values():
        # every ggml type takes more than one bit per element (IQ1_S: 1.5625), so count / 8 bytes bounds the data
        if info.offset > size or info.count // 8 > size - data_start - min(info.offset, size):
            raise cursor.error(f"tensor {info.name!r} ({list(info.shape)} at offset {info.offset}) lies past the end "
                               f"of the file ({size} bytes)")
    return GGUFFile(path, version, metadata, types, tensors, data_start, size)
