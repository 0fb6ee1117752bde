"""Rotary position embedding (RoPE; Su et al. 2021, "RoFormer", section 3.4) and
proportional RoPE (p-RoPE). The rotation itself is :mod:`posenc.kernels.rotary_torch`.

Shapes: B batch, H heads, T sequence length, D head_dim, r rotary_dim (r <= D, even).

Conventions (they differ between codebases):
- ``half-split`` (default; GPT-NeoX, Hugging Face Llama): dimension i pairs with i + r/2;
  cos and sin are full width, the half repeated: [c_0 .. c_{r/2-1}, c_0 .. c_{r/2-1}].
- ``interleaved`` (RoFormer paper, GPT-J, Meta's original Llama): dimension 2i pairs with
  2i+1; cos and sin duplicate each pair: [c_0, c_0, c_1, c_1, ...].
- Partial rotary, Hugging Face ``partial_rotary_factor`` semantics: only ``x[..., :r]``
  rotates, with frequencies built from r (base^(-2i/r)); ``x[..., r:]`` passes through.
- Angles ``position * inv_freq`` are computed in float64 and rounded once, whatever the
  activation dtype; the rotation itself runs in float32 or wider and is cast back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc import kernels as _kernels
from posenc._validation import check_bool, check_even, check_number, is_real_number
from posenc.kernels.rotary_torch import rotate_heads
from posenc.encodings.rope.scaling import compute_rope_parameters, rope_type_record
from posenc.errors import InvalidArgument


def frequencies_on(frequencies: Tensor, device: torch.device, cache: dict[torch.device, Tensor]) -> Tensor:
    """``frequencies`` (float64, kept off the module's ``.to()``) on ``device``, copied there once
    and kept in ``cache``; under ``torch.compile`` a plain ``.to()`` (no dict writes in the graph)."""
    if torch.compiler.is_compiling():
        return frequencies.to(device)
    freq = cache.get(device)
    if freq is None:
        freq = cache[device] = frequencies.to(device)
    return freq


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> tuple[Tensor, float]:
    """RoPE inverse frequencies and attention factor.

    ``inv_freq[i] = base^(-2i/head_dim)`` for i < head_dim / 2 (RoFormer eq. 15), modified by
    ``scaling``, a Hugging Face ``rope_scaling`` dict (``{"rope_type": ..., "factor": ...}``):
    ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``dynamic_yarn``, ``llama3``, ``longrope`` (formulas, sources and
    where posenc departs from Hugging Face: :mod:`posenc.encodings.rope.scaling`). ``seq_len``,
    the current length, matters for ``dynamic`` (frequencies recomputed for seq_len > L0),
    ``dynamic_yarn`` (frequencies and attention factor) and ``longrope`` (long factors for
    seq_len > L0); None means "within L0". Pass the rotary
    dimension as ``head_dim`` for partial rotary.

    Returns:
        (inv_freq, attention_factor): float32 tensor (head_dim // 2,) in radians per token,
        and the float that Hugging Face multiplies cos and sin by (1.0 without scaling).

    Raises:
        ValueError: ``head_dim`` not a positive even integer, ``base`` <= 1, an unknown
            rope_type (the message lists the known ones), a bad scaling value (factor < 1,
            beta_fast < beta_slow, ...; the message names the key) or seq_len < 1.
        KeyError: a required scaling key is missing (the message names it).
    """
    check_even(head_dim, "head_dim")
    check_number(base, "base (rope_theta)", gt=1)
    return compute_rope_parameters(head_dim, float(base), scaling, seq_len)


#: Values of ``RoPE(dynamic_cache=...)``.
DYNAMIC_CACHE_MODES = ("rerotate", "frozen")
#: Values of ``RoPE.cos_sin(role=...)``: which side of q . k a table rotates.
TABLE_ROLES = ("shared", "query", "key")


def full_width(half: Tensor, interleaved: bool) -> Tensor:
    """(..., r/2) -> (..., r) in the layout's order: ``[c_0 .. c_{r/2-1}, c_0 .. c_{r/2-1}]``
    half-split, ``[c_0, c_0, c_1, c_1, ...]`` interleaved."""
    if interleaved:
        return half.repeat_interleave(2, dim=-1)
    return torch.cat((half, half), dim=-1)


def cos_sin_table(
    angles: Tensor, attention_factor: float | Tensor, interleaved: bool, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """The cos/sin tables of RoPE and multi-axis RoPE from their angles.

    Args:
        angles: float64 (..., r/2), radians, one per frequency pair.
        attention_factor: the factor cos and sin are multiplied by (Hugging Face's; 1.0 for
            none): a float, or a float64 tensor of one factor per row of ``angles`` (shape
            ``angles.shape[:-1]``, or 0-d for the whole call: dynamic_yarn).
        interleaved: the pair layout, as :func:`full_width`.
        dtype: the tables' dtype.

    Returns:
        cos, sin: (..., r) of ``dtype``, full width in the layout's order, taken and scaled in
        float64 and rounded once (docs/precision.md).
    """
    cos, sin = angles.cos(), angles.sin()
    if isinstance(attention_factor, Tensor):  # multiplied whatever its value: no branch on a tensor
        factor = attention_factor.unsqueeze(-1)
        cos, sin = cos * factor, sin * factor
    elif attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return full_width(cos.to(dtype), interleaved), full_width(sin.to(dtype), interleaved)


def _short_repr(scaling: Mapping[str, Any] | None) -> str:
    """The scaling dict with its long lists (longrope factors) abbreviated."""
    if scaling is None:
        return "None"
    items = (f"{k!r}: [{len(v)} values]" if isinstance(v, (list, tuple)) else f"{k!r}: {v!r}" for k, v in scaling.items())
    return "{" + ", ".join(items) + "}"


class RoPE(PositionalEncoding):
    """Rotary position embedding (Su et al. 2021, RoFormer, section 3.4.2, eq. 34).

    q_m and k_n are rotated by angles m * theta_i and n * theta_i, so q_m . k_n depends on
    positions only through m - n.

    Args:
        head_dim: D, the per-head width of q and k (positive, even).
        rotary_dim: r, how many leading dimensions rotate (even, <= head_dim); default D.
        partial_rotary_factor: alternatively r = int(head_dim * factor) (Hugging Face).
        base: rope_theta, 10000 in the paper.
        interleaved: pair (2i, 2i+1) (RoFormer / GPT-J) instead of (i, i + r/2) (NeoX / HF).
        scaling: a Hugging Face ``rope_scaling`` dict, or None (see :func:`rope_frequencies`).
            cos and sin are multiplied by its attention_factor, as Hugging Face does.
        dynamic_cache: for the length-dependent scalings (``dynamic``, ``dynamic_yarn``,
            ``longrope``), which frequencies rotate a token (other types ignore it):

            - ``"rerotate"`` (default): every q and k of a call is rotated with the
              frequencies of the current length L = max(q and k positions) + 1. Exact for a
              full forward pass; under a KV cache, cache *unrotated* keys (as
              :func:`posenc.attention` does: it rotates all the keys it is given) so that old
              keys are re-rotated with the frequencies of the moment.
              In a multi-layer model that is exact for the first layer only: deeper layers'
              keys and values come from hidden states computed at a shorter length, so
              :attr:`call_invariant` is False and posenc's ``generate()`` re-runs the prefix.
            - ``"frozen"``: the token at position p is rotated with the frequencies at length
              p + 1, whatever the call; a key's rotation never changes, so caching rotated
              keys is exact. This is what Hugging Face computes when decoding token by token
              (it caches rotated keys); a Hugging Face prefill longer than L0 uses the
              prefill's length for all its tokens instead.

            ``dynamic_yarn``'s attention factor m(L) = 0.1 ln max(1, L / L0) + 1 follows the
            same length: in "rerotate" q and k are both multiplied by m(L) (logits by m(L)^2,
            static YaRN at factor L / L0); in "frozen" the query at position p carries
            m(p + 1)^2 and the keys nothing, so a logit is scaled by its query's length alone,
            m(q + 1)^2, never m(q + 1) m(k + 1) (see :meth:`cos_sin`'s ``role``).
        hf_layout: how a Hugging Face config.json spelled these fields (the layout of
            :func:`~posenc.hf_config.rope.read_hf_config`); :meth:`to_hf_dict`
            writes them back in that spelling. None (default): the plain spelling.
            Set by :func:`posenc.rope.from_hf_config`.
        max_position_embeddings: the config's context length, or None; informational
            (the scalings read L0 from ``scaling``). Set by :func:`posenc.rope.from_hf_config`.

    Hook: ``rotate``. Raises ValueError on an odd head_dim or rotary_dim, rotary_dim >
    head_dim, or an unknown dynamic_cache; scaling errors as :func:`rope_frequencies`.
    """

    name = "rope"
    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("head_dim",)

    def __init__(
        self,
        head_dim: int,
        *,
        rotary_dim: int | None = None,
        partial_rotary_factor: float | None = None,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: Mapping[str, Any] | None = None,
        dynamic_cache: str = "rerotate",
        hf_layout: Mapping[str, Any] | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__()
        check_even(head_dim, "head_dim")
        if rotary_dim is not None and partial_rotary_factor is not None:
            raise InvalidArgument("give rotary_dim or partial_rotary_factor, not both")
        if partial_rotary_factor is not None:
            if not 0 < partial_rotary_factor <= 1:
                raise InvalidArgument(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
            rotary_dim = int(head_dim * partial_rotary_factor)
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_even(rotary_dim, "rotary_dim")
        if rotary_dim > head_dim:
            raise InvalidArgument(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        check_number(base, "base (rope_theta)", gt=1)
        self.base, self.interleaved = float(base), check_bool(interleaved, "interleaved")
        self.scaling = dict(scaling) if scaling is not None else None
        # The frequencies, built once, in float64 and kept off the module's .to() (which would
        # round them): cos and sin are computed from them for exactly the positions asked, so
        # memory follows the number of positions in a call, never the largest position.
        self._inv_freq_f64, self.attention_factor = compute_rope_parameters(
            rotary_dim, self.base, self.scaling, None, dtype=torch.float64
        )
        if dynamic_cache not in DYNAMIC_CACHE_MODES:
            raise InvalidArgument(f"dynamic_cache must be one of {DYNAMIC_CACHE_MODES}, got {dynamic_cache!r}")
        self.dynamic_cache = dynamic_cache
        # a length-dependent type's frequencies (and attention factor) at any length (dict already checked above)
        record = rope_type_record(self.scaling)
        of_length, attention_of_length = record.of_length, record.attention_of_length
        self._of_length = None if of_length is None else of_length(rotary_dim, self.base, self.scaling)
        self._attention_of_length = (
            None if attention_of_length is None else attention_of_length(rotary_dim, self.base, self.scaling))
        self.length_dependent = self._of_length is not None
        # frozen dynamic_yarn: the query side carries the whole logit scale, so q and k tables differ
        self._query_carries_scale = self._attention_of_length is not None and dynamic_cache == "frozen"
        self.hf_layout, self.max_position_embeddings = hf_layout, max_position_embeddings
        self._freq_on: dict[torch.device, Tensor] = {}

    @property
    def inv_freq(self) -> Tensor:
        """float32 (r/2,), radians per token: Hugging Face's ``inv_freq``, for introspection;
        the float64 frequencies the rotation uses, rounded (within L0 for the
        length-dependent types)."""
        return self._inv_freq_f64.to(torch.float32)

    @property
    def call_invariant(self) -> bool:
        """False for dynamic / dynamic_yarn / longrope in "rerotate" mode: a longer call changes the
        frequencies of every token, so hidden states cached at a shorter length go stale."""
        return not (self.length_dependent and self.dynamic_cache == "rerotate")

    def _static_frequencies(self, device: torch.device) -> Tensor:
        """The length-independent float64 frequencies (r/2,) on ``device``."""
        return frequencies_on(self._inv_freq_f64, device, self._freq_on)

    def _lengths(self, positions: Tensor, seq_len: int | Tensor | None) -> Tensor | None:
        """The float64 length(s) a length-dependent type is evaluated at: ``positions + 1`` in
        the "frozen" mode, else the 0-d L = max(max(positions) + 1, seq_len); None for a static
        type, or when there is neither a position nor a seq_len.

        A tensor, so no value leaves the device (nothing to sync, nothing for
        ``torch.compile`` to break on).
        """
        if self._of_length is None:
            return None
        if self.dynamic_cache == "frozen":
            return (positions + 1).to(torch.float64)
        length = None if seq_len is None else torch.as_tensor(seq_len, dtype=torch.long, device=positions.device)
        if positions.numel():
            furthest = positions.max().to(torch.long) + 1
            length = furthest if length is None else torch.maximum(furthest, length)
        return None if length is None else length.to(torch.float64)

    def _frequencies(self, positions: Tensor, seq_len: int | Tensor | None) -> Tensor:
        """float64 frequencies for ``positions``: (r/2,) shared by the call, or one row per
        position ((T, r/2) or (B, T, r/2)) in the "frozen" mode.

        Length-dependent types take their record's ``of_length`` at :meth:`_lengths`.
        """
        lengths = self._lengths(positions, seq_len)
        if lengths is None:  # a static type, or no positions: nothing is rotated, any frequencies do
            return self._static_frequencies(positions.device)
        return self._of_length(lengths)

    def _attention_factors(self, positions: Tensor, seq_len: int | Tensor | None, role: str) -> float | Tensor:
        """The factor cos and sin are multiplied by: :attr:`attention_factor` (a float), or for a
        type whose factor follows the length (dynamic_yarn) a float64 tensor, 0-d in the
        "rerotate" mode, one per position in the "frozen" mode, where it is m(p + 1) for a
        ``"shared"`` table, m(p + 1)^2 for the query side and 1 for the key side."""
        lengths = None if self._attention_of_length is None else self._lengths(positions, seq_len)
        if lengths is None:
            return self.attention_factor
        if self.dynamic_cache == "frozen" and role == "key":
            return 1.0
        factor = self._attention_of_length(lengths)
        return factor * factor if self.dynamic_cache == "frozen" and role == "query" else factor

    def cos_sin(
        self, positions: Tensor, dtype: torch.dtype = torch.float32, seq_len: int | Tensor | None = None,
        *, role: str = "shared",
    ) -> tuple[Tensor, Tensor]:
        """cos and sin (attention factor included) at integer positions (T,) or (B, T).

        ``seq_len``: the current length for the length-dependent scalings (dynamic,
        dynamic_yarn, longrope; an int or a 0-d integer tensor); the length used is
        max(max(positions) + 1, seq_len). Ignored by the other types and in the "frozen"
        mode (position p uses length p + 1).

        ``role``: one of :data:`TABLE_ROLES`; it matters only for ``dynamic_yarn`` in the
        "frozen" mode, whose attention factor m differs per position: ``"query"`` tables carry
        m(p + 1)^2 and ``"key"`` tables none (what :meth:`rotate` uses: a logit scaled by its
        query's length alone), while a ``"shared"`` table (default; one table for q and k, as
        transformers' ``apply_rotary_pos_emb`` uses it) carries m(p + 1), so a logit is scaled
        by m(q + 1) m(k + 1). Every other type and mode gives the same table for each role.

        The angles are ``positions`` (int64 -> float64, exact below 2^53) times the float64
        frequencies, their cos and sin taken in float64 and rounded once to ``dtype``
        (docs/precision.md), computed for the positions asked only: memory and time follow
        the number of positions, whatever their values (a decoding step at 2^31 - 1 builds a
        few hundred bytes). Traces under ``torch.compile(fullgraph=True)`` for every rope_type.

        Returns two tensors (T, r) or (B, T, r) of ``dtype`` in this encoding's layout.
        """
        if role not in TABLE_ROLES:
            raise InvalidArgument(f"role must be one of {TABLE_ROLES}, got {role!r}")
        angles = positions.to(torch.float64).unsqueeze(-1) * self._frequencies(positions, seq_len)
        return cos_sin_table(angles, self._attention_factors(positions, seq_len, role), self.interleaved, dtype)

    def rotate(self, q, k, q_positions, k_positions):
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) rotated at q_positions and k_positions ((T,) or
        (B, T) integers), each returned in its own dtype; the rotation runs in float32 (float64
        for float64 inputs). Traces under ``torch.compile(fullgraph=True)`` (see :meth:`cos_sin`).

        On CUDA with Triton (outside ``torch.compile``), q and k are rotated in one fused launch
        from the positions and the float64 frequencies (:meth:`kernel_angles`;
        :func:`posenc.kernels.rotary_triton.fused_rope`): the same cos and sin, no tables.

        Raises:
            ValueError: q or k whose last dimension is not head_dim.
        """
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise InvalidArgument(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        seq_len = self._seq_len(q_positions, k_positions)
        if _kernels.use_triton(q, k):
            fused = self._rotate_fused(q, k, q_positions, k_positions, seq_len)
            if fused is not None:
                return fused
        q_dtype, k_dtype = torch.promote_types(q.dtype, torch.float32), torch.promote_types(k.dtype, torch.float32)
        # role passed only where it matters, so a subclass's cos_sin without it keeps working
        q_role, k_role = ({"role": "query"}, {"role": "key"}) if self._query_carries_scale else ({}, {})
        cos_q, sin_q = self.cos_sin(q_positions, q_dtype, seq_len, **q_role)
        if k_positions is q_positions and k_dtype == q_dtype and k_role == q_role:  # self-attention: one computation
            cos_k, sin_k = cos_q, sin_q
        else:
            cos_k, sin_k = self.cos_sin(k_positions, k_dtype, seq_len, **k_role)
        return rotate_heads(q, cos_q, sin_q, interleaved=self.interleaved), rotate_heads(k, cos_k, sin_k, interleaved=self.interleaved)

    def kernel_angles(self, positions: Tensor, seq_len: int | Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None] | None:
        """The angles of :meth:`cos_sin` as the fused kernel's inputs, or None if it cannot compute them.

        Returns ``(positions, inv_freq, pair_axis)`` with angle[..., i] =
        positions[pair_axis[i]] * inv_freq[..., i] (``pair_axis`` None: one row of positions):
        ``inv_freq`` float64, (r/2,) or one row per position ((T, r/2), (B, T, r/2): the
        "frozen" mode of the length-dependent scalings); the kernel multiplies cos and sin by
        :attr:`attention_factor`. A subclass whose angles differ (M-RoPE's per-axis positions)
        overrides this together with :meth:`cos_sin`; one that overrides only :meth:`cos_sin`
        gets None here, so it keeps the table path rather than silently losing its change. None
        too for a length-dependent attention factor (dynamic_yarn), which the kernel's one float
        cannot carry.
        """
        if type(self).cos_sin is not RoPE.cos_sin or self._attention_of_length is not None:
            return None
        return positions, self._frequencies(positions, seq_len), None

    def _rotate_fused(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, seq_len) -> tuple[Tensor, Tensor] | None:
        """q and k rotated by the Triton kernel in one launch, or None when it does not apply."""
        if q.dim() != 4 or k.dim() != 4:
            return None
        q_in, k_in = self.kernel_angles(q_positions, seq_len), self.kernel_angles(k_positions, seq_len)
        if q_in is None or k_in is None:
            return None
        (q_pos, q_freq, pair_axis), (k_pos, k_freq, _) = q_in, k_in
        return _kernels.rotary_kernels().fused_rope(
            q, k, q_pos, k_pos, q_freq, k_inv_freq=k_freq, pair_axis=pair_axis, interleaved=self.interleaved,
            attention_factor=self.attention_factor,
        )

    def _seq_len(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The call's length for the length-dependent scalings in "rerotate" mode, as a 0-d
        int64 tensor (the furthest query or key position + 1), else None."""
        if self.length_dependent and self.dynamic_cache == "rerotate" and q_positions.numel() and k_positions.numel():
            return torch.maximum(q_positions.max(), k_positions.max()).to(torch.long) + 1
        return None

    def to_hf_dict(self) -> dict[str, Any]:
        """The RoPE fields of a Hugging Face config.json (rope_theta, rope_scaling, head_dim, ...).

        An encoding built by :func:`posenc.rope.from_hf_config` (its ``hf_layout``) writes
        them back in the config's own spelling (v4 or v5), so the round trip is the identity;
        see :func:`~posenc.hf_config.rope.write_hf_config`.
        """
        # One of the two calls from an encoding up to the config module (IRoPE.from_hf_config is
        # the other): how a config spells RoPE is its knowledge; imported here, not at the top,
        # so that encodings load without it.
        from posenc.hf_config.rope import write_hf_config

        return write_hf_config(
            head_dim=self.head_dim, rotary_dim=self.rotary_dim, base=self.base, scaling=self.scaling,
            layout=self.hf_layout,
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, scaling={_short_repr(self.scaling)}"
            + (f", dynamic_cache={self.dynamic_cache!r}" if self.length_dependent else "")
        )


class ProportionalRoPE(RoPE):
    """Proportional RoPE, p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes
    Rotary Positional Encodings useful?", arXiv 2410.06205, section 6; Gemma 4's global layers):
    the rope_type ``proportional`` as an encoding of its own, for training from scratch.

    The frequencies of the whole head, theta_i = base^(-2i/d) for i < d/2, of which only the
    first ``int(partial_rotary_factor * d // 2)`` (the fastest) are kept; the others are 0, so
    those pairs pass through unrotated and carry content only (the paper's "semantic
    channels"). Equal to ``RoPE(head_dim, base=base, scaling={"rope_type": "proportional",
    "partial_rotary_factor": p})``; GPT-NeoX partial rotary (``RoPE(partial_rotary_factor=p)``)
    computes its frequencies over the rotated width instead (docs/encodings.md, "proportional vs
    NeoX").

    Args:
        head_dim: D, even.
        partial_rotary_factor: p in [0, 1], the share of frequency pairs kept; default 0.25,
            Gemma 4's (its config: ``{"rope_type": "proportional", "partial_rotary_factor": 0.25}``).
        base: rope_theta, default 10000.
        interleaved: the pair layout, as :class:`RoPE`.

    Hook: ``rotate``. Raises ValueError: an odd head_dim, p outside [0, 1], base not > 0.
    """

    name = "p_rope"

    def __init__(self, head_dim: int, *, partial_rotary_factor: float = 0.25, base: float = 10000.0,
                 interleaved: bool = False) -> None:
        if not is_real_number(partial_rotary_factor) or not 0 <= partial_rotary_factor <= 1:
            raise InvalidArgument(f"partial_rotary_factor must be a number in [0, 1], got {partial_rotary_factor!r}")
        super().__init__(head_dim, base=base, interleaved=interleaved,
                         scaling={"rope_type": "proportional", "partial_rotary_factor": partial_rotary_factor})
        self.partial_rotary_factor = partial_rotary_factor
