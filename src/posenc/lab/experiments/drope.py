"""DroPE: drop a trained RoPE model's rotation, then recalibrate it briefly at the training length.

Gelberg, Eguchi, Akiba and Cetin 2025, "Extending the Context of Pretrained LLMs by Dropping
Their Positional Embeddings" (Sakana AI, arXiv 2512.12167; reference code SakanaAI/DroPE,
``custom_models/drope.py`` and ``custom_models/attention.py``). The recipe, as the reference
code runs it:

- every layer's RoPE is removed (``attention_type: nope``: cos 1, sin 0 on every layer), the
  weights kept: the model becomes NoPE, its order left to the causal mask;
- optionally (``attention_type: qk_norm_nope``) a QK-norm is added: an RMSNorm with a learned
  weight (initialized to ones) over each token's whole query projection (all heads, H x D
  values) and another over its key projection, per layer, before the dot product; the softmax
  scale stays 1 / sqrt(D);
- then it is trained on, at the pretraining's sequence length (``max_seq_length`` = the
  model's original context: 2048 for SmolLM-360M, 8192 for SmolLM2-1.7B, 4096 for Llama-2-7B),
  with a fresh AdamW: SmolLM at lr 3e-4, 120k steps x 512 sequences; Llama-2-7B at lr 1e-4,
  cosine, 100 warm-up steps, 5000 steps x 512 x 4096 tokens = 10B tokens (0.5% of its 2T).

The lab's rows (:mod:`posenc.lab.experiments.rope_extension`) run that recipe on the trained
``rope`` model: ``drope_steps`` steps at L, the pretraining's batch, at ``drope_lr`` (default
``train.lr / 3``, the reference's Llama-2 ratio: 1e-4 against its pretraining's 3e-4) with the
lab's warm-up + cosine schedule.

The model never branches on the row: the NoPE row holds :class:`~posenc.encodings.nope.NoPE`,
the QK-norm row :class:`QKNormNoPE`, an encoding whose ``rotate`` hook is the norm (no
rotation), with its own weights per layer (:meth:`QKNormNoPE.for_layer`), as FoX keeps its gates.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._validation import check_positive_int
from posenc.encodings.base import Hook, PositionalEncoding, layer_of_copies
from posenc.encodings.nope import NoPE
from posenc.errors import InvalidArgument
from posenc.lab.model import TransformerLM

__all__ = ["DroPELM", "QKNormNoPE", "drope_encoding", "dropped_model"]


class QKNormNoPE(PositionalEncoding):
    """No position, and a QK-norm: DroPE's ``qk_norm_nope`` attention (arXiv 2512.12167,
    reference ``custom_models/attention.py``, ``qk_norm``): q <- RMSNorm(q) * w_q and k <-
    RMSNorm(k) * w_k, the root mean square taken per token over all its heads' values (the
    reference normalizes the (H x D) output of ``q_proj``, before the split into heads), w_q of
    shape (H, D) and w_k of shape (H_kv, D) learned, initialized to ones.

    Args:
        num_heads: H, query heads.
        num_kv_heads: H_kv, key heads (GQA); None means H.
        head_dim: D.
        num_layers: layers, each with its own two weights (:meth:`for_layer`); 1 shares them.
        eps: added to the mean square (the reference passes the model's ``rms_norm_eps``, 1e-5
            in SmolLM and Llama 2).

    Hook: ``rotate`` (q (B, H, Tq, D), k (B, H_kv, Tk, D), any float dtype; returned in it).

    Raises:
        InvalidArgument: a size not an integer >= 1; q or k whose head count or head_dim
            differs from the constructor's (:meth:`rotate`).
    """

    name = "qk_norm_nope"
    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("num_heads", "head_dim", "num_layers")

    def __init__(self, num_heads: int, num_kv_heads: int | None, head_dim: int, num_layers: int = 1,
                 eps: float = 1e-5) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for argname, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                               ("num_layers", num_layers)):
            check_positive_int(value, argname)
        self.eps = eps
        self.q_weight = nn.Parameter(torch.ones(num_heads, 1, head_dim))
        self.k_weight = nn.Parameter(torch.ones(num_kv_heads, 1, head_dim))
        self.deeper_layers = nn.ModuleList(QKNormNoPE(num_heads, num_kv_heads, head_dim, 1, eps)
                                           for _ in range(num_layers - 1))

    def for_layer(self, layer: int) -> PositionalEncoding:
        """Layer 0 is this instance, layer l > 0 the l-th of ``deeper_layers``."""
        return layer_of_copies(self, self.deeper_layers, layer)

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        return _rms_norm(q, self.q_weight, self.eps, "q"), _rms_norm(k, self.k_weight, self.eps, "k")


def _rms_norm(x: Tensor, weight: Tensor, eps: float, argname: str) -> Tensor:
    """x (B, H, T, D) normalized per (batch, token) over its H x D values, times weight (H, 1, D);
    computed in float32 at least, returned in x's dtype."""
    if x.dim() != 4 or x.shape[1] != weight.shape[0] or x.shape[3] != weight.shape[2]:
        raise InvalidArgument(f"{argname}: expected (B, {weight.shape[0]}, T, {weight.shape[2]}), got {tuple(x.shape)}")
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(dim=(1, 3), keepdim=True) + eps)
    return (normed * weight.to(wide.dtype)).to(x.dtype)


def drope_encoding(num_heads: int, num_kv_heads: int | None, head_dim: int, num_layers: int,
                   qk_norm: bool) -> PositionalEncoding:
    """What a DroPE model attends with: :class:`NoPE`, or :class:`QKNormNoPE` with ``qk_norm``."""
    if qk_norm:
        return QKNormNoPE(num_heads, num_kv_heads, head_dim, num_layers)
    return NoPE()


class DroPELM(TransformerLM):
    """The lab LM of a DroPE row. With a :class:`QKNormNoPE`, an encoding outside posenc's
    registry, its training checkpoints hold no encoding spec: they resume the row (the
    sweep builds the model itself), and :func:`posenc.lab.checkpoint.read_model` refuses them."""

    def encoding_spec(self) -> dict | None:
        if isinstance(self.encoding, QKNormNoPE):
            return None
        return super().encoding_spec()


def dropped_model(trained: TransformerLM, encoding: PositionalEncoding) -> DroPELM:
    """A :class:`DroPELM` with ``trained``'s weights and ``encoding`` in place of its own (a new
    encoding's parameters, QK-norm's weights, as initialized), on ``trained``'s device.

    Raises:
        InvalidArgument: ``trained`` holds weights outside its encoding that the new model lacks,
            or lacks some it needs (another architecture)."""
    model = DroPELM(trained.config, encoding)
    weights = {k: v for k, v in trained.state_dict().items() if not k.startswith("encoding.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or any(not k.startswith("encoding.") for k in missing):
        raise InvalidArgument(f"trained: its weights do not fit a DroPE model (missing {missing}, unexpected {unexpected})")
    return model.to(next(trained.parameters()).device)
