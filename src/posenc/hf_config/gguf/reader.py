"""A GGUF file's position plan, read as llama.cpp's C++ reads it.

:func:`read_gguf_positions` reads the metadata keys and the position tensors llama.cpp reads
for the file's architecture (:data:`~posenc.hf_config.gguf.arches.ARCHES`), with llama.cpp's
defaults and types, and states them as a :class:`~posenc.plan.PositionPlan` for the
checkpoint's weights, equal to what :func:`posenc.hf_config.position_plan` reads from the
source ``config.json`` when the conversion kept every position of it.

The numbers, as llama.cpp computes them (``src/llama-model.cpp`` ``load_hparams``,
``src/llama-context.cpp`` ``llama_context::llama_context``, ggml's ``rope_yarn`` in
``ggml/src/ggml-cpu/ops.cpp``), for a layer of frequency scale s_l (1 / ``rope.scaling.factor``
for the global layers; the sliding layers' own, :attr:`Arch.swa_scaled`):

- theta_i = base^(-2i / n_rot) / ff_i (ff: ``rope_freqs`` or ``rope_factors_long/short``, else 1);
- YaRN (``rope.scaling.type`` "yarn", so ext_factor = 1): the ramp between
  floor(corr_dim(beta_fast = 32)) and ceil(corr_dim(beta_slow = 1)) over
  ``rope.scaling.original_context_length`` (``ggml_rope_yarn_corr_dims``: always truncated),
  cos and sin times m_l = a x (1 + 0.1 ln(1 / s_l)), where a = ``rope.scaling.attn_factor`` x
  g(f) / (1 + 0.1 ln f), f the global factor, g(f) = 0.1 ln f + 1, or with
  ``rope.scaling.yarn_log_multiplier`` (DeepSeek) g(f, mscale) / g(f, mscale_all_dim)
  (``llama_context``'s yarn_attn_factor; on a global layer m = a x ... = the YaRN paper's
  0.1 ln f + 1 times the file's attention factor);
- otherwise cos and sin times ``rope.scaling.attn_factor`` (Phi-3's LongRoPE factor), and
  theta_i x s_l (linear).

Each becomes posenc's Hugging Face-form scaling dict: ``yarn`` (with ``truncate`` true and the
attention factor explicit), ``linear``, posenc's ``freq_factors`` for fixed per-pair factors
(Llama 3.1's ``rope_freqs``), or ``longrope`` for Phi-3's short and long lists with L0 =
``rope.scaling.original_context_length`` (equal lists where a Phi-3 file lacks them but keeps
its attention factor, so that a comparison with its config names the missing tensors).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from posenc.encodings.base import PositionalEncoding
from posenc.encodings.rope.multiaxis import MRoPE
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument
from posenc.hf_config.gguf.arches import ARCHES, ROPE_TYPES, Arch
from posenc.hf_config.gguf.file import GGUFFile, read_gguf
from posenc.hf_config.values import (
    MAX_HEAD_DIM,
    MAX_POSITIONS,
    MAX_ROPE_THETA,
)
from posenc.plan import LayerPlan, PositionPlan

__all__ = ["GGUFPositions", "gguf_rope_metadata", "position_plan_from_gguf", "read_gguf_positions"]

#: llama.cpp's rope scaling types (``LLAMA_ROPE_SCALING_TYPES``, llama-model.cpp).
SCALING_TYPES = ("none", "linear", "yarn", "longrope")
#: Keys llama.cpp reads for YaRN only in a few architectures (grok, mistral3), none of posenc's.
UNREAD_YARN_KEYS = ("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_beta_fast",
                    "rope.scaling.yarn_beta_slow")
#: The most layers llama.cpp loads (``LLAMA_MAX_LAYERS``, src/llama-hparams.h; load_hparams asserts it).
LLAMA_MAX_LAYERS = 512
#: llama.cpp's YaRN scaling type (LLAMA_ROPE_SCALING_TYPE_YARN), by its name in the file.
YARN = "yarn"
#: llama.cpp's rope types (Arch.rope_type) that rotate adjacent pairs (NORM), and several position axes.
ADJACENT_PAIRS, MULTI_AXIS = ("norm",), ("mrope",)
#: llama.cpp's YaRN betas (llama_hparams' yarn_beta_fast, yarn_beta_slow).
BETA_FAST, BETA_SLOW = 32.0, 1.0


@dataclass(frozen=True)
class GGUFPositions:
    """What :func:`read_gguf_positions` read.

    Attributes:
        plan: the position plan for the checkpoint's weights (see ``layout``).
        architecture: ``general.architecture``.
        rope_type: llama.cpp's rope type for it (``"norm"``, ``"neox"``, ``"mrope"``).
        layout: one sentence: how llama.cpp pairs the file's Q and K values, whether
            ``convert_hf_to_gguf.py`` permuted them from the checkpoint's layout, and the
            layout of :attr:`plan` (the checkpoint's).
        context_length: ``{arch}.context_length`` (llama.cpp's n_ctx_train).
        metadata: the position keys present in the file, by their GGUF names, with their
            values (lists for arrays), and each position tensor read (name -> its values);
            :func:`gguf_rope_metadata` returns it.
        keys: per layer, plan field -> the GGUF key (or tensor) it was read from, so that a
            difference can name the key (:func:`posenc.hf_config.gguf.plan_differences`).
    """

    plan: PositionPlan
    architecture: str
    rope_type: str
    layout: str
    context_length: int
    metadata: dict[str, Any]
    keys: tuple[Mapping[str, str], ...] = field(repr=False)


def position_plan_from_gguf(path: str | os.PathLike) -> PositionPlan:
    """The per-layer position plan of a GGUF file, as llama.cpp reads it, for the checkpoint's
    weights: :attr:`GGUFPositions.plan` of :func:`read_gguf_positions`.

    Args:
        path: a GGUF file of an architecture in :data:`~posenc.hf_config.gguf.arches.ARCHES`.

    Returns:
        A :class:`~posenc.plan.PositionPlan`, one layer per block; its ``notes`` say
        llama.cpp's pair layout and what the file holds that llama.cpp does not read.

    Raises:
        InvalidArgument: see :func:`read_gguf_positions`.
    """
    return read_gguf_positions(path).plan


def gguf_rope_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The position keys of a GGUF file by their GGUF names (``"qwen2.rope.freq_base"``, ...)
    with their values, and the position tensors llama.cpp reads for its architecture (name ->
    list of floats): what :func:`read_gguf_positions` read, for naming a key in an audit.

    Raises:
        InvalidArgument: see :func:`read_gguf_positions`.
    """
    return dict(read_gguf_positions(path).metadata)


def read_gguf_positions(path: str | os.PathLike) -> GGUFPositions:
    """Read a GGUF file's positions as llama.cpp reads them (module docstring).

    Only the metadata and the position tensors (``rope_freqs``, ``rope_factors_long``,
    ``rope_factors_short``: n_rot/2 floats each) are read, the file memory-mapped and every count
    checked against its size first (:func:`posenc.hf_config.gguf.file.read_gguf`).

    Raises:
        InvalidArgument: an unreadable, truncated or malformed file; an architecture posenc does
            not read (the message lists the ones it does); a key of the wrong GGUF type (named,
            with the type llama.cpp expects), a value out of range (NaN, a base <= 1, a head
            width past 65536, ...); a combination llama.cpp reads that posenc cannot state
            (YaRN over per-pair factors). Always one line naming the file.
    """
    gguf = read_gguf(path)
    return _Reading(gguf).positions()


@dataclass
class _Scale:
    """The global rope scaling as llama.cpp's context holds it."""

    kind: str  # llama.cpp's rope scaling type
    factor: float  # the global layers' factor (1 / rope_freq_scale_train)
    attn: float  # cparams.yarn_attn_factor, before ggml's own YaRN magnitude
    ext: bool  # ext_factor != 0 (YaRN)
    original: int  # n_ctx_orig_yarn
    factors: dict[str, list[float]] | None  # per-pair factor tensors read, by name
    keys: dict[str, str]


class _Reading:
    """One file being read: typed access to ``{arch}.*`` keys, recording what was read."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf
        self.metadata: dict[str, Any] = {}
        self.notes: list[str] = []
        name = self.value("general.architecture", "STRING", required=True)
        self.arch: Arch | None = ARCHES.get(name)
        if self.arch is None:
            raise gguf.error(f"general.architecture is {name!r}; posenc reads the GGUF architectures {sorted(ARCHES)}")

    # -- typed values ---------------------------------------------------------------------------

    def value(self, key: str, kind: str | tuple[str, ...], *, required: bool = False) -> Any:
        """The value of ``key`` (a full GGUF name), which must be of GGUF type ``kind`` (one of)."""
        kinds = (kind,) if isinstance(kind, str) else kind
        found = self.gguf.types.get(key)
        if found is None:
            if required:
                raise self.gguf.error(f"needs the key {key!r} (llama.cpp requires it)")
            return None
        if found not in kinds:
            raise self.gguf.error(f"key {key!r} is {found}; llama.cpp reads it as {' or '.join(kinds)}")
        if key not in self.gguf.metadata:
            raise self.gguf.error(f"key {key!r} is too long to be a position value")
        value = self.gguf.metadata[key]
        self.metadata[key] = value
        return value

    def key(self, suffix: str) -> str:
        return f"{self.arch.name}.{suffix}"

    def count(self, suffix: str, default: int | None, bound: int, *, required: bool = False) -> int | None:
        """A UINT32 ``{arch}.suffix`` in [1, bound] (0 only where llama.cpp reads 0 as 'none')."""
        value = self.value(self.key(suffix), "UINT32", required=required)
        if value is None:
            return default
        if not 1 <= value <= bound:
            raise self.gguf.error(f"key {self.key(suffix)!r} = {value} is out of range [1, {bound}]")
        return value

    def real(self, suffix: str, default: float | None, *, gt: float | None = None, le: float | None = None) -> float | None:
        key = self.key(suffix)
        value = self.value(key, "FLOAT32")
        if value is None:
            return default
        if not math.isfinite(value) or (gt is not None and value <= gt) or (le is not None and value > le):
            bounds = f"({'-inf' if gt is None else gt:g}, {'inf' if le is None else f'{le:g}'}]"
            raise self.gguf.error(f"key {key!r} = {value!r} is not a finite number in {bounds}")
        return float(value)

    # -- the plan ---------------------------------------------------------------------------------

    def positions(self) -> GGUFPositions:
        arch = self.arch
        n_layer = self.count("block_count", None, LLAMA_MAX_LAYERS, required=True)
        context = self.count("context_length", None, MAX_POSITIONS, required=True)
        n_embd = self.count("embedding_length", None, 2**31, required=True)
        heads = self.value(self.key("attention.head_count"), ("UINT32", "ARRAY[UINT32]", "ARRAY[INT32]"),
                           required=True)
        n_head = heads[0] if isinstance(heads, list) and heads else heads
        if not isinstance(n_head, int) or n_head < 1:
            raise self.gguf.error(f"key {self.key('attention.head_count')!r} = {heads!r}: posenc reads models with "
                                  f"attention heads (>= 1)")
        key_length = self.count("attention.key_length", n_embd // n_head, MAX_HEAD_DIM)
        n_rot = self.count("rope.dimension_count", key_length, MAX_HEAD_DIM)
        swa_key_length = self.count("attention.key_length_swa", key_length, MAX_HEAD_DIM)
        swa_rot = self.count("rope.dimension_count_swa", n_rot, MAX_HEAD_DIM)
        is_swa, window = self.sliding_layers(n_layer)
        keys_full = {"head_dim": self.key("rope.dimension_count" if arch.rotary_head else "attention.key_length"),
                     "rotary_dim": self.key("rope.dimension_count"), "base": self.key("rope.freq_base"),
                     "interleaved": "general.architecture", "sinks": "general.architecture",
                     "encoding": "general.architecture",
                     "span": self.key("attention.sliding_window"), "window": self.key("attention.sliding_window"),
                     "mrope_section": self.key("rope.dimension_sections")}
        if self.key("attention.sliding_window_pattern") in self.gguf.types:
            keys_full["span"] = self.key("attention.sliding_window_pattern")
        keys_swa = {**keys_full, "base": self.key("rope.freq_base_swa")}
        scale = self.scaling_settings(context, n_rot)
        keys_full.update(scale.keys)
        keys_swa.update(scale.keys)
        full = self.encoding(key_length, n_rot, scale, swa=False)
        slide = self.encoding(swa_key_length, swa_rot, scale, swa=True) if any(is_swa) else None
        self.ignored_keys()
        layout = self.layout_sentence()
        layers, keys = [], []
        for il in range(n_layer):
            typed = arch.swa in ("optional", "required")
            layers.append(LayerPlan(slide if is_swa[il] else full, "sliding" if is_swa[il] else "full",
                                    window if is_swa[il] else None,
                                    layer_type=("sliding_attention" if is_swa[il] else "full_attention") if typed else None,
                                    sinks=arch.sinks))
            keys.append(keys_swa if is_swa[il] else keys_full)
        notes = (f"GGUF {arch.name}: {layout}", *self.notes)
        plan = PositionPlan(tuple(layers), model_type=None, notes=notes)
        return GGUFPositions(plan, arch.name, arch.rope_type, layout, context, dict(self.metadata), tuple(keys))

    def sliding_layers(self, n_layer: int) -> tuple[list[bool], int | None]:
        """Per layer, whether it slides (``load_swa_pattern`` / ``set_swa_pattern``), and the window."""
        arch = self.arch
        if arch.swa is None:
            return [False] * n_layer, None
        key = self.key("attention.sliding_window")
        window = self.value(key, "UINT32", required=arch.swa == "required")
        if window is not None and window > MAX_POSITIONS:
            raise self.gguf.error(f"key {key!r} = {window} is out of range [0, {MAX_POSITIONS}]")
        if arch.swa == "disabled":
            if window:
                self.notes.append(f"{key} = {window} is switched off by llama.cpp's {arch.name} "
                                  f"({arch.source}: 'Phi SWA is currently disabled'): every layer attends fully")
            return [False] * n_layer, None
        if not window:
            if arch.swa == "required":
                raise self.gguf.error(f"key {key!r} = 0: llama.cpp's {arch.name} needs a sliding window >= 1")
            return [False] * n_layer, None
        pattern_key = self.key("attention.sliding_window_pattern")
        pattern = self.value(pattern_key, ("UINT32", "ARRAY[BOOL]", "ARRAY[INT32]", "ARRAY[UINT32]"))
        if isinstance(pattern, list):
            if len(pattern) > LLAMA_MAX_LAYERS:  # the size of llama_hparams' array
                raise self.gguf.error(f"key {pattern_key!r} has {len(pattern)} entries, more than llama.cpp's "
                                      f"{LLAMA_MAX_LAYERS} layers")
            flags = [bool(pattern[il]) if il < len(pattern) else False for il in range(n_layer)]
        else:
            n = arch.swa_pattern if pattern is None else pattern
            flags = [n == 0 or il % n < n - 1 for il in range(n_layer)]
        return flags, window

    def scaling_settings(self, context: int, n_rot: int) -> _Scale:
        """The global rope scaling (llama_model_base::load_hparams, llama_context::llama_context)."""
        arch = self.arch
        kind = self.value(self.key("rope.scaling.type"), "STRING")
        if kind is None:
            kind = "linear"  # llama.cpp's default spelling: no factor means no scaling
        elif kind not in SCALING_TYPES:
            raise self.gguf.error(f"key {self.key('rope.scaling.type')!r} = {kind!r}; llama.cpp reads {list(SCALING_TYPES)}")
        factor_key = self.key("rope.scaling.factor")
        factor = self.real("rope.scaling.factor", None, gt=0.0, le=1e6)
        if factor is None and self.key("rope.scale_linear") in self.gguf.types:  # the old name
            factor_key = self.key("rope.scale_linear")
            factor = self.real("rope.scale_linear", None, gt=0.0, le=1e6)
        factor = 1.0 if factor is None or kind == "none" else factor
        attn_file = self.real("rope.scaling.attn_factor", 1.0, gt=0.0, le=1e3)
        original = self.count("rope.scaling.original_context_length", context, MAX_POSITIONS)
        keys = {"rope_type": self.key("rope.scaling.type"), "factor": factor_key,
                "original_max_position_embeddings": self.key("rope.scaling.original_context_length"),
                "attention_factor": self.key("rope.scaling.attn_factor"), "frequencies": factor_key}
        ext = kind == YARN
        attn = 1.0
        if ext:
            if factor < 1.0:
                raise self.gguf.error(f"key {factor_key!r} = {factor!r}: YaRN extends the context, a factor >= 1")
            log_mul = self.real("rope.scaling.yarn_log_multiplier", None, le=1e3) if arch.reads_log_mul else None
            if log_mul is not None and log_mul < 0:  # 0.1 x mscale_all_dim; 0 means none to llama.cpp
                raise self.gguf.error(f"key {self.key('rope.scaling.yarn_log_multiplier')!r} = {log_mul!r}: "
                                      "0.1 x mscale_all_dim, >= 0")
            if log_mul:
                mscale_all = log_mul / 0.1  # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter wrote 0.1 x mscale_all_dim
                mscale = mscale_all if arch.name == "deepseek2" and mscale_all != 1.0 else 1.0
                attn = _mscale(factor, mscale) / _mscale(factor, mscale_all)
                keys["attention_factor"] = self.key("rope.scaling.yarn_log_multiplier")
            else:
                attn = _mscale(factor, 1.0)
                keys["attention_factor"] = f"{factor_key} (0.1 ln s + 1), {self.key('rope.scaling.attn_factor')}"
            attn /= 1.0 + 0.1 * math.log(factor)  # cancels ggml's own magnitude (rope_yarn) on the global layers
        attn *= attn_file
        factors = self.factor_tensors(n_rot)
        if factors:
            keys["frequencies"] = " / ".join(f"{name}.weight" for name in factors)
        elif arch.factor_tensors:
            names = [n for n in arch.factor_tensors if n != "rope_freqs"] if arch.name != "llama" else ["rope_freqs"]
            keys["frequencies"] = " / ".join(f"{name}.weight" for name in names) + " (absent)"
        type_key = self.key("rope.scaling.type")
        if arch.factor_tensors and type_key not in self.gguf.types:
            # no scaling type: the tensors are the whole scaling (Llama 3.1's rope_freqs), so name them
            keys["rope_type"] = keys["frequencies"] if factors else f"{type_key} (absent) / {keys['frequencies']}"
        return _Scale(kind, factor, attn, ext, original, factors, keys)

    def factor_tensors(self, n_rot: int) -> dict[str, list[float]] | None:
        """The per-pair factor tensors llama.cpp loads for this architecture (n_rot/2 floats each)."""
        arch, found = self.arch, {}
        for name in ("rope_freqs", "rope_factors_long", "rope_factors_short"):
            tensor = f"{name}.weight"
            if tensor not in self.gguf.tensors:
                continue
            if name not in arch.factor_tensors:
                self.notes.append(f"tensor {tensor} is not read by llama.cpp's {arch.name} ({arch.source})")
                continue
            values = self.gguf.tensor_values(tensor, count=n_rot // 2)
            if not all(math.isfinite(v) and v > 0 for v in values):
                raise self.gguf.error(f"tensor {tensor} holds a factor that is not a positive finite number")
            found[name] = values
            self.metadata[tensor] = values
        return found or None

    def encoding(self, head_dim: int, n_rot: int, scale: _Scale, *, swa: bool) -> PositionalEncoding:
        """The rotary encoding of the global (``swa`` False) or the sliding layers."""
        arch = self.arch
        if arch.rotary_head:
            head_dim = n_rot
        if n_rot > head_dim or n_rot % 2 or head_dim % 2:
            raise self.gguf.error(f"rope.dimension_count {n_rot} must be even and at most the key length {head_dim}")
        base = self.real("rope.freq_base", 10000.0, gt=1.0, le=MAX_ROPE_THETA)
        factor = scale.factor
        if swa:
            default = base if arch.swa_base_default == "global" else arch.swa_base_default
            base = self.real("rope.freq_base_swa", default, gt=1.0, le=MAX_ROPE_THETA)
            factor = scale.factor if arch.swa_scaled else 1.0
        attn = scale.attn * ((1.0 + 0.1 * math.log(factor)) if scale.ext else 1.0)  # ggml's rope_yarn magnitude
        scaling = self.scaling_dict(n_rot, factor, attn, scale, swa=swa)
        interleaved = arch.rope_type in ADJACENT_PAIRS and not arch.permuted
        try:
            if arch.rope_type in MULTI_AXIS:
                return MRoPE(head_dim, mrope_section=self.sections(n_rot), rotary_dim=n_rot, base=base,
                             scaling=scaling)
            return RoPE(head_dim, rotary_dim=n_rot, base=base, interleaved=interleaved, scaling=scaling,
                        max_position_embeddings=self.metadata.get(self.key("context_length")))
        except InvalidArgument as error:
            raise self.gguf.error(f"{arch.name}.rope.*: {error}") from None

    def scaling_dict(self, n_rot: int, factor: float, attn: float, scale: _Scale, *, swa: bool) -> dict | None:
        """posenc's (Hugging Face's) scaling dict for these numbers, or None for plain RoPE."""
        if scale.factors and not swa:
            if scale.ext:
                raise self.gguf.error("YaRN over per-pair rope factors: llama.cpp applies both; posenc cannot state it")
            ones = [1.0] * (n_rot // 2)
            if "rope_freqs" in scale.factors:  # one list, whatever the length: fixed per-pair factors
                return {"rope_type": "freq_factors", "freq_factors": [v * factor for v in scale.factors["rope_freqs"]],
                        "attention_factor": attn}
            short, long = scale.factors.get("rope_factors_short", ones), scale.factors.get("rope_factors_long", ones)
            for name in ("rope_factors_short", "rope_factors_long"):
                if name not in scale.factors:
                    self.notes.append(f"tensor {name}.weight is missing: llama.cpp leaves those frequencies unscaled")
            self.notes.append("llama.cpp picks rope_factors_long when the context it allocates exceeds "
                              f"rope.scaling.original_context_length ({scale.original}), whatever the sequence's "
                              "length (llama_model::get_rope_factors); transformers, by the sequence's length")
            return {"rope_type": "longrope", "short_factor": [v * factor for v in short],
                    "long_factor": [v * factor for v in long], "original_max_position_embeddings": scale.original,
                    "attention_factor": attn}
        if scale.ext:  # factor 1 too (no rope.scaling.factor): the dict names what the file lacks
            return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": scale.original,
                    "beta_fast": BETA_FAST, "beta_slow": BETA_SLOW, "truncate": True, "attention_factor": attn}
        if attn != 1.0:  # a magnitude without YaRN (Phi-3 without its factor tensors): per-pair factors all
            # equal to the linear factor, spelled as the LongRoPE the config has, so that a comparison names the tensors
            return {"rope_type": "longrope", "short_factor": [factor] * (n_rot // 2),
                    "long_factor": [factor] * (n_rot // 2), "original_max_position_embeddings": scale.original,
                    "attention_factor": attn}
        return None if factor == 1.0 else {"rope_type": "linear", "factor": factor}

    def sections(self, n_rot: int) -> list[int]:
        key = self.key("rope.dimension_sections")
        sections = self.value(key, ("ARRAY[INT32]", "ARRAY[UINT32]"), required=True)
        if len(sections) > 4:
            raise self.gguf.error(f"key {key!r} has {len(sections)} entries; llama.cpp reads at most 4")
        sections = list(sections) + [0] * (4 - len(sections))
        if sections[3] or any(s < 0 for s in sections) or sum(sections) != n_rot // 2:
            raise self.gguf.error(f"key {key!r} = {sections}: Qwen2-VL's M-RoPE needs [t, h, w, 0], t + h + w = "
                                  f"n_rot/2 = {n_rot // 2}")
        return sections[:3]

    def ignored_keys(self) -> None:
        """Notes for the position keys in the file that llama.cpp does not read for this architecture."""
        for suffix in UNREAD_YARN_KEYS + (() if self.arch.reads_log_mul else ("rope.scaling.yarn_log_multiplier",)):
            key = self.key(suffix)
            if key in self.gguf.types:
                self.metadata[key] = self.gguf.metadata.get(key)
                self.notes.append(f"{key} = {self.metadata[key]!r} is not read by llama.cpp's {self.arch.name} "
                                  f"({self.arch.source})")

    def layout_sentence(self) -> str:
        arch = self.arch
        pairs = ROPE_TYPES[arch.rope_type]
        if arch.permuted:
            return (f"llama.cpp rotates {pairs} of this file's Q and K, which convert_hf_to_gguf.py permuted from the "
                    "checkpoint's half-split rows (LlamaModel.permute); this plan is for the checkpoint's weights: "
                    "half-split")
        return f"llama.cpp rotates {pairs}, the checkpoint's own layout (no permutation); this plan is the same"


def _mscale(factor: float, mscale: float) -> float:
    """llama_context's get_mscale: 0.1 mscale ln(factor) + 1 for factor > 1, else 1."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0

