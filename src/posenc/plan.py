"""Per-layer position plans: how each attention layer of a model reads positions.

The models of 2025-2026 do not have one positional encoding but a plan per layer: Llama 4
(NoPE every 4th layer, chunked attention on the others), SmolLM3 (``no_rope_layers``), Cohere2
(RoPE on sliding-window layers, NoPE on the global ones), Gemma 3 (a local and a global RoPE
base), gpt-oss (alternating sliding windows, attention sinks), DeepSeek-V3 (RoPE on part of
each head). A :class:`PositionPlan` states such a plan as data: per decoder layer, the encoding
(a posenc encoding, or None for a layer without positions), the attention span (full, a
sliding window of W keys, or chunks of C positions), whether the layer has attention sinks and
its logit soft-cap.
The rotary width and layout, the base and any scaling or query temperature are the encoding's
own (``RoPE.rotary_dim``, ``interleaved``, ``base``, ``scaling``).

:func:`posenc.hf_config.position_plan` reads one from a Hugging Face config; the integrations
apply it to a model, ``posenc audit`` checks it against the model's own attention, and the lab's
LM takes one. Plain data, no transformers import.

Spans follow transformers' masks (``masking_utils``): a sliding window W lets query position i
see key positions j with i - W < j <= i; a chunk of C lets it see j <= i with j // C == i // C
(:mod:`posenc.mask_rules`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from posenc.encodings.base import PositionalEncoding
from posenc.errors import InvalidArgument, InvalidType

#: The attention spans a layer can have.
SPANS = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerPlan:
    """How one attention layer reads positions.

    Attributes:
        encoding: the layer's positional encoding, or None: the layer sees no positions (NoPE;
            order reaches it through the causal mask only).
        span: ``"full"``, ``"sliding"`` (a window of ``window`` keys, the query's own
            included) or ``"chunked"`` (positions in chunks of ``window``; a query sees the
            keys of its own chunk up to itself).
        window: W or C (a positive int) for ``"sliding"`` and ``"chunked"``; None for ``"full"``.
        layer_type: the config's name for this kind of layer (``layer_types`` entry, e.g.
            ``"sliding_attention"``), or None.
        sinks: whether the layer's softmax has learned attention sinks (gpt-oss: one extra
            logit per head that takes probability mass and contributes no value).
        softcap: the layer's attention logit soft-cap c (Gemma 2: logits become
            c * tanh(logits / c) before the softmax; its config's ``attn_logit_softcapping``,
            Gemma 2 report, section 2), a positive number, or None: no soft-cap.

    Raises:
        InvalidArgument: an unknown span, a window missing, not a positive int, or given with
            a full span; a softcap that is not a positive finite number. InvalidType: an
            encoding that is not a posenc encoding.
    """

    encoding: PositionalEncoding | None = None
    span: str = "full"
    window: int | None = None
    layer_type: str | None = None
    sinks: bool = False
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.encoding is not None and not isinstance(self.encoding, PositionalEncoding):
            raise InvalidType(f"encoding must be a posenc PositionalEncoding or None, got {type(self.encoding).__name__}")
        if self.span not in SPANS:
            raise InvalidArgument(f"span must be one of {SPANS}, got {self.span!r}")
        if self.span == "full":
            if self.window is not None:
                raise InvalidArgument(f"window: a full span has no window, got {self.window!r}")
        elif isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise InvalidArgument(f"window must be a positive int for a {self.span} span, got {self.window!r}")
        if self.softcap is not None and (isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float))
                                         or not math.isfinite(self.softcap) or self.softcap <= 0):
            raise InvalidArgument(f"softcap must be a positive finite number or None, got {self.softcap!r}")

    def describe(self) -> str:
        """One line: the encoding (name and its distinguishing numbers) and the span, e.g.
        ``"rope theta 10000, rotary 64/128, half-split; sliding 4096"``, then ``"sinks"`` and
        ``"softcap 50"`` where the layer has them."""
        parts = [describe_encoding(self.encoding)]
        if self.span != "full":
            parts.append(f"{self.span} {self.window}")
        else:
            parts.append("full")
        if self.sinks:
            parts.append("sinks")
        if self.softcap is not None:
            parts.append(f"softcap {self.softcap:g}")
        return "; ".join(parts)


def describe_encoding(encoding: PositionalEncoding | None) -> str:
    """A short description of an encoding for plan listings: its registry name and, for a
    rotary one, base, rotary width over head width, layout and scaling."""
    if encoding is None:
        return "NoPE"
    text = encoding.name
    base = getattr(encoding, "base", None)
    rotary_dim, head_dim = getattr(encoding, "rotary_dim", None), getattr(encoding, "head_dim", None)
    if base is not None:
        text += f" theta {base:g}"
    if rotary_dim is not None and head_dim is not None:
        text += f", rotary {rotary_dim}/{head_dim}"
    if hasattr(encoding, "interleaved"):
        text += ", interleaved" if encoding.interleaved else ", half-split"
    scaling = getattr(encoding, "scaling", None)
    if scaling:
        factor = scaling.get("factor")
        # v4 configs spell the type "type" (Phi-3's longrope, DeepSeek-V3's yarn)
        kind = scaling.get("rope_type") or scaling.get("type")
        text += f", {kind}" + (f" x{factor:g}" if isinstance(factor, (int, float)) else "")
    return text


@dataclass(frozen=True)
class PositionPlan:
    """A model's positions, layer by layer.

    Attributes:
        layers: one :class:`LayerPlan` per attention layer of the stack, in order.
        embedding: an encoding with the ``embed`` hook added to the token embeddings before the
            first layer (GPT-2's and OPT's learned tables), or None.
        model_type: the config's ``model_type``, or None.
        encoder: for an encoder-decoder model, the encoder stack's plan (this plan is then the
            decoder's); None otherwise.
        notes: what the reader decided that a user should know (two spellings that disagreed
            and which one transformers builds, a family's unusual convention), one sentence each.

    Raises:
        InvalidArgument: no layers, or a layer that is not a LayerPlan; an embedding encoding
            without the ``embed`` hook.
    """

    layers: tuple[LayerPlan, ...]
    embedding: PositionalEncoding | None = None
    model_type: str | None = None
    encoder: PositionPlan | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        layers = tuple(self.layers) if isinstance(self.layers, Sequence) else self.layers
        if not isinstance(layers, tuple) or not layers or not all(isinstance(layer, LayerPlan) for layer in layers):
            raise InvalidArgument(f"layers must be a non-empty sequence of LayerPlan, got {self.layers!r}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "notes", tuple(self.notes))
        if self.embedding is not None:
            from posenc.encodings.base import Hook

            if Hook.EMBED not in self.embedding.hooks:
                raise InvalidArgument(f"embedding: {type(self.embedding).__name__} has no embed hook")

    @classmethod
    def uniform(cls, encoding: PositionalEncoding | None, num_layers: int, **kwargs: Any) -> PositionPlan:
        """Every one of ``num_layers`` layers with ``encoding`` (its ``for_layer(i)`` for layer
        i, so a layer schedule such as iRoPE keeps its own plan) and a full span. An encoding
        with the ``embed`` hook becomes the plan's :attr:`embedding` instead."""
        from posenc.encodings.base import Hook

        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise InvalidArgument(f"num_layers must be a positive int, got {num_layers!r}")
        if encoding is not None and Hook.EMBED in encoding.hooks:
            return cls(tuple(LayerPlan() for _ in range(num_layers)), embedding=encoding, **kwargs)
        return cls(tuple(LayerPlan(None if encoding is None else encoding.for_layer(i)) for i in range(num_layers)),
                   **kwargs)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerPlan]:
        return iter(self.layers)

    def __getitem__(self, index: int) -> LayerPlan:
        return self.layers[index]

    def to_dict(self) -> dict:
        """The plan as plain JSON data (``save_pretrained`` writes it into config.json)::

            {"format": 1, "model_type": str | None, "notes": [str],
             "embedding": ENC | None, "encoder": <the encoder's plan, this form> | None,
             "layers": [{"encoding": ENC | None, "span": str, "window": int | None,
                         "layer_type": str | None, "sinks": bool, "softcap": float | None}, ...]}

        where ENC is ``{"name": registry name, "kwargs": enc.config(), "id": int}``: layers
        holding the same encoding instance (one set of learned weights) share its ``id``, and
        :meth:`from_dict` gives them one instance again. Parameters (learned tables) are not
        in it: they live in the model's state dict.

        Raises:
            InvalidArgument: an encoding that cannot be recorded (:func:`encoding_to_dict`).
        """
        ids: dict[int, int] = {}

        def spec(encoding: PositionalEncoding | None) -> dict | None:
            if encoding is None:
                return None
            return {**encoding_to_dict(encoding), "id": ids.setdefault(id(encoding), len(ids))}

        embedding = spec(self.embedding)
        layers = [{"encoding": spec(layer.encoding), "span": layer.span, "window": layer.window,
                   "layer_type": layer.layer_type, "sinks": layer.sinks, "softcap": layer.softcap} for layer in self.layers]
        return {"format": PLAN_FORMAT, "model_type": self.model_type, "notes": list(self.notes),
                "embedding": embedding, "encoder": None if self.encoder is None else self.encoder.to_dict(),
                "layers": layers}

    @classmethod
    def from_dict(cls, data: Any) -> PositionPlan:
        """The plan :meth:`to_dict` wrote, its encodings built anew with ``posenc.create(name,
        **kwargs)`` (fresh parameters; entries with the same ``id`` share one instance).

        Raises:
            InvalidType: not a dict. InvalidArgument: another ``format``, a layer that is not
                a dict, an unknown encoding name; LayerPlan's and the constructors' errors.
            MissingKey: no ``layers``, an encoding without ``name``.
        """
        from posenc.errors import MissingKey

        if not isinstance(data, dict):
            raise InvalidType(f"a position plan dict is expected, got {type(data).__name__}")
        if data.get("format") != PLAN_FORMAT:
            raise InvalidArgument(f"format: this posenc reads position plans of format {PLAN_FORMAT}, "
                                  f"got {data.get('format')!r}")
        if "layers" not in data:
            raise MissingKey("a position plan dict has no 'layers'")
        built: dict[Any, PositionalEncoding] = {}

        def encoding(entry: Any, where: str) -> PositionalEncoding | None:
            if entry is None:
                return None
            key = entry.get("id") if isinstance(entry, dict) else None
            if key is not None and key in built:
                return built[key]
            made = encoding_from_dict(entry, where)
            if key is not None:
                built[key] = made
            return made

        embedding = encoding(data.get("embedding"), "embedding")
        layers = []
        for index, layer in enumerate(data["layers"]):
            if not isinstance(layer, dict):
                raise InvalidArgument(f"layers[{index}] must be a dict, got {type(layer).__name__}")
            layers.append(LayerPlan(encoding(layer.get("encoding"), f"layers[{index}].encoding"),
                                    span=layer.get("span", "full"), window=layer.get("window"),
                                    layer_type=layer.get("layer_type"), sinks=bool(layer.get("sinks", False)),
                                    softcap=layer.get("softcap")))  # absent in plans saved before it
        encoder = data.get("encoder")
        return cls(tuple(layers), embedding=embedding, model_type=data.get("model_type"),
                   encoder=None if encoder is None else cls.from_dict(encoder), notes=tuple(data.get("notes", ())))

    def describe(self) -> str:
        """The plan, layers with the same description grouped, one group a line:
        ``"0-2, 4-6: rope theta 10000, rotary 64/64, half-split; sliding 4096"`` and
        ``"3, 7: NoPE; full"``; the embedding and the encoder's plan, when present, first."""
        lines = []
        if self.embedding is not None:
            lines.append(f"embedding: {describe_encoding(self.embedding)}")
        groups: dict[str, list[int]] = {}
        for index, layer in enumerate(self.layers):
            groups.setdefault(layer.describe(), []).append(index)
        body = [f"{layer_ranges(indices)}: {text}" for text, indices in groups.items()]
        if self.encoder is not None:
            lines += ["encoder:"] + ["  " + line for line in self.encoder.describe().splitlines()] + ["decoder:"]
            body = ["  " + line for line in body]
        return "\n".join(lines + body)


def layer_ranges(indices: Sequence[int]) -> str:
    """Sorted layer indices as ranges: [0, 1, 2, 4, 5, 6, 8] -> ``"0-2, 4-6, 8"``."""
    spans: list[list[int]] = []
    for index in sorted(indices):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# -- plain-JSON form: what save_pretrained writes into config.json ---------------------------------

#: The version of :meth:`PositionPlan.to_dict`'s layout; :meth:`PositionPlan.from_dict` refuses others.
PLAN_FORMAT = 1


def _encoding_classes() -> dict[str, type[PositionalEncoding]]:
    """Registry name -> class: posenc's registry, plus the per-layer encodings of the
    registered layer schedules (iRoPE's ``attention_temperature`` and ``chunked_rope``, which
    ``IRoPE.for_layer`` returns and Llama 4's plan holds), and the plans' own layer encodings
    (Ministral 3's ``query_scaled_rope``)."""
    from posenc.encodings import REGISTRY
    from posenc.encodings.irope import AttentionTemperature, ChunkedRoPE
    from posenc.encodings.rope.query_scaled import QueryScaledRoPE

    return {**REGISTRY, **{cls.name: cls for cls in (AttentionTemperature, ChunkedRoPE, QueryScaledRoPE)}}


def is_plain_data(value: Any) -> bool:
    """True for JSON-like data (None, bool, int, float, str; lists, tuples and str-keyed dicts
    of those): what a saved plan or checkpoint may hold as an encoding's options."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain_data(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and is_plain_data(item) for key, item in value.items())
    return False


def encoding_to_dict(encoding: PositionalEncoding) -> dict:
    """``{"name": registry name, "kwargs": encoding.config()}``: plain JSON data that
    :func:`encoding_from_dict` rebuilds with ``posenc.create(name, **kwargs)`` (fresh parameters).

    Raises:
        InvalidArgument: the encoding's class is not registered under its name (nor one of the
            layer-schedule encodings), it was built with positional ``*args``, or an option is
            not plain data (int, float, str, bool, None, lists and dicts of those); the message
            names the class.
    """
    cls = type(encoding)
    if _encoding_classes().get(getattr(cls, "name", None)) is not cls:
        raise InvalidArgument(f"cannot record {cls.__name__}: not a registered posenc encoding class "
                              f"(registered: {sorted(_encoding_classes())})")
    kwargs = encoding.config()
    if not is_plain_data(kwargs):
        raise InvalidArgument(f"cannot record {cls.__name__}: its constructor config is not plain data ({kwargs!r})")
    return {"name": cls.name, "kwargs": kwargs}


def encoding_from_dict(spec: Any, where: str = "encoding") -> PositionalEncoding:
    """The encoding :func:`encoding_to_dict` recorded, built anew (``posenc.create``).

    Raises:
        InvalidType: ``spec`` is not a dict. MissingKey: no ``name``. InvalidArgument: an
            unknown name (the known ones listed), kwargs not a dict; the constructor's errors.
    """
    from posenc.errors import MissingKey

    if not isinstance(spec, dict):
        raise InvalidType(f"{where} must be a dict {{'name', 'kwargs'}} or None, got {type(spec).__name__}")
    if "name" not in spec:
        raise MissingKey(f"{where}: no 'name'")
    classes = _encoding_classes()
    if spec["name"] not in classes:
        raise InvalidArgument(f"{where}: unknown encoding {spec['name']!r}; known: {sorted(classes)}")
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise InvalidArgument(f"{where}.kwargs must be a dict, got {type(kwargs).__name__}")
    return classes[spec["name"]](**kwargs)
