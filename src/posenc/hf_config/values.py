"""The numbers of a config dict, read in one place: every size, count, length and rate that
posenc takes from a Hugging Face ``config.json`` goes through :func:`config_int` or
:func:`config_number`, so that every family refuses a malformed value the same way, with
posenc's errors (:mod:`posenc.errors`), before anything is allocated.

What is refused (docs/errors.md, "Malformed configs"):

- a top level that is not a JSON object (:func:`config_mapping`, :class:`InvalidType`);
- a number spelled as a string (``"10000.0"``, ``"64"``), a bool where a number is needed
  (``true`` is an int to Python, not a size), a float where a size is needed (``64.0``):
  :class:`InvalidType`;
- ``null`` for a required key: :class:`MissingKey`; for ``rope_theta``: :class:`InvalidType`
  (transformers keeps the null and fails when it builds the model);
- NaN, +-inf, zero or negative sizes and values out of range: :class:`InvalidArgument`, the
  message naming the key and the allowed range;
- sizes past the bounds below, which no model has and which would allocate without bound
  (a ``head_dim`` of 2^40 asks for 2^39 frequencies, 4 TB).

Bounds (inclusive): head widths (``head_dim``, ``qk_rope_head_dim``, ``global_head_dim``)
:data:`MAX_HEAD_DIM` = 65536; positions and context lengths (``max_position_embeddings``,
``original_max_position_embeddings``, windows, chunks, and L0 x factor of a scaling)
:data:`MAX_POSITIONS` = 2^31; layers :data:`MAX_LAYERS` = 65536; heads :data:`MAX_HEADS` =
65536; any other size (``hidden_size``, buckets, ...) :data:`MAX_SIZE` = 2^31; ``rope_theta``
at most :data:`MAX_ROPE_THETA` = 1e30 (the lowest frequency of a 128-wide head, theta^(-126/128),
stays a normal float32 up to about 1e38); a learned table (rows x width) at most :data:`MAX_TABLE_ELEMENTS` = 2^30
(4 GiB in float32).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc.errors import InvalidArgument, InvalidType, MissingKey

#: The widest head posenc reads from a config (the largest in use is 512, Gemma 4's global layers).
MAX_HEAD_DIM = 65536
#: The most positions (a context length, a window, a chunk) posenc reads from a config.
MAX_POSITIONS = 2**31
#: The most decoder layers, and attention heads, posenc reads from a config.
MAX_LAYERS = 65536
MAX_HEADS = 65536
#: Any other size (hidden_size, T5's buckets and distance, ...).
MAX_SIZE = 2**31
#: The largest rope_theta (the largest in use is about 1e8).
MAX_ROPE_THETA = 1e30
#: The most elements of a learned position table built from a config (rows x width).
MAX_TABLE_ELEMENTS = 2**30

#: key -> its upper bound, for the keys whose bound is not :data:`MAX_SIZE` (aliases included).
_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("head_dim", "qk_rope_head_dim", "global_head_dim", "rotary_dim"), MAX_HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "original_max_position_embeddings", "n_positions", "sliding_window",
                     "attention_chunk_size", "relative_attention_max_distance", "floor_scale", "max_seq_len"),
                    MAX_POSITIONS),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "n_layers"), MAX_LAYERS),
    **dict.fromkeys(("num_attention_heads", "num_heads", "n_head", "n_heads", "num_key_value_heads"), MAX_HEADS),
    "relative_attention_num_buckets": MAX_HEADS,
}

_REQUIRED = object()


def bound_of(key: str) -> int:
    """The largest value posenc reads for the size ``key`` (see the module's docstring)."""
    return _BOUNDS.get(key, MAX_SIZE)


def config_mapping(config: Any, what: str = "config") -> Mapping[str, Any]:
    """``config`` itself when it is a dict (a parsed JSON object).

    Raises:
        InvalidType: a list, a string, a number, null: not a config.json object.
    """
    if not isinstance(config, Mapping):
        raise InvalidType(f"{what} must be a dict (a parsed config.json object), got {_kind(config)}")
    return config


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r:.60}"


def check_size(value: Any, name: str, *, minimum: int = 1, maximum: int | None = None, key: str | None = None) -> int:
    """``value`` as a size read from a config: an int (not a bool, a float or a string) in
    [minimum, maximum]; ``maximum`` defaults to the bound of ``key`` (else of ``name``).

    Raises:
        InvalidType: not an int. InvalidArgument: out of range (the message gives it).
    """
    maximum = bound_of(key or name) if maximum is None else maximum
    if isinstance(value, bool) or not isinstance(value, int):
        hint = " (a number, not a string)" if isinstance(value, str) else ""
        raise InvalidType(f"{name} must be an integer in [{minimum}, {maximum}]{hint}, got {_kind(value)}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{name} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def check_real(value: Any, name: str, *, gt: float | None = None, ge: float | None = None,
               le: float | None = None) -> float:
    """``value`` as a finite real number read from a config (an int or float, not a bool or a
    string), > gt, >= ge and <= le where given.

    Raises:
        InvalidType: not a number. InvalidArgument: NaN, inf or out of range.
    """
    low = f" > {gt:g}" if gt is not None else f" >= {ge:g}" if ge is not None else ""
    span = low + (f" and <= {le:g}" if le is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = " (a number, not a string)" if isinstance(value, str) else ""
        raise InvalidType(f"{name} must be a finite number{span}{hint}, got {_kind(value)}")
    if not math.isfinite(value) or (gt is not None and not value > gt) or (ge is not None and not value >= ge) \
            or (le is not None and not value <= le):
        raise InvalidArgument(f"{name} must be a finite number{span}, got {value!r}")
    return float(value)


def config_int(config: Mapping[str, Any], key: str, *, default: Any = _REQUIRED, minimum: int = 1,
               maximum: int | None = None, where: str = "config") -> Any:
    """``config[key]`` as a size (:func:`check_size`, bounded by :func:`bound_of`); a missing or
    null key gives ``default``, or MissingKey naming it when there is none."""
    value = config.get(key)
    if value is None:
        if default is _REQUIRED:
            raise MissingKey(f"{where}: needs {key!r}" + (" (it is null)" if key in config else ""))
        return default
    return check_size(value, f"{where}[{key!r}]", minimum=minimum, maximum=maximum, key=key)


def config_number(config: Mapping[str, Any], key: str, *, default: Any = _REQUIRED, nullable: bool = True,
                  gt: float | None = None, ge: float | None = None, le: float | None = None,
                  where: str = "config") -> Any:
    """``config[key]`` as a finite real number (:func:`check_real`); a missing key gives
    ``default`` (MissingKey when there is none); a null one too where ``nullable``, else
    InvalidType."""
    if key not in config or (config[key] is None and nullable):
        if default is _REQUIRED:
            raise MissingKey(f"{where}: needs {key!r}")
        return default
    return check_real(config[key], f"{where}[{key!r}]", gt=gt, ge=ge, le=le)


def check_rope_dict(params: Mapping[str, Any], where: str) -> None:
    """A rope dict's own checks before any rope_type reads it: ``rope_type`` / ``type`` a
    string, and every number in it (lists included; bools are flags) finite and within
    +-:data:`MAX_ROPE_THETA`, so that no rope_type's formula meets an inf, a NaN or a value
    whose logarithm underflows (a ``beta_fast`` of 1e308 makes L0 / (2 pi beta) 0). Each
    rope_type's own rules (factor >= 1, ...) are :class:`~posenc.RoPE`'s.

    Raises:
        InvalidType: a rope_type that is not a string. InvalidArgument: a number out of range.
    """
    for key in ("rope_type", "type"):
        if key in params and not isinstance(params[key], str):
            raise InvalidType(f"{where}[{key!r}] must be a string (a rope_type name), got {_kind(params[key])}")
    for key, value in params.items():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, (int, float)) and not isinstance(item, bool) and \
                    not (math.isfinite(item) and abs(item) <= MAX_ROPE_THETA):
                raise InvalidArgument(f"{where}[{key!r}] must hold finite numbers of magnitude <= "
                                      f"{MAX_ROPE_THETA:g}, got {value!r:.80}")


def rotary_dim_of(head_dim: int, partial_rotary_factor: Any, where: str = "config") -> int:
    """The rotated width transformers computes, ``int(head_dim * partial_rotary_factor)``,
    refused unless an even int in [2, head_dim]: a factor of 0 would rotate nothing (Phi then
    runs as NoPE without a word) and one above 1 more than the head (transformers fails at the
    first forward), so both are refused here, as :class:`~posenc.RoPE` refuses them.

    Raises:
        InvalidType: the factor is not a number. InvalidArgument: it is not in (0, 1], or the
            width it gives is odd or 0.
    """
    factor = check_real(partial_rotary_factor, f"{where}['partial_rotary_factor']", gt=0, le=1)
    width = int(head_dim * factor)
    if width < 2 or width % 2:
        raise InvalidArgument(f"{where}['partial_rotary_factor'] = {partial_rotary_factor!r} gives rotary_dim "
                              f"int({head_dim} x {partial_rotary_factor!r}) = {width}; it must be an even integer in "
                              f"[2, head_dim={head_dim}]")
    return width


def check_table(rows: int, width: int, name: str) -> None:
    """Refuse a learned table of ``rows`` x ``width`` past :data:`MAX_TABLE_ELEMENTS`, before
    it is allocated, with the estimate.

    Raises:
        InvalidArgument: naming the table, its size and the bound.
    """
    if rows * width > MAX_TABLE_ELEMENTS:
        raise InvalidArgument(f"{name}: a learned table of {rows:,} x {width:,} = {rows * width:,} values "
                              f"({rows * width * 4 / 2**30:,.0f} GiB in float32) is past posenc's bound of "
                              f"{MAX_TABLE_ELEMENTS:,} values; refused before allocating it")


def load_config_json(path: str | Path) -> dict[str, Any]:
    """A ``config.json`` file, parsed: a JSON object, or one clear error naming the file.

    Python's json reads NaN, Infinity and -Infinity tokens; the readers refuse them where a
    finite number is needed.

    Raises:
        FileNotFoundError: no such file. InvalidArgument: a folder, not UTF-8, not JSON,
            nested too deep for the parser, or a top level that is not an object.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"CONFIG: {path} does not exist")
    if not path.is_file():
        raise InvalidArgument(f"CONFIG: {path} is not a file")
    try:
        config = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidArgument(f"CONFIG: {path} is not valid JSON ({err})") from None
    except RecursionError:
        raise InvalidArgument(f"CONFIG: {path} is nested too deep to be a model config (the JSON parser's "
                              "recursion limit)") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"CONFIG: {path} must hold a JSON object (a model config.json), got "
                              f"{type(config).__name__}")
    return config
