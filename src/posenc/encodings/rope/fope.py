"""FoPE, Fourier Position Embedding (Hua et al. 2024, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", arXiv 2412.17739): RoPE whose
frequencies too slow to complete a period in training are dropped, and whose cos and sin of
the kept ones are mixed by a matrix per key/value head, so that each dimension carries a
Fourier series of several frequencies instead of one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._validation import check_bool, check_even, check_number, check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.encodings.rope.rotary import frequencies_on
from posenc.encodings.rope.scaling import compute_rope_parameters
from posenc.errors import InvalidArgument


def fope_frequencies(head_dim: int, *, rope_theta: float = 10000.0, max_position_embeddings: int | None = None,
                     num_inv_freq: int | None = None) -> Tensor:
    """The inverse frequencies FoPE keeps, float64 (F,), radians per token: RoPE's
    ``rope_theta^(-2i/head_dim)`` in float64 (as :class:`~posenc.encodings.RoPE` rotates with),
    of which the first ``num_inv_freq`` if given, else those whose float32 value is > 2 pi /
    ``max_position_embeddings`` (the ones that complete a period within the training length;
    strictly greater and in float32, as vLLM's ``FourierRotaryEmbedding._compute_inv_freq``;
    the official code keeps one exactly equal), else all of them.

    Raises:
        ValueError: head_dim not a positive even integer, rope_theta <= 1,
            max_position_embeddings not a positive integer, num_inv_freq not in
            [1, head_dim / 2], or both of them given; no frequency left.
    """
    check_even(head_dim, "head_dim")
    check_number(rope_theta, "rope_theta", gt=1)
    inv_freq = compute_rope_parameters(head_dim, float(rope_theta), None, None, dtype=torch.float64)[0]
    if num_inv_freq is not None and max_position_embeddings is not None:
        raise InvalidArgument("give num_inv_freq or max_position_embeddings, not both (num_inv_freq keeps the "
                              "first frequencies, max_position_embeddings those faster than 2 pi / it)")
    if num_inv_freq is not None:
        check_positive_int(num_inv_freq, "num_inv_freq")
        if num_inv_freq > head_dim // 2:
            raise InvalidArgument(f"num_inv_freq must be <= head_dim / 2 = {head_dim // 2}, got {num_inv_freq}")
        return inv_freq[:num_inv_freq]
    if max_position_embeddings is None:
        return inv_freq
    check_positive_int(max_position_embeddings, "max_position_embeddings")
    kept = inv_freq[inv_freq.to(torch.float32) > 2.0 * math.pi / max_position_embeddings]
    if kept.numel() == 0:
        raise InvalidArgument(f"max_position_embeddings = {max_position_embeddings}: no frequency of head_dim "
                              f"{head_dim} completes a period in it (the fastest, 1 rad / token, needs 7)")
    return kept


class FoPE(PositionalEncoding):
    """Fourier Position Embedding (Hua et al. 2024, arXiv 2412.17739, sec. 4), as Intern-S1-Pro
    ships it (vLLM ``vllm/model_executor/layers/rotary_embedding/fope.py`` @c215d1e;
    InternLM/xtuner ``xtuner/v1/module/rope/rope.py`` @b934f46, which trained it).

    With the F kept frequencies omega (:func:`fope_frequencies`) and a query or key x of head
    h at position t, half-split pairs (x_j, x_{j + D/2}) as Hugging Face's ``rotate_half``:

        C_h(t) = cos(t omega) @ cos_coef[h],   S_h(t) = sin(t omega) @ sin_coef[h]    (F,)
        c = [C_h(t), 1 ... 1] (D/2),   s = [S_h(t), 1 ... 1] (D/2)
        x' = x * [c, c] + rotate_half(x) * [s, s],   rotate_half(x) = [-x_{D/2:}, x_{:D/2}]

    The D/2 - F channels of the dropped frequencies are padded with 1 in cos *and* sin, as the
    official code (TsinghuaC3I/Fourier-Position-Embedding ``olmo/model.py`` @bd94b20), xtuner
    and vLLM all do (so such a pair becomes (x_j - x_{j+D/2}, x_{j+D/2} + x_j), not a pass-
    through; vLLM issue 55204 proposes sin 0, which the shipped checkpoints were not trained
    with): ``sin_pad_value`` 0.0 gives that variant. Query head h uses coefficient head
    h // (H / H_coef) (GQA, vLLM's ``repeat_kv`` order); queries and keys share the tables.
    With identity coefficients and every frequency kept, FoPE is RoPE (half-split) exactly.

    The score of a query and a key is not a function of m - n alone once the coefficients mix
    frequencies (the paper's point: each dimension a Fourier series, not one wave).

    Args:
        head_dim: D, the rotated width (every dimension; even).
        num_key_value_heads: H_coef, the heads the coefficients are per (``fope_sep_head``
            True); queries of H heads share them in groups of H / H_coef. Default 1: one set
            for every head (``create_for_model`` passes only head_dim; give the model's key/value
            heads, as Intern-S1-Pro's checkpoint has them).
        rope_theta: RoPE's base.
        max_position_embeddings: L, the training length: frequencies <= 2 pi / L are dropped.
            None (the default): none dropped by this rule.
        num_inv_freq: keep the first F frequencies instead (Intern-S1-Pro's ``num_inv_freq``).
        fope_init_factor: the coefficients start at the identity plus Xavier-normal noise of
            this gain (the official ``eye_xavier_norm``; its released configs use 0.3-0.6).
        fope_sep_head: one coefficient matrix per key/value head (True) or one for all.
        learnable: the coefficients as parameters (trained) or as buffers (False, the default:
            frozen at their random start, as the official configs and xtuner keep them).
        sin_pad_value: the sin value of the dropped channels (1.0 as shipped, or 0.0).

    Raises:
        ValueError: as :func:`fope_frequencies`; num_key_value_heads not a positive integer;
            fope_init_factor negative or not finite; sin_pad_value not 0.0 or 1.0.
        TypeError: fope_sep_head or learnable not a bool.
    """

    name = "fope"
    hooks = frozenset({Hook.ROTATE})
    # the key/value heads are no model size (a GQA model's differ from num_heads): given, or 1
    model_sizes = ("head_dim",)

    def __init__(self, head_dim: int, num_key_value_heads: int = 1, *, rope_theta: float = 10000.0,
                 max_position_embeddings: int | None = None, num_inv_freq: int | None = None,
                 fope_init_factor: float = 0.3, fope_sep_head: bool = True, learnable: bool = False,
                 sin_pad_value: float = 1.0) -> None:
        super().__init__()
        check_even(head_dim, "head_dim")
        check_positive_int(num_key_value_heads, "num_key_value_heads")
        check_bool(fope_sep_head, "fope_sep_head")
        check_bool(learnable, "learnable")
        gain = check_number(fope_init_factor, "fope_init_factor", ge=0.0)
        if sin_pad_value not in (0.0, 1.0) or isinstance(sin_pad_value, bool):
            raise InvalidArgument(f"sin_pad_value must be 1.0 (as shipped) or 0.0, got {sin_pad_value!r}")
        self.head_dim = head_dim
        self.num_key_value_heads = num_key_value_heads
        self.sin_pad_value = float(sin_pad_value)
        inv_freq = fope_frequencies(head_dim, rope_theta=rope_theta, max_position_embeddings=max_position_embeddings,
                                    num_inv_freq=num_inv_freq)
        # float64, kept off the module's .to() (a bf16 copy would round them: positions near a
        # million would then be off by thousands of radians), as RoPE keeps its own
        self._inv_freq_f64 = inv_freq
        self._freq_on: dict[torch.device, Tensor] = {}
        heads, count = (num_key_value_heads if fope_sep_head else 1), inv_freq.numel()
        for name in ("cos_coef", "sin_coef"):
            coef = _eye_xavier(heads, count, gain)
            if learnable:
                setattr(self, name, nn.Parameter(coef))
            else:
                self.register_buffer(name, coef)

    @classmethod
    def options_for_train_len(cls, train_len: int) -> dict[str, int]:
        """``max_position_embeddings = train_len``: FoPE drops the frequencies that do not
        complete a period within the training length (the official code's
        ``max_sequence_length``), so a model trained on windows of L tokens clips at L."""
        check_positive_int(train_len, "train_len")
        return {"max_position_embeddings": train_len}

    @property
    def inv_freq(self) -> Tensor:
        """float32 (F,), radians per token: the kept frequencies (:func:`fope_frequencies`)."""
        return self._inv_freq_f64.to(torch.float32)

    @property
    def num_inv_freq(self) -> int:
        """F, the frequencies kept."""
        return self._inv_freq_f64.numel()

    def tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(cos, sin) of shape (H_coef, T, D), or (B, H_coef, T, D) for (B, T) positions, in
        ``dtype``: the angles and their cos and sin in float64, mixed by the coefficients in
        float64 (the coefficients' gradient flows through), padded and doubled as the class
        docstring says."""
        angles = positions.to(torch.float64).unsqueeze(-1) * frequencies_on(self._inv_freq_f64, positions.device, self._freq_on)
        tables = []
        for trig, coef, pad in ((torch.cos, self.cos_coef, 1.0), (torch.sin, self.sin_coef, self.sin_pad_value)):
            mixed = torch.einsum("...tf,hfg->...htg", trig(angles), coef.to(torch.float64))
            filler = mixed.new_full((*mixed.shape[:-1], self.head_dim // 2 - mixed.shape[-1]), pad)
            half = torch.cat((mixed, filler), dim=-1)
            tables.append(torch.cat((half, half), dim=-1).to(dtype))
        return tables[0], tables[1]

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) and k (B, Hk, Tk, D) at their positions ((T,) or (B, T) int64),
        computed in float32 (float64 for float64 inputs) and cast back. H and Hk must be
        multiples of the coefficient heads.

        Raises:
            ValueError: a last dimension other than head_dim; a head count that is not a
                multiple of the coefficients' heads.
        """
        return self._rotate_one(q, q_positions, "q"), self._rotate_one(k, k_positions, "k")

    def _rotate_one(self, x: Tensor, positions: Tensor, what: str) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise InvalidArgument(f"{what}: last dimension {x.shape[-1]} != head_dim {self.head_dim}")
        heads, coef_heads = x.shape[1], self.cos_coef.shape[0]
        if heads % coef_heads:
            raise InvalidArgument(f"{what}: {heads} heads is not a multiple of FoPE's {coef_heads} coefficient heads "
                                  "(num_key_value_heads)")
        wide = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self.tables(positions, wide)
        group = heads // coef_heads
        if group > 1:  # query head h reads coefficient head h // group
            cos, sin = cos.repeat_interleave(group, dim=-3), sin.repeat_interleave(group, dim=-3)
        x_wide = x.to(wide)
        half = self.head_dim // 2
        rotated = torch.cat((-x_wide[..., half:], x_wide[..., :half]), dim=-1)
        return (x_wide * cos + rotated * sin).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, num_inv_freq={self.num_inv_freq}, "
                f"coefficient_heads={self.cos_coef.shape[0]}, sin_pad_value={self.sin_pad_value}")


def _eye_xavier(heads: int, count: int, gain: float) -> Tensor:
    """(heads, F, F) float32: the identity plus ``torch.nn.init.xavier_normal_`` noise of
    ``gain`` on the 3-D tensor (fan_in F * F, fan_out heads * F: std gain sqrt(2 / (F (F +
    heads)))), the official ``eye_xavier_norm`` and xtuner's init."""
    coef = torch.empty(heads, count, count)
    nn.init.xavier_normal_(coef, gain=gain)
    return coef + torch.eye(count)
