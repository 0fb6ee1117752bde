"""Two position plans compared by what they compute, layer by layer, each difference named.

Two plans may spell one rotation differently (Llama 3.1's ``llama3`` dict in its config.json,
the same frequencies as per-pair factors in its GGUF file): a layer's encodings are compared
by the rotation they apply, q and k rotated at probe positions in float64, and only where
those differ are their settings compared to name what differs (base, rotary width, scaling
type, factor, original context, attention factor, YaRN betas, layout, M-RoPE sections). Spans
are compared as the model sees them within its context: a sliding window at least as long as
the context hides no key there, so it is a full span (Phi-3's 262,144-token window over
131,072 positions).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.plan import PositionPlan, describe_encoding, layer_ranges

__all__ = ["PlanDifference", "plan_differences"]

#: Relative tolerance on the rotated q and k: GGUF stores bases, factors and attention factors
#: as float32 (2^-24 relative), which moves a rotation by far less.
TOLERANCE = 1e-6
#: Per rope_type, the defaults of the keys its dict may leave out (YaRN's: Hugging Face
#: ``_compute_yarn_parameters``).
_DEFAULTS = {"yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}}
#: Per rope_type, the keys that set no frequency (LongRoPE's factor only sets the attention
#: factor, compared with the settings).
_NOT_FREQUENCIES = {"longrope": frozenset({"factor"})}


@dataclass(frozen=True)
class PlanDifference:
    """One way two plans differ, on some layers.

    Attributes:
        layers: the layer indices where it holds.
        field: what differs: ``"encoding"``, ``"head_dim"``, ``"rotary_dim"``, ``"base"``,
            ``"interleaved"``, ``"mrope_section"``, ``"rope_type"``, ``"factor"``,
            ``"original_max_position_embeddings"``, ``"attention_factor"``, ``"beta_fast"``,
            ``"beta_slow"``, ``"truncate"``, ``"frequencies"`` (the rotations differ and no
            setting above does), ``"span"``, ``"window"``, ``"sinks"``, ``"softcap"``, ``"layers"``.
        value: the first plan's value (as text).
        reference: the second plan's value (as text).
        key: where the first plan read it (a GGUF key or tensor name), when known.
    """

    layers: tuple[int, ...]
    field: str
    value: str
    reference: str
    key: str | None = None

    def __str__(self) -> str:
        where = f" ({self.key})" if self.key else ""
        return f"layers {layer_ranges(self.layers)}: {self.field}{where}: {self.value} vs {self.reference}"


def plan_differences(plan: PositionPlan, reference: PositionPlan, *, context_length: int | None = None,
                     keys: Sequence[Mapping[str, str]] | None = None) -> list[PlanDifference]:
    """How ``plan`` differs from ``reference``, layer by layer (empty: they compute the same).

    Args:
        plan, reference: the plans (e.g. a GGUF file's and its source config's).
        context_length: the model's context; a sliding window at least this long counts as full.
        keys: per layer of ``plan``, field -> the key it was read from
            (:attr:`~posenc.hf_config.gguf.GGUFPositions.keys`), to name in each difference.

    Returns:
        One :class:`PlanDifference` per (field, values, key), its layers gathered.
    """
    found: dict[tuple[str, str, str, str | None], list[int]] = {}
    if len(plan) != len(reference):
        return [PlanDifference(tuple(range(max(len(plan), len(reference)))), "layers", str(len(plan)),
                               str(len(reference)), None if not keys else keys[0].get("layers"))]
    for index, (mine, theirs) in enumerate(zip(plan, reference)):
        rows = _encoding_differences(mine.encoding, theirs.encoding, context_length)
        span_a, span_b = _effective_span(mine, context_length), _effective_span(theirs, context_length)
        if span_a != span_b:
            rows.append(("span", _span_text(span_a), _span_text(span_b)))
        for name in ("sinks", "softcap"):
            if getattr(mine, name) != getattr(theirs, name):
                rows.append((name, repr(getattr(mine, name)), repr(getattr(theirs, name))))
        for name, value, ref in rows:
            key = None if not keys else keys[index].get(name)
            found.setdefault((name, value, ref, key), []).append(index)
    return [PlanDifference(tuple(layers), name, value, ref, key) for (name, value, ref, key), layers in found.items()]


def _effective_span(layer: Any, context_length: int | None) -> tuple[str, int | None]:
    if layer.span == "sliding" and context_length is not None and layer.window >= context_length:
        return "full", None
    return layer.span, layer.window


def _span_text(span: tuple[str, int | None]) -> str:
    return span[0] if span[1] is None else f"{span[0]} {span[1]}"


def _encoding_differences(a: PositionalEncoding | None, b: PositionalEncoding | None,
                          context_length: int | None) -> list[tuple[str, str, str]]:
    if a is None or b is None:
        return [] if a is b else [("encoding", describe_encoding(a), describe_encoding(b))]
    if not (Hook.ROTATE in a.hooks and Hook.ROTATE in b.hooks):
        same = type(a) is type(b) and a.config() == b.config()
        return [] if same else [("encoding", describe_encoding(a), describe_encoding(b))]
    if getattr(a, "head_dim", None) == getattr(b, "head_dim", None) and _same_rotation(a, b, context_length):
        return []
    rows = [(name, repr(x), repr(y)) for name, x, y in _settings(a, b) if not _equal(x, y)]
    return rows or [("frequencies", describe_encoding(a), describe_encoding(b))]


def _settings(a: PositionalEncoding, b: PositionalEncoding) -> list[tuple[str, Any, Any]]:
    """The settings that name a rotary difference, in the order a reader checks them."""
    rows: list[tuple[str, Any, Any]] = []
    if type(a) is not type(b):
        rows.append(("encoding", type(a).__name__, type(b).__name__))
    for name in ("head_dim", "rotary_dim", "base", "interleaved", "mrope_section", "mrope_interleaved",
                 "attention_factor"):
        rows.append((name, getattr(a, name, None), getattr(b, name, None)))
    sa, sb = _scaling(a), _scaling(b)
    kind = sa.get("rope_type")
    rows.append(("rope_type", kind, sb.get("rope_type")))
    if kind == sb.get("rope_type"):
        defaults = _DEFAULTS.get(kind, {})
        for name in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"):
            if name not in _NOT_FREQUENCIES.get(kind, ()):
                rows.append((name, sa.get(name, defaults.get(name)), sb.get(name, defaults.get(name))))
    return rows


def _scaling(encoding: PositionalEncoding) -> dict[str, Any]:
    scaling = dict(getattr(encoding, "scaling", None) or {})
    kind = scaling.pop("type", None)
    scaling.setdefault("rope_type", kind or "default")
    return scaling


def _equal(x: Any, y: Any) -> bool:
    numbers = isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
    if numbers and (isinstance(x, float) or isinstance(y, float)):
        return math.isclose(x, y, rel_tol=TOLERANCE)
    return x == y


def _rotary_profile(encoding: PositionalEncoding, seq_len: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per rotated pair, the angle per position theta_i and the magnitude m_i (the attention
    factor) at length ``seq_len``, from the encoding's own cos and sin at position 1, float64;
    None for an encoding without ``cos_sin``."""
    cos_sin = getattr(encoding, "cos_sin", None)
    rotary = getattr(encoding, "rotary_dim", None)
    if cos_sin is None or rotary is None:
        return None
    extra = {"seq_len": seq_len} if "seq_len" in inspect.signature(cos_sin).parameters else {}
    cos, sin = cos_sin(torch.tensor([1]), torch.float64, **extra)
    cos, sin = cos.reshape(-1)[:rotary], sin.reshape(-1)[:rotary]
    cos, sin = (cos[0::2], sin[0::2]) if encoding.interleaved else (cos[: rotary // 2], sin[: rotary // 2])
    # every angle per position is below pi (theta_i <= 1 rad), so atan2 recovers it to float64 precision
    return torch.atan2(sin, cos), torch.hypot(sin, cos)


def _same_rotation(a: PositionalEncoding, b: PositionalEncoding, context_length: int | None) -> bool:
    """The same rotation: the same pairing and widths, and per pair the same angle per position and
    magnitude (relative :data:`TOLERANCE`: GGUF stores float32) at a short and at the full length
    (LongRoPE's two regimes); encodings without ``cos_sin`` by their recorded constructor config."""
    for name in ("head_dim", "rotary_dim", "interleaved", "mrope_section", "mrope_interleaved"):
        if getattr(a, name, None) != getattr(b, name, None):
            return False
    if getattr(a, "position_axes", 1) != getattr(b, "position_axes", 1):  # M-RoPE against RoPE
        return False
    for seq_len in (1, max(2, context_length or 8192)):
        pa, pb = _rotary_profile(a, seq_len), _rotary_profile(b, seq_len)
        if pa is None or pb is None:
            return type(a) is type(b) and a.config() == b.config()
        if not all(torch.allclose(x, y, rtol=TOLERANCE, atol=1e-300) for x, y in zip(pa, pb)):
            return False
    return True
