"""Layer schedules: encodings whose attention layers differ (:meth:`PositionalEncoding.for_layer`).

iRoPE, the interleaved RoPE / NoPE layers of Llama 4 (Meta AI, "The Llama 4 herd", April 2025,
model card and blog; reference code: Meta's ``llama-models`` ``llama4/model.py`` and
transformers' ``models/llama4/modeling_llama4.py`` and ``masking_utils.py``). Most layers are
RoPE layers with chunked attention: a query attends only the keys of its own chunk of
``attention_chunk_size`` positions (and causally within it), so RoPE never sees a distance of
a chunk or more. Every ``no_rope_layer_interval``-th layer is a NoPE layer with full causal
attention and *attention temperature tuning* (Nakanishi 2025, "Scalable-Softmax Is Superior
for Attention", arXiv 2501.19399, which transformers cites): the queries at position p are
multiplied by

    tau(p) = log1p(floor((p + 1) / floor_scale)) * attn_scale + 1

so that attention over very long contexts stays sharp.

Conventions, against transformers 5.x (``Llama4TextConfig`` / ``Llama4TextAttention``):

- ``no_rope_layers`` keeps transformers' meaning, despite its name: entry i is **1 for a RoPE
  layer and 0 for a NoPE layer** (``use_rope = config.no_rope_layers[layer_idx]``). Without it,
  layer i is a NoPE layer iff ``(i + 1) % no_rope_layer_interval == 0`` (layers 3, 7, 11, ...
  for the default 4), for every i.
- The RoPE layers use chunked attention, the NoPE layers full causal attention
  (transformers' ``layer_types``: "chunked_attention" where ``no_rope_layers[i]`` is 1).
- RoPE in Llama 4's complex layout: pairs (2i, 2i + 1) rotate together (``view_as_complex``),
  posenc's ``interleaved=True``; rope_theta 500000; rope scaling a Hugging Face dict (Llama 4
  Scout: llama3 with factor 16, low_freq_factor = high_freq_factor = 1,
  original_max_position_embeddings 8192; Maverick: none).
- Chunks and temperatures follow **positions**, not token indices: a query at position p
  attends keys at positions k with ``p // C == k // C`` (and k <= p), and its temperature
  reads p. For one unpadded sequence this is what transformers computes. transformers instead
  reads the cache index ("cache_position"): its chunks start after the left padding (it
  subtracts the padding length) but follow the packed row's index across packed documents,
  and its temperature reads the padded index (``arange(T) + past_seen_tokens``). With
  positions, a KV-cache step, left-padded rows and packed documents (positions restarting
  per document) get exactly what each sequence alone gets.
- The qk-norm of Llama 4 (an L2 norm of q and k on RoPE layers, no weight) is not
  positional and is not part of the encoding; it commutes with the rotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.encodings.nope import NoPE
from posenc._validation import check_bool, check_number, check_positive_int
from posenc.encodings.rope.query_scaled import llama_4_attn_scale, scale_queries
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument
from posenc.mask_rules import same_chunk


def attention_temperature(positions: Tensor, *, floor_scale: int = 8192, attn_scale: float = 0.1) -> Tensor:
    """Llama 4's attention temperature of the queries at integer ``positions``, float64, same shape:

        tau(p) = log1p(floor((p + 1) / floor_scale)) * attn_scale + 1

    (transformers ``Llama4TextAttention.forward``; Meta's ``llama4/model.py``). The floor is an
    integer division, exact for every int64 position; 1 for p < floor_scale - 1.
    """
    # Ministral 3's scale read at p + 1 (the same float operations: 1 + attn_scale * log1p(steps))
    return llama_4_attn_scale(positions.to(torch.long) + 1, beta=attn_scale, original_max_position_embeddings=floor_scale)


class AttentionTemperature(PositionalEncoding):
    """The NoPE layer of iRoPE: no rotation, queries scaled by :func:`attention_temperature` at
    their positions, keys unchanged (the ``rotate`` hook, applied to q only).

    Args:
        floor_scale: positions per temperature step (int >= 1; Llama 4: 8192).
        attn_scale: the strength (finite, >= 0; Llama 4: 0.1).

    Raises:
        ValueError: floor_scale not an integer >= 1, attn_scale not a finite number >= 0.
    """

    name = "attention_temperature"
    hooks = frozenset({Hook.ROTATE})

    def __init__(self, *, floor_scale: int = 8192, attn_scale: float = 0.1) -> None:
        super().__init__()
        check_positive_int(floor_scale, "floor_scale")
        self.floor_scale = floor_scale
        self.attn_scale = check_number(attn_scale, "attn_scale", ge=0)

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) times tau(q_positions) ((Tq,) or (B, Tq)), in float32 (float64 for
        float64 q) and cast back to q's dtype, as transformers does; k returned as is."""
        tau = attention_temperature(q_positions, floor_scale=self.floor_scale, attn_scale=self.attn_scale)
        return scale_queries(q, tau), k

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"


class ChunkedRoPE(RoPE):
    """The RoPE layer of iRoPE: :class:`RoPE` (``rotate``) with chunked attention (``mask``):
    a query attends only keys in its own chunk of ``attention_chunk_size`` positions
    (:func:`posenc.mask_rules.same_chunk`), and'ed with the causal mask by :func:`posenc.attention`.

    Args:
        head_dim: as :class:`RoPE`.
        attention_chunk_size: C, positions per chunk (int >= 1; Llama 4: 8192).
        rope_kwargs: the other :class:`RoPE` options (base, interleaved, scaling, ...).

    Raises:
        ValueError: attention_chunk_size not an integer >= 1; RoPE's errors.
    """

    name = "chunked_rope"
    hooks = frozenset({Hook.ROTATE, Hook.MASK})

    def __init__(self, head_dim: int, *, attention_chunk_size: int = 8192, **rope_kwargs: Any) -> None:
        check_positive_int(attention_chunk_size, "attention_chunk_size")
        super().__init__(head_dim, **rope_kwargs)
        self.attention_chunk_size = attention_chunk_size

    def attention_mask(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        return same_chunk(q_positions, k_positions, self.attention_chunk_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, attention_chunk_size={self.attention_chunk_size}"


def _check_schedule(no_rope_layers: Sequence[int] | None) -> list[int] | None:
    """``no_rope_layers`` as a list of 0 and 1, or ValueError naming the argument."""
    if no_rope_layers is None:
        return None
    if isinstance(no_rope_layers, (str, bytes)) or not isinstance(no_rope_layers, Sequence) or not no_rope_layers \
            or any(isinstance(v, bool) or v not in (0, 1) for v in no_rope_layers):
        raise InvalidArgument(
            "no_rope_layers must be a non-empty list of 0 and 1, one per layer (1: a RoPE layer with chunked "
            f"attention, 0: a NoPE layer, as transformers' Llama 4 config), or None for every "
            f"no_rope_layer_interval-th layer; got {no_rope_layers!r}"
        )
    return [int(v) for v in no_rope_layers]


class IRoPE(PositionalEncoding):
    """iRoPE, Llama 4's layer schedule: RoPE layers with chunked attention and NoPE layers with
    attention temperature tuning (formulas, sources and conventions: this module's docstring).

    :meth:`for_layer` gives layer i's encoding: a :class:`ChunkedRoPE` (``rotate`` + ``mask``)
    or an :class:`AttentionTemperature` (``rotate`` on q only), one instance of each shared by
    the layers of its kind (they have no parameters). Given directly to
    :func:`posenc.attention` (one attention, no layer index) an IRoPE acts as its RoPE layers.

    Args:
        head_dim: D, the per-head width of q and k (positive, even).
        no_rope_layers: a list with one entry per layer, **1 for a RoPE layer, 0 for a NoPE
            layer** (transformers' spelling and meaning), or None (default): layer i is a NoPE
            layer iff (i + 1) % no_rope_layer_interval == 0.
        no_rope_layer_interval: n >= 1, used when no_rope_layers is None (Llama 4: 4; 1 makes
            every layer a NoPE layer).
        attention_chunk_size: C >= 1, positions per chunk of the RoPE layers (Llama 4: 8192),
            or None for full causal attention there.
        attn_temperature_tuning: scale the NoPE layers' queries (default True); False leaves
            them plain NoPE.
        floor_scale: positions per temperature step (Llama 4: 8192).
        attn_scale: temperature strength (Llama 4: 0.1).
        rope_theta: the RoPE base (Llama 4: 500000).
        rope_scaling: a Hugging Face rope scaling dict for the RoPE layers, or None
            (see :func:`posenc.rope_frequencies`; Llama 4 Scout's is llama3, factor 16).
        interleaved: the RoPE pair layout; True (default) is Llama 4's complex layout, pairs
            (2i, 2i + 1); False the half-split (i, i + D/2) of Llama 2/3 in transformers.

    Raises:
        ValueError: a bad size or schedule (the message names the argument and the allowed
            values); RoPE's errors for head_dim, rope_theta and rope_scaling.
        TypeError: attn_temperature_tuning or interleaved not a bool.
    """

    name = "irope"
    hooks = frozenset({Hook.ROTATE, Hook.MASK})
    model_sizes = ("head_dim",)

    def __init__(
        self,
        head_dim: int,
        *,
        no_rope_layers: Sequence[int] | None = None,
        no_rope_layer_interval: int = 4,
        attention_chunk_size: int | None = 8192,
        attn_temperature_tuning: bool = True,
        floor_scale: int = 8192,
        attn_scale: float = 0.1,
        rope_theta: float = 500000.0,
        rope_scaling: Mapping[str, Any] | None = None,
        interleaved: bool = True,
    ) -> None:
        super().__init__()
        check_positive_int(floor_scale, "floor_scale")
        check_number(attn_scale, "attn_scale", ge=0)
        self.no_rope_layers = _check_schedule(no_rope_layers)
        check_positive_int(no_rope_layer_interval, "no_rope_layer_interval")
        self.no_rope_layer_interval = no_rope_layer_interval
        if attention_chunk_size is not None:
            check_positive_int(attention_chunk_size, "attention_chunk_size")
        self.attention_chunk_size = attention_chunk_size
        self.attn_temperature_tuning = check_bool(attn_temperature_tuning, "attn_temperature_tuning")
        self.head_dim = head_dim
        self.rope_theta = rope_theta
        self.rope_scaling = dict(rope_scaling) if rope_scaling is not None else None
        self.interleaved = check_bool(interleaved, "interleaved")
        rope = dict(base=rope_theta, scaling=self.rope_scaling, interleaved=interleaved)
        self.rope_layer = (RoPE(head_dim, **rope) if attention_chunk_size is None
                           else ChunkedRoPE(head_dim, attention_chunk_size=attention_chunk_size, **rope))
        self.nope_layer = (AttentionTemperature(floor_scale=floor_scale, attn_scale=attn_scale)
                           if attn_temperature_tuning else NoPE())
        self.floor_scale = floor_scale
        self.attn_scale = float(attn_scale)

    @classmethod
    def for_model(cls, *, num_layers=1, **sizes_and_options):
        """The schedule for a model of ``num_layers`` layers; Llama 4's settings unless given
        (chunks and temperature steps of 8192 positions: pass ``attention_chunk_size`` and
        ``floor_scale`` scaled to a shorter training context, as :meth:`options_for_train_len`).

        Raises:
            ValueError: an explicit no_rope_layers shorter than num_layers.
        """
        encoding = super().for_model(num_layers=num_layers, **sizes_and_options)
        if encoding.no_rope_layers is not None and len(encoding.no_rope_layers) < num_layers:
            raise InvalidArgument(
                f"no_rope_layers has {len(encoding.no_rope_layers)} entries for a model of num_layers={num_layers}: "
                "give one per layer (1: RoPE layer, 0: NoPE layer)"
            )
        return encoding

    @classmethod
    def options_for_train_len(cls, train_len: int) -> dict[str, int]:
        """Chunk size and temperature step for a model trained on windows of ``train_len``
        tokens: ``attention_chunk_size = floor_scale = max(1, train_len // 4)``.

        Llama 4's 8192 are fixed in tokens of its own long training context; a training window
        of L tokens holds a few such chunks and steps only if they are scaled with L. A quarter
        of L lets training meet chunk boundaries and temperature steps (4 chunks per window),
        so that what the model sees at 2L..16L is more of the same, not a new regime:
        its RoPE layers never meet a distance of a chunk or more, at any length.
        """
        check_positive_int(train_len, "train_len")
        size = max(1, train_len // 4)
        return {"attention_chunk_size": size, "floor_scale": size}

    def uses_rope(self, layer: int) -> bool:
        """Whether attention layer ``layer`` (0-based) is a RoPE layer (else a NoPE layer).

        Raises:
            ValueError: layer not an integer >= 0, or past an explicit no_rope_layers.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise InvalidArgument(f"layer must be an integer >= 0, got {layer!r}")
        if self.no_rope_layers is None:
            return (layer + 1) % self.no_rope_layer_interval != 0
        if layer >= len(self.no_rope_layers):
            raise InvalidArgument(f"layer {layer} is past no_rope_layers, which schedules {len(self.no_rope_layers)} layers")
        return bool(self.no_rope_layers[layer])

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer ``layer``'s encoding: the shared :class:`ChunkedRoPE` (or plain :class:`RoPE`
        when attention_chunk_size is None) or the shared :class:`AttentionTemperature` (or
        :class:`NoPE` without temperature tuning). Raises as :meth:`uses_rope`."""
        return self.rope_layer if self.uses_rope(layer) else self.nope_layer

    @property
    def call_invariant(self) -> bool:
        return self.rope_layer.call_invariant and self.nope_layer.call_invariant

    @property
    def inv_freq(self) -> Tensor:
        """The RoPE layers' inverse frequencies (float32, (D/2,), radians per token)."""
        return self.rope_layer.inv_freq

    # Called directly (not through for_layer), an IRoPE is its RoPE layers.
    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope_layer.rotate(q, k, q_positions, k_positions)

    def attention_mask(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        return self.rope_layer.attention_mask(q_positions, k_positions)

    def mask_mod(self, q_positions: Tensor | None = None, k_positions: Tensor | None = None):
        return self.rope_layer.mask_mod(q_positions, k_positions)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> IRoPE:
        """The iRoPE of a Hugging Face Llama 4 text config (a parsed ``config.json``'s
        ``text_config``, or ``Llama4TextConfig.to_dict()``): rope_theta and the rope scaling
        (v4 ``rope_scaling`` or v5 ``rope_parameters``), head_dim, no_rope_layers (or
        no_rope_layer_interval), attention_chunk_size, attn_temperature_tuning, floor_scale and
        attn_scale; an absent key takes Llama4TextConfig's default, the one the Llama 4 family
        record reads too (:data:`posenc.hf_config.llama4.TEXT_DEFAULTS`: rope_theta 500000,
        head_dim 128, ...). An empty no_rope_layers means the interval's schedule, as
        transformers reads it.

        Raises:
            TypeError: config not a dict. KeyError, ValueError: as
                :func:`posenc.hf_config.rope.read_hf_config` and the constructor; a
                partial_rotary_factor (Llama 4 rotates the whole head).
        """
        # One of the two calls from an encoding up to the config module (RoPE.to_hf_dict is the
        # other): how a config spells Llama 4 is its knowledge; imported here, not at the top, so
        # that encodings load without it.
        from posenc.hf_config.llama4 import irope_arguments

        return cls(**irope_arguments(config))

    def extra_repr(self) -> str:
        schedule = (f"no_rope_layers={self.no_rope_layers}" if self.no_rope_layers is not None
                    else f"no_rope_layer_interval={self.no_rope_layer_interval}")
        return f"head_dim={self.head_dim}, {schedule}"
