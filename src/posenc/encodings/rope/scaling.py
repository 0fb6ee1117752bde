"""RoPE frequencies and their context-extension scalings, as pure functions.

Each ``rope_type`` is one :class:`RopeType` record in the table :data:`ROPE_TYPES`: its
function ``(dim, base, scaling, seq_len) -> (inv_freq, attention_factor)`` (the shape of
Hugging Face's ``modeling_rope_utils``, with plain arguments instead of a model config;
:data:`ROPE_INIT_FUNCTIONS` is the view of those functions alone) and everything else posenc
needs to know about the type: how its frequencies follow the length, what a Hugging Face
config supplies, its context-extension defaults. Config.json interop itself lives in
:mod:`posenc.hf_config.rope`. ``inv_freq`` is computed in float64 and rounded once to
float32 by :func:`compute_rope_parameters`; ``attention_factor`` is the factor Hugging Face
multiplies cos and sin by (so the logits scale by its square).

Notation: d = ``dim`` (the rotary dimension), b = ``base`` (rope_theta), s = ``factor``,
L0 = ``original_max_position_embeddings`` (the pre-training context), L = ``seq_len``.

The scaling dict uses Hugging Face's key names and defaults (transformers v5
``rope_parameters``; the v4 ``rope_scaling`` spelling ``"type"`` is read too). Where
Hugging Face reads a value from the model config rather than from the dict, posenc reads
it from the dict, so that these functions need no config object:

- ``dynamic``: L0 is the dict's ``original_max_position_embeddings`` (Hugging Face uses
  ``config.max_position_embeddings``; :func:`posenc.rope.from_hf_config` fills it in).
- ``dynamic_yarn`` (posenc's; no Hugging Face type): YaRN at s = max(1, L / L0), its
  attention factor following the length too (the record's ``attention_of_length``).
- ``yarn`` / ``longrope`` / ``llama3``: L0 is the dict's ``original_max_position_embeddings``
  (required, as in v5). For ``yarn`` the explicit ``factor`` is used, as in v5 (v4.4x let
  ``original_max_position_embeddings`` override it: transformers issue #38224).
- ``longrope`` without ``factor``: Hugging Face derives s = max_position_embeddings / L0;
  :func:`posenc.rope.from_hf_config` fills it in. It is needed only for the default
  attention factor.
- ``freq_factors`` (posenc's; no Hugging Face type): fixed per-pair factors, inv_i =
  theta_i / ff_i, as llama.cpp applies a GGUF file's ``rope_freqs`` tensor (Llama 3.1).

Errors: a missing required key raises KeyError naming it; a bad value (factor < 1,
beta_fast < beta_slow, high_freq_factor <= low_freq_factor, a longrope list whose length
is not d/2, ...) raises ValueError naming the key and the allowed values; an unknown
rope_type raises ValueError listing the known ones. Hugging Face only logs warnings for
most of these; posenc refuses them, since the result would be silently wrong.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor
from posenc.errors import InvalidArgument, InvalidType, MissingKey

#: Keys every scaling dict may carry whatever its type (v5 ``rope_parameters`` carries the
#: last two; the rotary dimension and base are given to the functions separately).
_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def default_inv_freq_f64(dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (Su et al. 2021, eq. 15), float64."""
    return 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


# -- reading and checking the dict -----------------------------------------------------------
def _required(scaling: Mapping[str, Any], key: str, rope_type: str) -> Any:
    if key not in scaling or scaling[key] is None:
        raise MissingKey(f"scaling: rope_type {rope_type!r} requires the key {key!r}")
    return scaling[key]


def _number(value: Any, key: str, *, minimum: float | None = None, strict: bool = False) -> float:
    """A finite real number (not a bool), optionally >= (or >) ``minimum``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if ok and minimum is not None:
        ok = float(value) > minimum if strict else float(value) >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise InvalidArgument(f"scaling[{key!r}] must be a finite number{bound}, got {value!r}")
    return float(value)


def _factor(scaling: Mapping[str, Any], rope_type: str) -> float:
    return _number(_required(scaling, "factor", rope_type), "factor", minimum=1.0)


def _context_length(scaling: Mapping[str, Any], rope_type: str) -> int:
    """L0 = ``original_max_position_embeddings``, a positive integer."""
    value = _required(scaling, "original_max_position_embeddings", rope_type)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidArgument(f"scaling['original_max_position_embeddings'] must be an integer >= 1, got {value!r}")
    return int(value)


def _ntk_exponent(dim: int, rope_type: str) -> float:
    """d / (d - 2), the exponent of NTK-aware base scaling; undefined for d = 2."""
    if dim <= 2:
        raise InvalidArgument(f"rope_type {rope_type!r} rescales the base by factor^(d/(d-2)): the rotary dim must be > 2, got {dim}")
    return dim / (dim - 2)


def _check_keys(scaling: Mapping[str, Any], rope_type: str, allowed: frozenset[str]) -> None:
    """Warn (as Hugging Face does) about keys this rope_type does not read."""
    unknown = set(scaling) - allowed - _COMMON_KEYS
    if unknown:
        warnings.warn(
            f"scaling: keys {sorted(unknown)} are not used by rope_type {rope_type!r} (it reads {sorted(allowed)})",
            stacklevel=4,
        )


# -- the record of a rope_type ----------------------------------------------------------------------
RopeInitFn = Callable[[int, float, Mapping[str, Any], "int | None"], tuple[Tensor, float]]
#: (dim, base, scaling) -> (lengths float64 Tensor (...) -> frequencies float64 (..., dim // 2)).
LengthFrequenciesFn = Callable[[int, float, Mapping[str, Any]], Callable[[Tensor], Tensor]]
#: (dim, base, scaling) -> (lengths float64 Tensor (...) -> attention factors float64 (...)).
LengthAttentionFn = Callable[[int, float, Mapping[str, Any]], Callable[[Tensor], Tensor]]


@dataclass(frozen=True)
class RopeType:
    """Everything posenc knows about one ``rope_type``: the single place to look.

    The frequencies are ``inv_freq``, and for a type whose frequencies follow the current
    length, ``of_length`` too; the other fields say how Hugging Face spells the type.

    Fields:
        inv_freq: the pure ``(dim, base, scaling, seq_len) -> (inv_freq float64 (dim // 2,),
            attention_factor)`` function. It validates the dict (KeyError for a missing key,
            ValueError for a bad value, a warning for an unused key).
        of_length: for a length-dependent type only (dynamic, longrope): ``(dim, base,
            scaling) -> f``, called once on a dict that ``inv_freq`` has validated, where
            ``f(lengths)`` maps a float64 tensor of lengths (any shape S, any device) to the
            float64 frequencies (S + (dim // 2,)) at each length, with tensor ops only (no
            Python branch on a value), so that it runs inside ``torch.compile`` and for the
            lengths asked only. It must equal ``inv_freq(dim, base, scaling, L)`` at every L.
            :class:`~posenc.RoPE` calls it with the call's length (``dynamic_cache="rerotate"``)
            or with ``positions + 1`` (``"frozen"``: position p rotated with the frequencies
            in force when it was the last token). None: the frequencies ignore the length.
        attention_of_length: for a type whose *attention factor* follows the length too
            (dynamic_yarn): ``(dim, base, scaling) -> g``, where ``g(lengths)`` maps a float64
            tensor of lengths (shape S) to the float64 attention factors (shape S), tensor ops
            only; it must equal ``inv_freq(dim, base, scaling, L)[1]`` at every L (to float64
            rounding: torch's and the math module's log may differ in the last bit). Needs
            ``of_length``. None: the attention factor is the float of ``inv_freq`` (at
            seq_len None), whatever the length (longrope's too, as in Hugging Face).
        needs_context: the dict carries the original context L0 =
            ``original_max_position_embeddings`` (a required key); Hugging Face reads it from
            the model config, so :func:`posenc.rope.read_hf_config` fills it in from
            ``max_position_embeddings``, and :func:`posenc.rope.extension_scaling` from L0.
        hf_top_level_context: a top-level ``original_max_position_embeddings`` in a config
            (Phi-3) overrides the dict's L0, as in Hugging Face.
        hf_factor_from_context: a predicate on the rope dict: Hugging Face derives this dict's
            ``factor`` as max_position_embeddings / L0 (None: never).
        extension: the keys :func:`posenc.rope.extension_scaling` adds, with their published
            defaults, besides rope_type, factor and (when ``needs_context``) L0; None when the
            type is not a context-extension method of a trained model.
        factor_is_length_ratio: as a context extension, its factor is the target length over
            L0 (Position Interpolation's and YaRN's s = L' / L), which
            :func:`posenc.hf_config.extension.fit_to_length` applies; False where no published
            rule ties the factor to the length (llama3: Llama 3.1 went from 8192 to 131072
            tokens with factor 8).
        partial_rotary_selects_frequencies: ``partial_rotary_factor`` is this type's own
            parameter, kept in the dict: it selects which frequencies are nonzero while the
            rotation spans the whole head (proportional / p-RoPE). Otherwise it is Hugging Face's
            GPT-NeoX partial rotary, read into the RoPE's ``rotary_dim``.
        hf_equivalent: for a type Hugging Face does not know, ``(scaling, base, dim) ->
            (rope_theta, scaling or None)`` of the same frequencies in a type it knows (ntk:
            plain RoPE with base * s^(d/(d-2))); None when Hugging Face has the type itself.

    Adding a rope_type is one :data:`RopeInitFn` (and, if it depends on the length, its
    ``of_length``) and one entry of :data:`ROPE_TYPES`.
    """

    inv_freq: RopeInitFn
    of_length: LengthFrequenciesFn | None = None
    attention_of_length: LengthAttentionFn | None = None
    needs_context: bool = False
    hf_top_level_context: bool = False
    hf_factor_from_context: Callable[[Mapping[str, Any]], bool] | None = None
    extension: Mapping[str, Any] | None = None
    partial_rotary_selects_frequencies: bool = False
    factor_is_length_ratio: bool = True
    hf_equivalent: Callable[[Mapping[str, Any], float, int], tuple[float, Mapping[str, Any] | None]] | None = None

    def __post_init__(self) -> None:
        if self.attention_of_length is not None and self.of_length is None:
            raise InvalidArgument("RopeType: attention_of_length needs of_length (a length-dependent type)")
        if self.extension is not None:
            object.__setattr__(self, "extension", MappingProxyType(dict(self.extension)))

    @property
    def length_dependent(self) -> bool:
        """The frequencies follow the current length: the record has ``of_length``."""
        return self.of_length is not None


# -- one function per rope_type ------------------------------------------------------------------
def _default(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    return default_inv_freq_f64(dim, base), 1.0


def _linear(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Position Interpolation (Chen et al. 2023, eq. 2; kaiokendev): m -> m/s, i.e. theta_i / s."""
    _check_keys(scaling, "linear", frozenset({"factor"}))
    return default_inv_freq_f64(dim, base) / _factor(scaling, "linear"), 1.0


def _ntk(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Static NTK-aware scaling (bloc97, 2023): base' = b * s^(d/(d-2)).

    The exponent makes the lowest frequency exactly theta_{d/2-1} / s (interpolated) while
    the highest stays 1 (extrapolated). Same as x-transformers' ``base_rescale_factor`` and
    rotary-embedding-torch's ``theta_rescale_factor``. Not a Hugging Face rope_type: it equals
    Hugging Face's ``dynamic`` with factor 1 at seq_len = s * L0.
    """
    _check_keys(scaling, "ntk", frozenset({"factor"}))
    factor = _factor(scaling, "ntk")
    return default_inv_freq_f64(dim, base * factor ** _ntk_exponent(dim, "ntk")), 1.0


def _ntk_as_plain_rope(scaling: Mapping[str, Any], base: float, dim: int) -> tuple[float, None]:
    """Static NTK in Hugging Face's terms, which have no such type: plain RoPE, rope_theta = b * s^(d/(d-2))."""
    return base * _factor(scaling, "ntk") ** _ntk_exponent(dim, "ntk"), None


def dynamic_ntk_base(base: float, factor: float, seq_len: Any, context_length: int, dim: int) -> Any:
    """Dynamic NTK base (emozilla, 2023; Hugging Face ``_compute_dynamic_ntk_parameters``).

    base' = b * (s * L / L0 - (s - 1))^(d/(d-2)) with L = max(seq_len, L0), so base' = b for
    L <= L0. ``seq_len`` may be a float64 tensor of lengths (then a tensor is returned).
    """
    exponent = _ntk_exponent(dim, "dynamic")
    if isinstance(seq_len, Tensor):
        length = seq_len.clamp(min=context_length)
    else:
        length = max(seq_len, context_length)
    return base * (factor * length / context_length - (factor - 1)) ** exponent


def _dynamic(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Dynamic NTK: the NTK base recomputed from the current length (see :func:`dynamic_ntk_base`).

    seq_len None or <= L0 gives the original frequencies.
    """
    _check_keys(scaling, "dynamic", frozenset({"factor", "original_max_position_embeddings"}))
    factor = _factor(scaling, "dynamic")
    context_length = _context_length(scaling, "dynamic")
    length = context_length if seq_len is None else seq_len
    return default_inv_freq_f64(dim, dynamic_ntk_base(base, factor, length, context_length, dim)), 1.0


def _dynamic_of_length(dim: int, base: float, scaling: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """f(lengths) -> the dynamic NTK frequencies at each length, float64 (..., dim // 2)."""
    factor, context_length = _factor(scaling, "dynamic"), _context_length(scaling, "dynamic")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim

    def of_length(lengths: Tensor) -> Tensor:
        bases = dynamic_ntk_base(base, factor, lengths, context_length, dim)
        return 1.0 / bases.unsqueeze(-1) ** exponents.to(lengths.device)

    return of_length


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """sqrt(1/t) = 0.1 * mscale * ln(s) + 1 for s > 1, else 1 (YaRN, Peng et al. 2023, eq. 22)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_correction_dim(num_rotations: float, dim: int, base: float, context_length: int) -> float:
    """The (fractional) pair index whose wavelength fits ``num_rotations`` times into L0.

    dim_of(r) = d * ln(L0 / (2 pi r)) / (2 ln b) (YaRN, eq. 17 solved for the dimension).
    ``num_rotations = 1`` gives the critical dimension: pairs below it complete a full
    rotation within L0.
    """
    return dim * math.log(context_length / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """YaRN "NTK-by-parts" interpolation plus attention temperature (Peng et al. 2023, sec. 3.2-3.4),
    as Hugging Face ``_compute_yarn_parameters`` (v5) computes it.

    low = floor(dim_of(beta_fast)), high = ceil(dim_of(beta_slow)) (no rounding when
    ``truncate`` is False), clamped to [0, d-1]; ramp_i = clamp((i - low)/(high - low), 0, 1)
    (high += 0.001 when equal); inv_i = theta_i / s * ramp_i + theta_i * (1 - ramp_i).
    attention_factor defaults to 0.1 ln s + 1, or, when both ``mscale`` and ``mscale_all_dim``
    are set (DeepSeek), g(s, mscale) / g(s, mscale_all_dim) with g = :func:`yarn_get_mscale`.
    """
    keys = {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim", "truncate"}
    _check_keys(scaling, "yarn", frozenset(keys))
    factor = _factor(scaling, "yarn")
    context_length = _context_length(scaling, "yarn")
    ramp = _yarn_ramp(dim, base, scaling, context_length)

    attention_factor = scaling.get("attention_factor")
    if attention_factor is not None:
        attention_factor = _number(attention_factor, "attention_factor", minimum=0.0, strict=True)
    else:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            mscale = _number(mscale, "mscale", minimum=0.0, strict=True)
            mscale_all_dim = _number(mscale_all_dim, "mscale_all_dim", minimum=0.0, strict=True)
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)

    theta = default_inv_freq_f64(dim, base)
    return theta / factor * ramp + theta * (1.0 - ramp), float(attention_factor)


def _yarn_ramp(dim: int, base: float, scaling: Mapping[str, Any], context_length: int) -> Tensor:
    """YaRN's ramp over the pairs, float64 (dim // 2,): 0 keeps theta_i (fast pairs,
    extrapolated), 1 divides it by the factor (slow pairs, interpolated); from the dict's
    ``beta_fast`` (default 32), ``beta_slow`` (default 1) and ``truncate`` (default True),
    checked here. It depends on L0, not on the factor."""
    # Hugging Face reads `.get(key) or default`, so None means the default.
    beta_fast = _number(scaling.get("beta_fast") or 32, "beta_fast", minimum=0.0, strict=True)
    beta_slow = _number(scaling.get("beta_slow") or 1, "beta_slow", minimum=0.0, strict=True)
    if beta_fast < beta_slow:
        raise InvalidArgument(f"scaling: beta_fast must be >= beta_slow, got beta_fast={beta_fast:g}, beta_slow={beta_slow:g}")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise InvalidArgument(f"scaling['truncate'] must be True or False, got {truncate!r}")
    low = yarn_correction_dim(beta_fast, dim, base, context_length)
    high = yarn_correction_dim(beta_slow, dim, base, context_length)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # Hugging Face's guard against a zero-width ramp
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)


# -- dynamic YaRN -------------------------------------------------------------------------------------
_DYNAMIC_YARN_KEYS = frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"})


def _dynamic_yarn_settings(dim: int, base: float, scaling: Mapping[str, Any]) -> tuple[int, Tensor, Tensor]:
    """(L0, ramp, theta) of a dynamic_yarn dict, checked; ``factor``, when given, must be >= 1."""
    if scaling.get("factor") is not None:
        _factor(scaling, "dynamic_yarn")
    context_length = _context_length(scaling, "dynamic_yarn")
    return context_length, _yarn_ramp(dim, base, scaling, context_length), default_inv_freq_f64(dim, base)


def _dynamic_yarn(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Dynamic YaRN (Peng et al. 2023, "YaRN", section 3.3; their ``LlamaDynamicYaRNScaledRotaryEmbedding``
    without its grow-only cache): static YaRN (:func:`_yarn`, with beta_fast / beta_slow /
    truncate) at the factor s = max(1, L / L0) of the current length L.

    inv_i = theta_i / s * ramp_i + theta_i * (1 - ramp_i) and attention_factor = 0.1 ln s + 1
    (eq. 22) for L > L0; exactly theta and 1 for L <= L0 (and seq_len None): plain RoPE.
    ``factor`` is optional and does not enter the frequencies: it is the extension the config
    declares (Hugging Face's max_position_embeddings = factor * L0). No attention_factor /
    mscale override: the factor follows the length.
    """
    _check_keys(scaling, "dynamic_yarn", _DYNAMIC_YARN_KEYS)
    context_length, ramp, theta = _dynamic_yarn_settings(dim, base, scaling)
    if seq_len is None or seq_len <= context_length:
        return theta, 1.0
    factor = seq_len / context_length
    return theta / factor * ramp + theta * (1.0 - ramp), yarn_get_mscale(factor)


def _dynamic_yarn_of_length(dim: int, base: float, scaling: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """f(lengths) -> dynamic YaRN's frequencies at each length, float64 (..., dim // 2)."""
    context_length, ramp, theta = _dynamic_yarn_settings(dim, base, scaling)

    def of_length(lengths: Tensor) -> Tensor:
        device = lengths.device
        t, r = theta.to(device), ramp.to(device)
        # the factor's division in float64 as in _dynamic_yarn, so a length equals static YaRN bit for bit
        factor = (lengths / context_length).clamp(min=1.0).unsqueeze(-1)
        stretched = t / factor * r + t * (1.0 - r)
        # within L0 exactly theta: t * r + t * (1 - r) may be off by an ulp
        return torch.where((lengths > context_length).unsqueeze(-1), stretched, t)

    return of_length


def _dynamic_yarn_attention_of_length(dim: int, base: float, scaling: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """g(lengths) -> 0.1 ln max(1, L / L0) + 1 at each length, float64 (exactly 1 within L0)."""
    context_length = _context_length(scaling, "dynamic_yarn")

    def attention_of_length(lengths: Tensor) -> Tensor:
        return 0.1 * torch.log((lengths / context_length).clamp(min=1.0)) + 1.0

    return attention_of_length


def _yarn_factor_is_null(scaling: Mapping[str, Any]) -> bool:
    """An explicit ``factor: null`` (v5 ``standardize_rope_params`` derives it)."""
    return "factor" in scaling and scaling["factor"] is None


def _llama3(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Llama 3.1 frequency scaling (Meta's ``apply_scaling``; Hugging Face ``_compute_llama3_parameters``).

    With lambda_i = 2 pi / theta_i: lambda < L0/high_freq_factor keeps theta; lambda >
    L0/low_freq_factor divides it by s; in between, smooth = (L0/lambda - low)/(high - low)
    and inv = (1 - smooth) theta / s + smooth theta. attention_factor = 1.

    high_freq_factor = low_freq_factor (Llama 4 Scout: both 1) leaves no band in between: a
    step at lambda = L0/low, which keeps theta at exactly L0/low (transformers accepts it with
    a warning and would give NaN there; Meta's code asserts).
    """
    keys = frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    _check_keys(scaling, "llama3", keys)
    factor = _factor(scaling, "llama3")
    low = _number(_required(scaling, "low_freq_factor", "llama3"), "low_freq_factor", minimum=0.0, strict=True)
    high = _number(_required(scaling, "high_freq_factor", "llama3"), "high_freq_factor", minimum=0.0, strict=True)
    if high < low:
        raise InvalidArgument(f"scaling: high_freq_factor must be >= low_freq_factor, got high_freq_factor={high:g}, low_freq_factor={low:g}")
    context_length = _context_length(scaling, "llama3")

    theta = default_inv_freq_f64(dim, base)
    wavelength = 2 * math.pi / theta
    if high == low:
        return torch.where(wavelength > context_length / low, theta / factor, theta), 1.0
    smooth = (context_length / wavelength - low) / (high - low)
    scaled = torch.where(wavelength > context_length / low, theta / factor, (1 - smooth) * theta / factor + smooth * theta)
    return torch.where(wavelength < context_length / high, theta, scaled), 1.0


def _proportional(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Proportional RoPE, p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary
    Positional Encodings useful?", arXiv 2410.06205, section 6; Gemma 4 in transformers,
    ``_compute_proportional_rope_parameters``).

    The frequencies of the *whole* head, theta_i = b^(-2i/d) for i < d/2, of which only the
    first ``int(p * d // 2)`` are kept (p = ``partial_rotary_factor``, default 1) and the rest
    set to 0, so those pairs pass through unrotated; all divided by ``factor`` (default 1).
    GPT-NeoX partial rotary instead rotates only the first r = int(p * d) dimensions, with
    frequencies over r: b^(-2i/r) (docs/encodings.md compares the two). attention_factor = 1.
    """
    _check_keys(scaling, "proportional", frozenset({"factor", "partial_rotary_factor"}))
    factor = _number(scaling.get("factor", 1.0), "factor", minimum=0.0, strict=True)
    share = _number(scaling.get("partial_rotary_factor", 1.0), "partial_rotary_factor", minimum=0.0)
    if share > 1:
        raise InvalidArgument(f"scaling['partial_rotary_factor'] must be in [0, 1], got {share:g}")
    kept = int(share * dim // 2)
    theta = default_inv_freq_f64(dim, base)
    return torch.where(torch.arange(dim // 2) < kept, theta, torch.zeros_like(theta)) / factor, 1.0


def _factor_list(scaling: Mapping[str, Any], key: str, dim: int, rope_type: str = "longrope") -> Tensor:
    value = _required(scaling, key, rope_type)
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != dim // 2:
        length = len(value) if isinstance(value, Sequence) else type(value).__name__
        raise InvalidArgument(f"scaling[{key!r}] must be a list of dim/2 = {dim // 2} numbers, got {length}")
    for x in value:
        _number(x, key, minimum=0.0, strict=True)
    return torch.tensor([float(x) for x in value], dtype=torch.float64)


def _longrope(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """LongRoPE (Ding et al. 2024; Phi-3), as Hugging Face ``_compute_longrope_parameters``.

    inv_i = 1 / (ext_i * b^(2i/d)) with ext = ``long_factor`` when seq_len > L0, else
    ``short_factor`` (seq_len None: short). attention_factor defaults to
    sqrt(1 + ln s / ln L0) (1 when s <= 1), whatever the length: Hugging Face applies it to
    the short factors too.
    """
    keys = frozenset({"short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"})
    _check_keys(scaling, "longrope", keys)
    short_factor = _factor_list(scaling, "short_factor", dim)
    long_factor = _factor_list(scaling, "long_factor", dim)
    context_length = _context_length(scaling, "longrope")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is not None:
        attention_factor = _number(attention_factor, "attention_factor", minimum=0.0, strict=True)
    else:
        if scaling.get("factor") is None:
            raise MissingKey(
                "scaling: rope_type 'longrope' requires the key 'factor' (or 'attention_factor'); Hugging Face "
                "derives it as max_position_embeddings / original_max_position_embeddings (posenc.rope.from_hf_config does too)"
            )
        factor = _factor(scaling, "longrope")
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(context_length)) if factor > 1 else 1.0
    ext = long_factor if seq_len is not None and seq_len > context_length else short_factor
    return default_inv_freq_f64(dim, base) / ext, float(attention_factor)


def _longrope_of_length(dim: int, base: float, scaling: Mapping[str, Any]) -> Callable[[Tensor], Tensor]:
    """f(lengths) -> the short factors' frequencies for L <= L0, the long ones' after."""
    context_length = _context_length(scaling, "longrope")
    theta = default_inv_freq_f64(dim, base)
    short, long = theta / _factor_list(scaling, "short_factor", dim), theta / _factor_list(scaling, "long_factor", dim)

    def of_length(lengths: Tensor) -> Tensor:
        is_long = (lengths > context_length).unsqueeze(-1)
        return torch.where(is_long, long.to(lengths.device), short.to(lengths.device))

    return of_length


def _freq_factors(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Fixed per-pair frequency factors, as llama.cpp applies a GGUF's ``rope_freqs`` tensor:
    inv_i = theta_i / ff_i, ff = ``freq_factors`` (d/2 positive numbers; ggml's ``rope_f32``
    divides theta by ``freq_factors[i0/2]``), whatever the length; attention_factor the dict's
    ``attention_factor`` (default 1: llama.cpp's ``rope.scaling.attn_factor``).

    posenc's own rope_type (transformers has none: its nearest is ``longrope`` with equal short
    and long lists, which it computes per length): Llama 3.1's ``llama3`` scaling as the
    converter stores it (``LlamaModel.generate_extra_tensors`` in llama.cpp's
    convert_hf_to_gguf.py: ff_i = theta_i / inv_i of ``_compute_llama3_parameters``), so that a
    GGUF Llama 3.1 is a length-independent encoding (a KV cache stays exact).
    """
    _check_keys(scaling, "freq_factors", frozenset({"freq_factors", "attention_factor"}))
    factors = _factor_list(scaling, "freq_factors", dim, "freq_factors")
    attention_factor = _number(scaling.get("attention_factor", 1.0), "attention_factor", minimum=0.0, strict=True)
    return default_inv_freq_f64(dim, base) / factors, attention_factor


# -- the YaRN variants of released models that transformers does not carry ----------------------------
def _yarn_ramp_truncated(dim: int, base: float, scaling: Mapping[str, Any], context_length: int) -> Tensor:
    """YaRN's ramp with the bounds always rounded (floor / ceil), as vLLM's and SGLang's
    ``yarn_find_correction_range`` compute it: no ``truncate`` key."""
    return _yarn_ramp(dim, base, {k: scaling[k] for k in ("beta_fast", "beta_slow") if k in scaling}, context_length)


def _yarn_log(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Grok's ``yarn_log``: YaRN's two frequency sets blended in log space (a geometric mean),
    with no attention factor.

    m_i = (1 - ramp_i) * e, with YaRN's ramp (bounds always rounded; e = ``extrapolation_factor``,
    default 1); inv_i = exp(m_i ln theta_i + (1 - m_i) ln(theta_i / s)) = theta_i * s^-(1 - m_i):
    fast pairs (m = 1) keep theta, slow pairs (m = 0) get theta / s, and in the ramp the
    exponent, not the frequency, moves linearly (YaRN's ``yarn`` blends the frequencies
    themselves). attention_factor = 1: the reference computes YaRN's mscale and leaves it unused
    (its cos / sin are not multiplied by it).

    Source: vLLM ``vllm/model_executor/layers/rotary_embedding/grok1_scaling_rope.py``
    (``Grok1ScalingRotaryEmbedding._compute_inv_freq``, ``extra_method == "yarn_log"``; commit
    e443db5afd899bae8a673ccb3ee2bc21c38969d9), and SGLang's ``models/grok.py`` (the same code);
    selected by a Grok config's top-level ``rope_type``, with ``scaling_factor``,
    ``original_max_position_embeddings``, ``beta_fast`` / ``beta_slow`` and
    ``extrapolation_factor`` beside it. Not a transformers rope_type.
    """
    keys = frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "extrapolation_factor"})
    _check_keys(scaling, "yarn_log", keys)
    factor = _factor(scaling, "yarn_log")
    context_length = _context_length(scaling, "yarn_log")
    extrapolation = _number(scaling.get("extrapolation_factor", 1.0), "extrapolation_factor", minimum=0.0)
    keep = (1.0 - _yarn_ramp_truncated(dim, base, scaling, context_length)) * extrapolation
    theta = default_inv_freq_f64(dim, base)
    return torch.exp(keep * torch.log(theta) + (1.0 - keep) * torch.log(theta / factor)), 1.0


def theta_scale_base(base: float, factor: float, context_length: int) -> float:
    """Grok's ``theta_scale`` base: b' = b^(ln(s L0 / 2 pi) / ln(L0 / 2 pi)).

    The power is the one that stretches the pair whose wavelength is L0 (2 pi b^(2i/d) = L0)
    to wavelength s L0: that pair, one turn over the trained context, makes one turn over the
    extended one; pairs faster than it are stretched less, slower ones more. Needs L0 > 2 pi
    (ln(L0 / 2 pi) is the denominator).
    """
    return float(base) ** (math.log(context_length * factor / (2 * math.pi)) / math.log(context_length / (2 * math.pi)))


def _theta_scale(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """Grok's ``theta_scale``: plain RoPE on the base :func:`theta_scale_base` (every pair
    interpolated by one rule, no ramp), attention_factor = 1.

    Source: vLLM ``grok1_scaling_rope.py`` (``extra_method == "theta_scale"``; commit
    e443db5afd899bae8a673ccb3ee2bc21c38969d9), which computes b' in float64 (Python floats) and
    the powers in float32; posenc computes all in float64 and rounds once. Not a transformers
    rope_type.
    """
    _check_keys(scaling, "theta_scale", frozenset({"factor", "original_max_position_embeddings"}))
    factor = _factor(scaling, "theta_scale")
    context_length = _context_length(scaling, "theta_scale")
    if context_length <= 2 * math.pi:
        raise InvalidArgument(
            f"scaling['original_max_position_embeddings'] must be > 2 pi (= 6.28) for rope_type 'theta_scale' "
            f"(its base exponent divides by ln(L0 / 2 pi)), got {context_length}"
        )
    return default_inv_freq_f64(dim, theta_scale_base(base, factor, context_length)), 1.0


def _theta_scale_as_plain_rope(scaling: Mapping[str, Any], base: float, dim: int) -> tuple[float, None]:
    """Grok's theta_scale in Hugging Face's terms, which have no such type: plain RoPE,
    rope_theta = :func:`theta_scale_base`."""
    _theta_scale(dim, base, scaling, None)  # its checks (L0 > 2 pi)
    factor, context_length = _factor(scaling, "theta_scale"), _context_length(scaling, "theta_scale")
    return theta_scale_base(base, factor, context_length), None


def telechat3_mscale(factor: float) -> float:
    """TeleChat3's YaRN attention factor: 0.07 ln s + 1 for s > 1, else 1 (YaRN's own is 0.1 ln s + 1)."""
    return 1.0 if factor <= 1 else 0.07 * math.log(factor) + 1.0


def _telechat3_yarn(dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None) -> tuple[Tensor, float]:
    """TeleChat3's YaRN: YaRN's frequencies (:func:`_yarn`: ramp, ``truncate``) with the attention
    factor :func:`telechat3_mscale` (0.07 ln s + 1) in place of YaRN's 0.1 ln s + 1.

    Source: vLLM ``vllm/model_executor/layers/rotary_embedding/telechat3_scaling_rope.py``
    (``TeleChat3RoPEScaledRotaryEmbedding``: ``YaRNScalingRotaryEmbedding`` with ``get_mscale``
    rewritten; commit d5a17e05172e358f2d4d6f18e67cb13f8d7c6988). Not a transformers rope_type
    (TeleChat3 ships remote code); the same as ``{"rope_type": "yarn", "attention_factor":
    0.07 ln s + 1}``, which is how it is written for transformers.
    """
    keys = frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate"})
    _check_keys(scaling, "telechat3_yarn", keys)
    factor = _factor(scaling, "telechat3_yarn")
    context_length = _context_length(scaling, "telechat3_yarn")
    ramp = _yarn_ramp(dim, base, scaling, context_length)
    theta = default_inv_freq_f64(dim, base)
    return theta / factor * ramp + theta * (1.0 - ramp), telechat3_mscale(factor)


def _telechat3_as_yarn(scaling: Mapping[str, Any], base: float, dim: int) -> tuple[float, Mapping[str, Any]]:
    """TeleChat3's YaRN in Hugging Face's terms: ``yarn`` with its attention factor written out."""
    yarn = {k: v for k, v in scaling.items() if k not in ("type",)}
    yarn.update(rope_type="yarn", attention_factor=telechat3_mscale(_factor(scaling, "telechat3_yarn")))
    return base, yarn


def _longrope_factor_missing(scaling: Mapping[str, Any]) -> bool:
    """No ``factor``: Hugging Face derives it, when the default attention factor needs it."""
    return scaling.get("factor") is None and scaling.get("attention_factor") is None


# -- the table ----------------------------------------------------------------------------------------
#: rope_type -> its :class:`RopeType` record; the order is that of :func:`extension_methods`.
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType(_default),
    "linear": RopeType(_linear, extension={}),
    "ntk": RopeType(_ntk, extension={}, hf_equivalent=_ntk_as_plain_rope),
    "dynamic": RopeType(
        _dynamic, of_length=_dynamic_of_length, needs_context=True, extension={},
    ),
    "yarn": RopeType(
        _yarn, needs_context=True, hf_top_level_context=True, hf_factor_from_context=_yarn_factor_is_null, extension={},
    ),
    "dynamic_yarn": RopeType(
        _dynamic_yarn, of_length=_dynamic_yarn_of_length, attention_of_length=_dynamic_yarn_attention_of_length,
        needs_context=True, hf_top_level_context=True, extension={},
    ),
    "llama3": RopeType(
        _llama3, needs_context=True, hf_top_level_context=True, factor_is_length_ratio=False,
        extension={"low_freq_factor": 1.0, "high_freq_factor": 4.0},  # Llama 3.1's published values
    ),
    "proportional": RopeType(_proportional, partial_rotary_selects_frequencies=True),
    # posenc's: a GGUF's per-pair factors (Llama 3.1's rope_freqs), fixed; not an extension method
    "freq_factors": RopeType(_freq_factors),
    # the YaRN variants of Grok and TeleChat3 (vLLM, SGLang): context extensions from a factor and L0
    "yarn_log": RopeType(_yarn_log, needs_context=True, extension={}),
    "theta_scale": RopeType(_theta_scale, needs_context=True, extension={}, hf_equivalent=_theta_scale_as_plain_rope),
    "telechat3_yarn": RopeType(_telechat3_yarn, needs_context=True, extension={}, hf_equivalent=_telechat3_as_yarn),
    # not an extension method: it needs searched per-pair factors, not just a factor and L0
    "longrope": RopeType(
        _longrope, of_length=_longrope_of_length, needs_context=True, hf_top_level_context=True, hf_factor_from_context=_longrope_factor_missing,
    ),
}


class _InitFunctions(Mapping):
    """rope_type -> its ``inv_freq`` function: a read-only live view of :data:`ROPE_TYPES`."""

    def __getitem__(self, rope_type: str) -> RopeInitFn:
        return ROPE_TYPES[rope_type].inv_freq

    def __iter__(self):
        return iter(ROPE_TYPES)

    def __len__(self) -> int:
        return len(ROPE_TYPES)

    def __repr__(self) -> str:
        return f"ROPE_INIT_FUNCTIONS({sorted(self)})"


class _LengthDependent(AbstractSet):
    """The length-dependent rope_types: a read-only live view of :data:`ROPE_TYPES`."""

    def __contains__(self, rope_type: object) -> bool:
        record = ROPE_TYPES.get(rope_type) if isinstance(rope_type, str) else None
        return record is not None and record.length_dependent

    def __iter__(self):
        return (name for name, record in ROPE_TYPES.items() if record.length_dependent)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"LENGTH_DEPENDENT({sorted(self)})"


#: rope_type -> function(dim, base, scaling dict, seq_len) -> (inv_freq float64, attention_factor),
#: Hugging Face's dict of the same name; derived from :data:`ROPE_TYPES`.
ROPE_INIT_FUNCTIONS: Mapping[str, RopeInitFn] = _InitFunctions()

#: rope_types whose frequencies depend on the current length (``seq_len``); from :data:`ROPE_TYPES`.
LENGTH_DEPENDENT: AbstractSet[str] = _LengthDependent()


def extension_methods() -> tuple[str, ...]:
    """The rope_types that extend a trained RoPE from a factor and L0 alone, in table order."""
    return tuple(name for name, record in ROPE_TYPES.items() if record.extension is not None)


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    """``scaling["rope_type"]`` (or the v4 ``"type"``), ``"default"`` for None."""
    if scaling is None:
        return "default"
    if not isinstance(scaling, Mapping):
        raise InvalidType(f"scaling must be a dict in the Hugging Face rope_scaling form, got {type(scaling).__name__}")
    return scaling.get("rope_type", scaling.get("type", "default"))


def rope_type_record(scaling: Mapping[str, Any] | None) -> RopeType:
    """The :class:`RopeType` record of a scaling dict (None: ``"default"``).

    Raises:
        ValueError: an unknown rope_type (the message lists the known ones).
        TypeError: ``scaling`` is not a mapping.
    """
    rope_type = rope_type_of(scaling)
    record = ROPE_TYPES.get(rope_type) if isinstance(rope_type, str) else None
    if record is None:
        raise InvalidArgument(f"scaling: unknown rope_type {rope_type!r}; known: {sorted(ROPE_TYPES)}")
    return record


def _check_seq_len(seq_len: Any) -> int | None:
    if seq_len is None:
        return None
    if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 1:
        raise InvalidArgument(f"seq_len must be None or an integer >= 1, got {seq_len!r}")
    return int(seq_len)


def compute_rope_parameters(
    dim: int, base: float, scaling: Mapping[str, Any] | None, seq_len: int | None, *, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, float]:
    """Dispatch on ``scaling["rope_type"]`` (``"type"`` is read too, as Hugging Face does).

    Returns (inv_freq (dim // 2,) of ``dtype``, attention_factor float). The public value is
    float32 (Hugging Face's ``inv_freq``); the rope encoding asks for float64 so that
    position * inv_freq keeps full precision at long positions.

    Raises:
        ValueError: an unknown rope_type (the message lists the known ones), a bad value,
            a ``rope_theta`` in ``scaling`` that disagrees with ``base``, or a bad seq_len.
        KeyError: a required key is missing (the message names it).
        TypeError: ``scaling`` is not a mapping.
    """
    record = rope_type_record(scaling)
    scaling = {} if scaling is None else scaling
    theta = scaling.get("rope_theta")
    if theta is not None and float(theta) != float(base):
        raise InvalidArgument(f"scaling['rope_theta']={theta!r} disagrees with base={base!r}; pass one value")
    seq_len = _check_seq_len(seq_len)
    inv_freq, attention_factor = record.inv_freq(dim, base, scaling, seq_len)
    return inv_freq.to(dtype), float(attention_factor)

