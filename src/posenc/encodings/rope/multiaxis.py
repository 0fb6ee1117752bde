"""Multi-axis rotary embeddings: M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) and axial RoPE
(2-D / 3-D RoPE of image and video patches: EVA-02, Qwen2-VL's vision tower, rotary-embedding-torch).

Both rotate pairs exactly as RoPE does (:func:`~posenc.kernels.rotary_torch.apply_rotary`, either
pair layout); what changes is which position a pair reads. A position has A coordinates
(M-RoPE: temporal, height, width; axial: one per grid axis) and frequency pair i belongs to
one axis a(i):

    angle_i = p[a(i)] * theta_i + phi_i        (phi = 0 but for axial pixel frequencies)

so q'_m . k'_n depends on the positions through the per-axis differences p_m[a] - p_n[a]
only (each pair rotates by its own axis' difference).

Positions, as the hooks take them (see :meth:`PositionalEncoding.check_positions`):

- (T,) or (B, T): one coordinate per token, every axis equal: how Qwen2-VL positions text,
  and what the LM, the KV cache, packing and padding give. M-RoPE then *is* RoPE;
- (A, B, T), B 1 or the batch: axis-first, as Hugging Face's Qwen2-VL ``position_ids``
  (3, B, T). The sequence axis stays last, as in every other form.

:meth:`MultiAxisRoPE.check_positions` (which :func:`posenc.attention` calls) also takes
M-RoPE's (3, T) and axial RoPE's axis-last coordinates (T, A) and (B, T, A). A shape that
fits (T,) or (B, T) always reads as one coordinate per token: with a batch of 3, M-RoPE
positions must be written (3, 1, T) or (3, 3, T), not (3, T).

Angles are computed in float64 from the integer positions and rounded once (as RoPE,
docs/precision.md); everything reads shapes only, so the hooks trace under ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from posenc._validation import check_bool, check_even, check_number, check_position_values, fits_sequence_positions
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.encodings.rope.scaling import compute_rope_parameters, default_inv_freq_f64, rope_type_record
from posenc.encodings.rope.rotary import cos_sin_table
from posenc.kernels.rotary_torch import rotate_heads
from posenc.errors import InvalidArgument

#: Values of ``AxialRoPE(freqs_for=...)``, rotary-embedding-torch's names.
AXIAL_FREQS = ("lang", "pixel")


class MultiAxisRoPE(PositionalEncoding):
    """Common machinery of :class:`MRoPE` and :class:`AxialRoPE`: per-pair axis, frequency and
    phase tables, the positions' forms, cos/sin and the rotation. Not registered itself.

    A subclass calls :meth:`_init_tables` from its constructor and gives
    :meth:`_multi_axis_form` (its user forms of multi-axis positions) and
    :meth:`_forms_text` (their description for error messages).
    """

    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("head_dim",)

    def _init_tables(
        self, head_dim: int, rotary_dim: int, num_axes: int, interleaved: bool, axis_of_pair: Tensor,
        inv_freq: Tensor, phase: Tensor | None = None, attention_factor: float = 1.0,
    ) -> None:
        """axis_of_pair (r/2,) int64, inv_freq (r/2,) float64 radians per unit of position,
        phase (r/2,) float64 or None, for pairs i = 0 .. r/2 - 1."""
        self.head_dim, self.rotary_dim, self.num_axes, self.interleaved = head_dim, rotary_dim, num_axes, interleaved
        self.attention_factor = float(attention_factor)
        # float64 tables kept off the module's .to() (which would round them), as RoPE's
        self._inv_freq_f64, self._axis_of_pair, self._phase_f64 = inv_freq, axis_of_pair, phase
        self._tables_on: dict[torch.device, tuple[Tensor, Tensor, Tensor | None]] = {}

    @property
    def inv_freq(self) -> Tensor:
        """float32 (r/2,), radians per unit of position: the float64 frequencies, rounded, for
        introspection (as :attr:`RoPE.inv_freq`)."""
        return self._inv_freq_f64.to(torch.float32)

    @property
    def position_axes(self) -> int:
        return self.num_axes

    # -- positions -----------------------------------------------------------------------------
    def _multi_axis_form(self, positions: Tensor, length: int, batch: int) -> Tensor | None:
        """The user's multi-axis positions as (A, B, T), or None if their shape is not one of
        this encoding's forms (shapes only)."""
        raise NotImplementedError

    def _forms_text(self, length: int, batch: int) -> str:
        """The multi-axis shapes accepted, for messages."""
        raise NotImplementedError

    def check_positions(self, positions: Tensor, *, length: int, batch: int, argname: str = "positions") -> Tensor:
        """Positions for one call of ``length`` tokens and ``batch`` rows, checked, in the
        hooks' form: (T,) and (B, T) unchanged (every axis equal), the multi-axis forms
        axis-first (A, B, T) (a view, no copy).

        Raises:
            TypeError: not an integer tensor.
            ValueError: a negative entry (checked outside ``torch.compile``), or a shape
                that is neither (T,) / (B, T) nor one of this encoding's multi-axis forms
                (the message names ``argname`` and lists them).
        """
        check_position_values(positions, argname)
        if fits_sequence_positions(positions, length, batch):
            return positions
        form = self._multi_axis_form(positions, length, batch)
        if form is None:
            raise InvalidArgument(
                f"{argname} must have shape ({length},) or ({batch}, {length}) (one position per token, every axis "
                f"equal), or {self._forms_text(length, batch)}; got {tuple(positions.shape)}"
            )
        return form

    def _hook_positions(self, positions: Tensor, x: Tensor, argname: str) -> None:
        """Raise unless ``positions`` has a hook form for x (B, H, T, D): (T,), (B, T) or (A, B, T)."""
        length, batch = x.shape[2], x.shape[0]
        if fits_sequence_positions(positions, length, batch):
            return
        if positions.dim() == 3 and positions.shape[0] == self.num_axes and positions.shape[2] == length \
                and positions.shape[1] in (1, batch):
            return
        raise InvalidArgument(
            f"{argname} must have shape ({length},) or ({batch}, {length}) (every axis equal) or "
            f"({self.num_axes}, {batch}, {length}) (axis-first, B may be 1) for q/k of shape {tuple(x.shape)}, got "
            f"{tuple(positions.shape)}; other forms go through posenc.attention or encoding.check_positions()"
        )

    # -- cos, sin and the rotation -------------------------------------------------------------
    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
        """(inv_freq float64, axis_of_pair int64, phase float64 or None) on ``device``."""
        if torch.compiler.is_compiling():
            phase = None if self._phase_f64 is None else self._phase_f64.to(device)
            return self._inv_freq_f64.to(device), self._axis_of_pair.to(device), phase
        tables = self._tables_on.get(device)
        if tables is None:
            phase = None if self._phase_f64 is None else self._phase_f64.to(device)
            tables = self._tables_on[device] = (self._inv_freq_f64.to(device), self._axis_of_pair.to(device), phase)
        return tables

    def angles(self, positions: Tensor) -> Tensor:
        """float64 angles p[a(i)] * theta_i + phi_i: (T, r/2) or (B, T, r/2) for positions in a
        hook form ((T,), (B, T) or (A, B, T))."""
        inv_freq, axis_of_pair, phase = self._tables(positions.device)
        if positions.dim() <= 2:  # one coordinate per token: every axis reads it
            angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq
        else:  # (A, B, T) -> the coordinate each pair reads, (r/2, B, T) -> (B, T, r/2)
            angles = positions.index_select(0, axis_of_pair).to(torch.float64).movedim(0, -1) * inv_freq
        return angles if phase is None else angles + phase

    def cos_sin(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """cos and sin (attention factor included) at positions in a hook form: two tensors
        (T, r) or (B, T, r) of ``dtype`` in this encoding's pair layout, from float64 angles
        rounded once."""
        return cos_sin_table(self.angles(positions), self.attention_factor, self.interleaved, dtype)

    def _rotate_one(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = self.cos_sin(positions, torch.promote_types(x.dtype, torch.float32))
        return rotate_heads(x, cos, sin, interleaved=self.interleaved)

    def rotate(self, q, k, q_positions, k_positions):
        """q (B, H, Tq, D) and k (B, H_kv, Tk, D) rotated at their positions, each in a hook
        form: (T,) or (B, T) (every axis equal) or axis-first (A, B, T), B 1 or the batch.
        Each is returned in its own dtype; the rotation runs in float32 (float64 for float64
        inputs). Traces under ``torch.compile(fullgraph=True)``.

        Raises:
            ValueError: q or k whose last dimension is not head_dim; positions of another shape.
        """
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise InvalidArgument(f"q and k must have head_dim={self.head_dim}, got {q.shape[-1]} and {k.shape[-1]}")
        self._hook_positions(q_positions, q, "q_positions")
        self._hook_positions(k_positions, k, "k_positions")
        return self._rotate_one(q, q_positions), self._rotate_one(k, k_positions)



# -- M-RoPE ------------------------------------------------------------------------------------
def mrope_rotary_dim(head_dim: int, rotary_dim: int | None, base: float, interleaved: bool) -> int:
    """The rotary width of an M-RoPE (rotary_dim, default head_dim), checked with base and the
    pair-layout flag: the arguments M-RoPE and its variants share.

    Raises:
        ValueError: head_dim or rotary_dim not positive even, rotary_dim > head_dim, base <= 1.
        TypeError: interleaved not a bool.
    """
    check_even(head_dim, "head_dim")
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    check_even(rotary_dim, "rotary_dim")
    if rotary_dim > head_dim:
        raise InvalidArgument(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    check_number(base, "base (rope_theta)", gt=1)
    check_bool(interleaved, "interleaved")
    return rotary_dim


def static_rope_parameters(rotary_dim: int, base: float, scaling: Mapping[str, Any] | None) -> tuple[Tensor, float]:
    """(inv_freq float64 (r/2,), attention factor) of a static rope_type, as M-RoPE takes them.

    Raises:
        ValueError: a length-dependent type (dynamic, longrope: their frequencies follow the
            call's length, which multi-axis positions leave undefined); scaling errors.
    """
    if rope_type_record(scaling).length_dependent:
        raise InvalidArgument(
            f"scaling: rope_type {scaling.get('rope_type', scaling.get('type'))!r} depends on the call's length, "
            "which multi-axis positions leave undefined; M-RoPE takes the static rope_types"
        )
    return compute_rope_parameters(rotary_dim, float(base), scaling, None, dtype=torch.float64)


def _three_counts(section: Any) -> bool:
    """Whether ``section`` is 3 non-negative ints (an M-RoPE section of pairs or heads)."""
    return not isinstance(section, (str, bytes)) and isinstance(section, Sequence) and len(section) == 3 and all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)


def default_mrope_section(num_pairs: int) -> list[int]:
    """Qwen2-VL's proportions, [16, 24, 24] of 64 pairs: a quarter of the pairs temporal, the
    rest split between height and width (width takes the odd one)."""
    temporal = num_pairs // 4
    height = (num_pairs - temporal) // 2
    return [temporal, height, num_pairs - temporal - height]


def mrope_axis_of_pair(mrope_section: Sequence[int], mrope_interleaved: bool = False) -> Tensor:
    """The axis (0 temporal, 1 height, 2 width) of each frequency pair, int64 (sum(section),).

    Chunked (Qwen2-VL / Qwen2.5-VL, Hugging Face ``Qwen2VLRotaryEmbedding``): the first
    section[0] pairs temporal, the next section[1] height, the last section[2] width.
    Interleaved (Qwen3-VL, ``Qwen3VLTextRotaryEmbedding``, ``mrope_interleaved``): pair i is
    height if i % 3 == 1 and i < 3 section[1], width if i % 3 == 2 and i < 3 section[2],
    temporal otherwise: T H W T H W ... then temporal for the remaining pairs, so every axis
    spans high and low frequencies.
    """
    num_pairs = sum(mrope_section)
    if not mrope_interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(list(mrope_section)))
    i = torch.arange(num_pairs)
    axis = torch.zeros(num_pairs, dtype=torch.long)
    axis[(i % 3 == 1) & (i < 3 * mrope_section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * mrope_section[2])] = 2
    return axis


class MRoPE(MultiAxisRoPE):
    """Multimodal rotary position embedding, M-RoPE (Wang et al. 2024, "Qwen2-VL", arXiv
    2409.12191, section 2.1; Qwen2.5-VL, arXiv 2502.13923; Qwen3-VL's interleaved layout).

    RoPE whose r/2 frequency pairs theta_i = base^(-2i/r) are split between the temporal,
    height and width coordinates of a position: pair i rotates by p[a(i)] * theta_i, a(i)
    given by ``mrope_section`` and the layout (:func:`mrope_axis_of_pair`). Text tokens have
    the three coordinates equal, so on text M-RoPE is exactly RoPE; image and video tokens get
    their (t, h, w) grid coordinates (:func:`mrope_position_ids`).

    Layouts of the pairs (section [s_t, s_h, s_w]; example [4, 2, 2], 8 pairs, i = 0 .. 7):

    - chunked (Qwen2-VL, Qwen2.5-VL; default): T T T T H H W W: the high frequencies
      temporal, the low ones width;
    - interleaved (Qwen3-VL, ``mrope_interleaved=True``): T H W T H W T T: (T H W) repeated,
      then temporal for the rest; Qwen3-VL's [24, 20, 20] of 64 pairs is (T H W) x 20 then
      T T T T. A section whose height or width would run past the last pair (e.g. [2, 3, 3]
      of 8) is refused.

    Hugging Face computes cos/sin for all three axes and then picks each pair's axis
    (``recomposition_frequencies``; ``apply_multimodal_rotary_pos_emb`` in transformers 4.x);
    posenc picks each pair's coordinate first and computes one angle per pair: the same
    numbers. Pairs are half-split (i, i + r/2) as Hugging Face; ``interleaved=True`` pairs
    (2i, 2i+1) instead (the axis assignment is per pair either way).

    Args:
        head_dim: D, the per-head width of q and k (positive, even).
        mrope_section: pairs per axis (temporal, height, width), non-negative ints summing to
            rotary_dim / 2 (head_dim / 2 without partial rotary); Qwen2-VL [16, 24, 24],
            Qwen3-VL [24, 20, 20] for head_dim 128. Default: Qwen2-VL's proportions
            (:func:`default_mrope_section`).
        mrope_interleaved: Qwen3-VL's interleaved assignment instead of chunked sections.
        rotary_dim: r, leading dimensions rotated (even, <= head_dim); default D.
        base: rope_theta (Qwen2-VL 1e6, Qwen3-VL 5e6), > 1.
        interleaved: pair (2i, 2i+1) instead of (i, i + r/2).
        scaling: a Hugging Face ``rope_scaling`` dict of a static rope_type (linear, ntk,
            yarn, llama3, proportional, ...), as :class:`~posenc.encodings.rope.rotary.RoPE`;
            cos and sin carry its attention factor.

    Positions: (T,) / (B, T) (every axis equal), (3, B, T) (B may be 1) or, through
    :meth:`check_positions` / :func:`posenc.attention`, (3, T). Hook: ``rotate``.

    Raises:
        ValueError: head_dim or rotary_dim not positive even, rotary_dim > head_dim; a section
            that is not 3 non-negative ints, does not sum to rotary_dim / 2, or (interleaved)
            cannot be interleaved; base <= 1; a length-dependent scaling (dynamic, longrope:
            their frequencies follow the call's length, which multi-axis positions leave
            undefined); scaling errors as :func:`~posenc.encodings.rotary.rope_frequencies`.
        TypeError: a flag that is not a bool.
    """

    name = "mrope"

    def __init__(
        self,
        head_dim: int,
        *,
        mrope_section: Sequence[int] | None = None,
        mrope_interleaved: bool = False,
        rotary_dim: int | None = None,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = mrope_rotary_dim(head_dim, rotary_dim, base, interleaved)
        check_bool(mrope_interleaved, "mrope_interleaved")
        num_pairs = rotary_dim // 2
        section = self._default_section(num_pairs) if mrope_section is None else mrope_section
        if not _three_counts(section):
            raise InvalidArgument(
                f"mrope_section must be 3 non-negative integers (temporal, height, width pairs), got {mrope_section!r}"
            )
        section = [int(s) for s in section]
        if sum(section) != num_pairs:
            raise InvalidArgument(
                f"mrope_section must sum to rotary_dim/2 = {num_pairs} (the frequency pairs; head_dim/2 without "
                f"partial rotary), got {section} (sum {sum(section)})"
            )
        axis_of_pair = self._pair_axes(section, mrope_interleaved)
        inv_freq, attention_factor = static_rope_parameters(rotary_dim, base, scaling)
        self.base, self.scaling = float(base), dict(scaling) if scaling is not None else None
        self.mrope_section, self.mrope_interleaved = section, mrope_interleaved
        self._init_tables(head_dim, rotary_dim, 3, interleaved, axis_of_pair, inv_freq,
                          attention_factor=attention_factor)

    #: The section when none is given, from the number of pairs.
    _default_section = staticmethod(default_mrope_section)

    @staticmethod
    def _pair_axes(section: list[int], mrope_interleaved: bool) -> Tensor:
        """The axis of each pair for a checked ``section`` (:func:`mrope_axis_of_pair`); a
        subclass with another layout (VideoRoPE) overrides it.

        Raises:
            ValueError: an interleaved section whose height or width runs past the last pair.
        """
        axis_of_pair = mrope_axis_of_pair(section, mrope_interleaved)
        num_pairs = sum(section)
        if mrope_interleaved and torch.bincount(axis_of_pair, minlength=3).tolist() != section:
            raise InvalidArgument(
                f"mrope_section {section} cannot be interleaved over {num_pairs} pairs (T H W T H W ...): height "
                f"needs 3 * {section[1]} - 2 < {num_pairs} and width 3 * {section[2]} - 1 < {num_pairs}; "
                f"got axes of {torch.bincount(axis_of_pair, minlength=3).tolist()} pairs"
            )
        return axis_of_pair

    def _multi_axis_form(self, positions, length, batch):
        if positions.shape[0] != 3 or positions.shape[-1] != length:
            return None
        if positions.dim() == 2:
            return positions.unsqueeze(1)
        if positions.dim() == 3 and positions.shape[1] in (1, batch):
            return positions
        return None

    def _forms_text(self, length, batch):
        return f"(3, {length}) or (3, {batch}, {length}) (temporal, height, width)"

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"mrope_section={self.mrope_section}, mrope_interleaved={self.mrope_interleaved}, "
                f"interleaved={self.interleaved}")


def mrope_position_ids(segments: Sequence[Any], *, spatial_merge_size: int = 2) -> Tensor:
    """M-RoPE position ids (3, T), int64, of one sequence that mixes text, images and videos
    (the (3, T) slice of Hugging Face's ``get_rope_index`` for Qwen2-VL / Qwen2.5-VL).

    ``segments`` lists the sequence in order; each item is

    - an int n: n text tokens, at positions s, s+1, ..., s+n-1 on all three axes;
    - (t, h, w): an image or video of t x h x w patches (a row of ``image_grid_thw`` /
      ``video_grid_thw``, before the spatial merge), giving t * (h/m) * (w/m) tokens in
      t, row, column order (m = ``spatial_merge_size``), at (s + k, s + row, s + col);
    - (t, h, w, time_interval): a video whose temporal coordinate is s + floor(k *
      time_interval): Qwen2.5-VL's absolute time, time_interval = ``second_per_grid_t *
      tokens_per_second`` (e.g. 2 / fps * 25; Qwen2-VL and images use 1).

    s starts at 0 and each segment starts at the largest position used so far + 1 (paper,
    section 2.1: "incrementing the maximum position ID of the previous modality by one").
    Generated text continues at ``ids.max() + 1`` (Hugging Face's ``rope_deltas``). Batch
    rows of different layouts: stack rows of equal length with ``torch.stack(rows, dim=1)``
    -> (3, B, T); padding positions are arbitrary (masked).

    Qwen3-VL splits a video into frames (1, h, w) with text timestamps between them: write it
    as those segments. transformers 5.3 - 5.23 start the text after a video at s + max(h/m,
    w/m) instead, ignoring the temporal extent; they agree with this rule (and with
    transformers <= 5.2, vLLM and the paper) unless a video's temporal positions go past its
    spatial ones.

    Raises:
        ValueError: a segment of another form, a size < 1 (text may be 0), h or w not
            divisible by spatial_merge_size, a negative or non-finite time_interval.
    """
    if not isinstance(spatial_merge_size, int) or isinstance(spatial_merge_size, bool) or spatial_merge_size < 1:
        raise InvalidArgument(f"spatial_merge_size must be an integer >= 1, got {spatial_merge_size!r}")
    pieces, start = [], 0
    for index, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool) and segment >= 0:
            ids = torch.arange(start, start + segment).expand(3, -1)
        else:
            t, h, w, interval = _vision_segment(segment, index, spatial_merge_size)
            grid_h, grid_w = h // spatial_merge_size, w // spatial_merge_size
            temporal = (torch.arange(t, dtype=torch.float64) * interval).floor().long()
            tt, hh, ww = torch.meshgrid(temporal, torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
            ids = torch.stack((tt, hh, ww)).reshape(3, -1) + start
        pieces.append(ids)
        if ids.numel():
            start = int(ids.max()) + 1
    return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)


def _vision_segment(segment: Any, index: int, merge: int) -> tuple[int, int, int, float]:
    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(
            f"segments[{index}] must be an int (text tokens), (t, h, w) or (t, h, w, time_interval) (an image or "
            f"video grid in patches); {why}, got {segment!r}"
        )

    if isinstance(segment, Tensor):
        segment = segment.tolist()
    if not isinstance(segment, (tuple, list)) or len(segment) not in (3, 4):
        raise bad("another form")
    sizes = segment[:3]
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
        raise bad("t, h, w must be integers >= 1")
    t, h, w = sizes
    if h % merge or w % merge:
        raise bad(f"h and w must be divisible by spatial_merge_size={merge}")
    interval = 1.0 if len(segment) == 3 else segment[3]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
            or interval < 0:
        raise bad("time_interval must be a finite number >= 0")
    return t, h, w, float(interval)


# -- axial RoPE ---------------------------------------------------------------------------------
class AxialRoPE(MultiAxisRoPE):
    """Axial rotary position embedding: 2-D / 3-D RoPE for image and video patches (ViT / DiT:
    EVA-02, Fang et al. 2023, arXiv 2303.11331; Qwen2-VL's vision encoder; Pixtral, FiT; Heo
    et al. 2024, "Rotary Position Embedding for Vision Transformer", arXiv 2403.13298, "RoPE-Axial").

    The rotary dimensions are split between the A axes of a patch's coordinates (``axial_dims``,
    an even split by default); axis a's block of d_a dimensions is a RoPE of its own over that
    axis' coordinate, with its own frequency ladder. Pair j of axis a rotates by

        lang:  p_a * theta_j,              theta_j = base^(-2j / d_a), j < d_a / 2
        pixel: x_a * omega_j,              omega_j = pi * linspace(1, max_freq / 2, d_a / 2)[j],
                                           x_a = -1 + 2 p_a / (N_a - 1)  (N_a = grid_size[a])

    so scores depend on the per-axis differences of the coordinates only. Pairs are numbered
    axis by axis (axis 0's d_a/2 pairs first) and laid out over the r rotary dimensions
    half-split (i, i + r/2; default, Qwen2-VL's vision tower) or, with ``interleaved=True``,
    (2i, 2i+1), when each axis' block is contiguous (rotary-embedding-torch, EVA-02).

    Mapping to rotary-embedding-torch: ``RotaryEmbedding(dim=d, freqs_for=F, theta=base,
    max_freq=M).get_axial_freqs(N_0, ..., N_{A-1})`` with its ``apply_rotary_emb`` equals
    ``AxialRoPE(head_dim, axial_dims=[d] * A, interleaved=True, freqs_for=F, base=base,
    max_freq=M, grid_size=[N_0, ...])`` at integer positions p_a = 0 .. N_a - 1 (its pixel
    coordinates are ``linspace(-1, 1, N_a)``, which posenc computes from the integer index:
    positions stay integers). Its per-axis ``offsets`` are posenc's positions shifted. Pixtral
    differs: one ladder over head_dim whose even pairs go to height and odd pairs to width (the
    width ladder is the height one times base^(-2/D)); EVA-02 and Qwen2-VL's vision tower are
    the lang mode.

    Args:
        head_dim: D, the per-head width of q and k (positive, even).
        num_axes: A (>= 1; 2 for images, 3 for video); default len(axial_dims) or 2.
        axial_dims: the rotary dimensions of each axis, even ints >= 2 summing to rotary_dim;
            default rotary_dim / A each.
        rotary_dim: r (even, <= head_dim); default sum(axial_dims), else head_dim.
        base: rope_theta of the lang frequencies, > 1.
        freqs_for: "lang" (RoPE's ladder per axis) or "pixel" (rotary-embedding-torch's
            pixel frequencies, coordinates in [-1, 1]).
        max_freq: the pixel mode's highest frequency, omega = pi * max_freq / 2 (> 0).
        grid_size: the pixel mode's grid, N_a patches per axis (an int for all axes, or one per
            axis, each >= 1; N_a = 1 puts every index at -1, as ``linspace(-1, 1, 1)``).
            Required by, and only for, the pixel mode.
        interleaved: pair (2i, 2i+1) instead of (i, i + r/2).

    Positions: (T,) / (B, T) (every axis equal), axis-first (A, B, T) (B may be 1) and,
    through :meth:`check_positions` / :func:`posenc.attention`, coordinates axis-last (T, A)
    or (B, T, A). Hook: ``rotate``.

    Raises:
        ValueError: head_dim / rotary_dim / axial_dims not positive even (or not summing to
            rotary_dim, or rotary_dim > head_dim); rotary_dim not divisible into A even
            blocks (give axial_dims); num_axes < 1 or disagreeing with axial_dims; base <= 1;
            an unknown freqs_for; max_freq <= 0; a missing, bad or unneeded grid_size.
        TypeError: interleaved not a bool.
    """

    name = "axial_rope"

    def __init__(
        self,
        head_dim: int,
        *,
        num_axes: int | None = None,
        axial_dims: Sequence[int] | None = None,
        rotary_dim: int | None = None,
        base: float = 10000.0,
        freqs_for: str = "lang",
        max_freq: float = 10.0,
        grid_size: int | Sequence[int] | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        check_even(head_dim, "head_dim")
        check_bool(interleaved, "interleaved")
        if axial_dims is not None and (isinstance(axial_dims, (str, bytes)) or not isinstance(axial_dims, Sequence)):
            raise InvalidArgument(f"axial_dims must be a list of even integers (one per axis), got {axial_dims!r}")
        if num_axes is None:
            num_axes = len(axial_dims) if axial_dims is not None else 2
        if not isinstance(num_axes, int) or isinstance(num_axes, bool) or num_axes < 1:
            raise InvalidArgument(f"num_axes must be an integer >= 1, got {num_axes!r}")
        if axial_dims is not None and len(axial_dims) != num_axes:
            raise InvalidArgument(f"axial_dims must give one width per axis (num_axes={num_axes}), got {list(axial_dims)}")
        if rotary_dim is None:
            rotary_dim = sum(axial_dims) if axial_dims is not None and all(
                isinstance(d, int) for d in axial_dims) else head_dim
        check_even(rotary_dim, "rotary_dim")
        if rotary_dim > head_dim:
            raise InvalidArgument(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
        if axial_dims is None:
            if rotary_dim % (2 * num_axes):
                raise InvalidArgument(
                    f"rotary_dim={rotary_dim} does not split into {num_axes} axes of even width (it must be divisible "
                    f"by 2 * num_axes = {2 * num_axes}); give axial_dims, even widths summing to rotary_dim"
                )
            axial_dims = [rotary_dim // num_axes] * num_axes
        for d in axial_dims:
            check_even(d, "axial_dims entries")
        axial_dims = [int(d) for d in axial_dims]
        if sum(axial_dims) != rotary_dim:
            raise InvalidArgument(f"axial_dims must sum to rotary_dim={rotary_dim}, got {axial_dims} (sum {sum(axial_dims)})")
        check_number(base, "base (rope_theta)", gt=1)
        if freqs_for not in AXIAL_FREQS:
            raise InvalidArgument(f"freqs_for must be one of {AXIAL_FREQS}, got {freqs_for!r}")
        check_number(max_freq, "max_freq", gt=0)
        grid_size = self._check_grid(grid_size, freqs_for, num_axes)
        self.num_axes, self.axial_dims, self.base = num_axes, axial_dims, float(base)
        self.freqs_for, self.max_freq, self.grid_size = freqs_for, float(max_freq), grid_size

        axis_of_pair = torch.repeat_interleave(torch.arange(num_axes), torch.tensor(axial_dims) // 2)
        inv_freq, phase = [], None
        for a, d in enumerate(axial_dims):
            if freqs_for == "lang":
                inv_freq.append(default_inv_freq_f64(d, base))
            else:
                inv_freq.append(torch.linspace(1.0, max_freq / 2, d // 2, dtype=torch.float64) * math.pi)
        omega = torch.cat(inv_freq)
        if freqs_for == "pixel":
            # x = -1 + p * 2/(N - 1): angle = p * (2 omega/(N - 1)) - omega, exact in the integer p
            step = torch.tensor([2.0 / (n - 1) if n > 1 else 0.0 for n in grid_size], dtype=torch.float64)
            omega, phase = omega * step[axis_of_pair], -omega
        self._init_tables(head_dim, rotary_dim, num_axes, interleaved, axis_of_pair, omega, phase)

    @staticmethod
    def _check_grid(grid_size, freqs_for: str, num_axes: int) -> list[int] | None:
        if freqs_for != "pixel":
            if grid_size is not None:
                raise InvalidArgument(f"grid_size is for freqs_for='pixel' (coordinates in [-1, 1]); got {grid_size!r} "
                                 "with freqs_for='lang'")
            return None
        if grid_size is None:
            raise InvalidArgument("grid_size is required with freqs_for='pixel': the patches per axis that "
                             "span the coordinates [-1, 1] (rotary-embedding-torch's get_axial_freqs(*dims))")
        sizes = [grid_size] * num_axes if isinstance(grid_size, int) and not isinstance(grid_size, bool) else grid_size
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) != num_axes or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in sizes):
            raise InvalidArgument(f"grid_size must be an integer >= 1 or {num_axes} of them (one per axis), got {grid_size!r}")
        return [int(n) for n in sizes]

    def _multi_axis_form(self, positions, length, batch):
        if positions.shape[-1] != self.num_axes:
            return None
        if positions.dim() == 2 and positions.shape[0] == length:
            return positions.t().unsqueeze(1)
        if positions.dim() == 3 and positions.shape[1] == length and positions.shape[0] in (1, batch):
            return positions.permute(2, 0, 1)
        return None

    def _forms_text(self, length, batch):
        a = self.num_axes
        return f"({length}, {a}) or ({batch}, {length}, {a}) (one coordinate per axis, axis last)"

    def extra_repr(self) -> str:
        pixel = f", max_freq={self.max_freq}, grid_size={self.grid_size}" if self.freqs_for == "pixel" else ""
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, axial_dims={self.axial_dims}, "
                f"base={self.base}, freqs_for={self.freqs_for!r}{pixel}, interleaved={self.interleaved}")
