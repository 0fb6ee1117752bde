"""A small decoder-only language model whose positional encoding is a constructor argument.

Pre-LN GPT-style blocks (Radford et al. 2019): x + attn(LN(x)), x + mlp(LN(x)), a final LN
and an untied output head over a byte vocabulary. The encoding enters only through its hooks:
``embed`` at the input, and ``rotate`` / ``score_bias`` / ``content`` inside
:func:`posenc.attention`. The model never looks at the encoding's name. One encoding instance
serves every layer (T5 shares its bias table across layers the same way).

Shapes: B batch, T tokens, d d_model, H heads, D = d / H.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import BACKENDS, attention
from .encodings import create_for_model
from .encodings.base import PositionalEncoding, check_positions, check_positive_int


@dataclass(frozen=True)
class LMConfig:
    """Sizes of :class:`TransformerLM`. ``max_positions`` sizes tables that need one (the
    learned absolute encoding); other encodings ignore it."""

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 1024
    backend: str = "auto"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio", "max_positions"):
            check_positive_int(getattr(self, name), name)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.num_heads, self.backend = config.num_heads, config.backend
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: Tensor, positions: Tensor, encoding: PositionalEncoding) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        out = attention(q, k, v, encoding, causal=True, q_positions=positions, k_positions=positions, backend=self.backend)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, positions: Tensor, encoding: PositionalEncoding) -> Tensor:
        x = x + self.attn(self.ln_attn(x), positions, encoding)
        return x + self.mlp(self.ln_mlp(x))


class TransformerLM(nn.Module):
    """Decoder-only LM: tokens (B, T) int64 -> logits (B, T, vocab_size) float32.

    Args:
        config: sizes (:class:`LMConfig`).
        encoding: a :class:`~posenc.PositionalEncoding` instance, or a registered name built
            with :func:`posenc.create_for_model` for these sizes.

    The token embedding starts at unit variance per component, the scale of a sinusoidal
    vector, so that an absolute encoding neither drowns the tokens nor is drowned by them.
    """

    def __init__(self, config: LMConfig, encoding: PositionalEncoding | str) -> None:
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be a posenc.model.LMConfig, got {type(config).__name__}")
        if isinstance(encoding, str):
            encoding = create_for_model(
                encoding, d_model=config.d_model, num_heads=config.num_heads, head_dim=config.head_dim,
                max_positions=config.max_positions, causal=True,
            )
        if not isinstance(encoding, PositionalEncoding):
            raise TypeError(f"encoding must be a posenc.PositionalEncoding or a registered name, got {type(encoding).__name__}")
        self.config = config
        self.encoding = encoding
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.token_embedding.weight, std=1.0)

    @property
    def max_positions(self) -> int | None:
        """Largest number of positions the encoding can represent (None: unbounded)."""
        return self.encoding.max_positions

    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """tokens (B, T) int64; positions (T,) or (B, T), default arange(T) -> logits (B, T, V)."""
        if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex \
                or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be an integer tensor, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tuple(tokens.shape)}")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.config.vocab_size:
            bad = int(tokens.max()) if int(tokens.max()) >= self.config.vocab_size else int(tokens.min())
            raise ValueError(f"tokens must be in [0, {self.config.vocab_size}), got {bad}")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        else:
            check_positions(positions)
        x = self.token_embedding(tokens)
        if "embed" in self.encoding.hooks:
            x = self.encoding.embed(x, positions)
        for block in self.blocks:
            x = block(x, positions, self.encoding)
        return self.head(self.ln_final(x)).float()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
