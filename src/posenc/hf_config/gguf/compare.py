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
#: YaRN's defaults where a dict leaves them out (Hugging Face ``_compute_yarn_parameters``).
_YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}


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
    rows.append(("rope_type", sa.get("rope_type"), sb.get("rope_type")))
    if sa.get("rope_type") == sb.get("rope_type"):
        for name in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"):
            default = _YARN_DEFAULTS.get(name) if sa.get("rope_type") == "yarn" else None
            rows.append((name, sa.get(name, default), sb.get(name, default)))
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


def _probe_positions(context_length: int | None) -> list[list[int]]:
    """Two sets of positions: short (a few tokens) and long (to the end of the context), so that a
    length-dependent scaling (LongRoPE's short and long factors) is compared in both regimes."""
    end = max(64, context_length or 8192)
    short = list(range(16))
    long = sorted({0, 1, 2, 3, 100, 1000, 4095, 4096, 8191, end // 2, end - 1})
    return [short, long]


def _same_rotation(a: PositionalEncoding, b: PositionalEncoding, context_length: int | None) -> bool:
    generator = torch.Generator().manual_seed(0)
    head_dim = a.head_dim
    for positions in _probe_positions(context_length):
        n = len(positions)
        q = torch.randn(1, 1, n, head_dim, dtype=torch.float64, generator=generator)
        k = torch.randn(1, 1, n, head_dim, dtype=torch.float64, generator=generator)
        outputs = []
        for encoding in (a, b):
            pos = torch.tensor(positions)
            if getattr(encoding, "position_axes", 1) == 3:  # M-RoPE: unequal axes, so the sections matter
                pos = torch.stack([pos, pos // 2, pos // 3]).unsqueeze(1)
            outputs.append(encoding.rotate(q, k, pos, pos))
        for x, y in zip(*outputs):
            if not torch.allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE):
                return False
    return True
