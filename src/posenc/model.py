"""A small decoder-only language model whose positional encoding is a constructor argument.

Pre-LN GPT-style blocks (Radford et al. 2019): x + attn(LN(x)), x + mlp(LN(x)), a final LN
and an untied output head over a byte vocabulary. The encoding enters only through its hooks:
``embed`` at the input, and ``rotate`` / ``score_bias`` / ``content`` inside
:func:`posenc.attention`. The model never looks at the encoding's name. One encoding instance
serves every layer (T5 shares its bias table across layers the same way).

Shapes: B batch, T tokens, d d_model, H heads, D = d / H.

Positions are explicit (DESIGN.md): ``forward(tokens, positions, mask=..., cache=...)`` runs a
full pass, a left-padded batch, packed documents or one decoding step through the same code.
Helpers build positions and masks the Hugging Face way: :func:`positions_from_padding_mask`
(left padding: cumsum(padding_mask) - 1), :func:`positions_from_document_ids` (packing:
positions restart at 0 in each document), :func:`key_padding_mask`, :func:`document_mask`.

The KV cache (:class:`KVCache`) stores, per layer, the keys *before* the encoding's rotate
(just after the projection) and the values, plus every cached key's position. Each step
calls :func:`posenc.attention` on the new queries and *all* keys with their explicit
positions, so the encoding sees every position as in a full pass: xPos re-centres each
call at its query block (its default ``center="query"``), FIRE normalizes by the absolute query position, Shaw /
Transformer-XL index their relative tables by the true distances, and dynamic-NTK RoPE in its
default ``dynamic_cache="rerotate"`` mode re-rotates old keys with the frequencies of the
current length; no special case anywhere. (That last one is exact in the first layer only:
deeper layers cache hidden states computed at a shorter length; see :class:`KVCache` and
``PositionalEncoding.call_invariant``.) The price: every step re-applies ``rotate`` to all Tk
cached keys, O(Tk D) per layer and head, the same order as the step's q.k^T itself (caching
rotated keys, as Hugging Face does, saves that rotation but is exact only for encodings whose key
transform never changes, i.e. not for dynamic NTK "rerotate" nor xPos "query" / "call").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import BACKENDS, attention
from .encodings import create_for_model
from .encodings.base import PositionalEncoding
from ._validation import check_positions, check_positive_int


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


# -- positions and masks for padded and packed batches -------------------------------------

def _check_padding_mask(padding_mask: Tensor) -> Tensor:
    if not isinstance(padding_mask, Tensor) or padding_mask.dim() != 2 or padding_mask.is_floating_point():
        got = tuple(padding_mask.shape) if isinstance(padding_mask, Tensor) else type(padding_mask).__name__
        raise ValueError(f"padding_mask must be a (B, T) boolean or 0/1 integer tensor, got {got}")
    if padding_mask.dtype != torch.bool and not bool(((padding_mask == 0) | (padding_mask == 1)).all()):
        raise ValueError("padding_mask must hold only 0 (pad) and 1 (token)")
    return padding_mask.bool()


def positions_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """Position ids of a padded batch, Hugging Face's convention for left padding.

    ``position_ids = cumsum(padding_mask) - 1`` along T, so each row's first real token is at
    position 0 whatever the padding before it; pad slots get position 1, as Hugging Face
    fills them (any value would do: pads are masked as keys by :func:`key_padding_mask`).

    Args:
        padding_mask: (B, T) bool or 0/1 integer, True / 1 for a real token, False / 0 for a pad.

    Returns:
        LongTensor (B, T).

    Raises:
        ValueError: not a (B, T) boolean or 0/1 tensor.
    """
    real = _check_padding_mask(padding_mask)
    positions = real.long().cumsum(-1) - 1
    return positions.masked_fill(~real, 1)


def key_padding_mask(padding_mask: Tensor) -> Tensor:
    """The attention ``mask`` that hides pad keys: (B, T) -> (B, 1, T) bool, broadcast over the
    queries (True = a real token, may be attended). Pad *queries* then see no key and
    :func:`posenc.attention` gives them a zero output; their logits are finite and meaningless.

    Raises:
        ValueError: not a (B, T) boolean or 0/1 tensor.
    """
    return _check_padding_mask(padding_mask).unsqueeze(1)


def _check_document_ids(document_ids: Tensor, argname: str) -> None:
    if not isinstance(document_ids, Tensor) or document_ids.dim() not in (1, 2) or document_ids.is_floating_point() \
            or document_ids.dtype == torch.bool:
        got = tuple(document_ids.shape) if isinstance(document_ids, Tensor) else type(document_ids).__name__
        raise ValueError(f"{argname} must be an integer tensor (T,) or (B, T), got {got}")


def positions_from_document_ids(document_ids: Tensor) -> Tensor:
    """Positions of packed rows: they restart at 0 where a new document begins.

    A document is a run of equal consecutive ids (e.g. ``[0, 0, 0, 1, 1, 2]`` gives positions
    ``[0, 1, 2, 0, 1, 0]``), as Hugging Face's ``DataCollatorWithFlattening`` writes
    ``position_ids``. With :func:`document_mask` each document is then computed as if alone.

    Args:
        document_ids: integer tensor (T,) or (B, T).

    Returns:
        LongTensor of the same shape.

    Raises:
        ValueError: not an integer tensor of rank 1 or 2.
    """
    _check_document_ids(document_ids, "document_ids")
    index = torch.arange(document_ids.shape[-1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values  # start of each token's run
    return index - first


def document_mask(q_document_ids: Tensor, k_document_ids: Tensor | None = None) -> Tensor:
    """The attention ``mask`` of packed rows: query i may attend key j iff they share a document.

    Args:
        q_document_ids: integer (Tq,) or (B, Tq).
        k_document_ids: integer (Tk,) or (B, Tk); default the same as the queries' (a full pass).

    Returns:
        bool (Tq, Tk), or (B, Tq, Tk) if either side is per row; combine it with the causal
        mask by passing it as ``mask=`` to :func:`posenc.attention` or :meth:`TransformerLM.forward`.

    Raises:
        ValueError: not integer tensors of rank 1 or 2.
    """
    _check_document_ids(q_document_ids, "q_document_ids")
    k_document_ids = q_document_ids if k_document_ids is None else k_document_ids
    _check_document_ids(k_document_ids, "k_document_ids")
    return q_document_ids.unsqueeze(-1) == k_document_ids.unsqueeze(-2)


def _cat_positions(past: Tensor | None, new: Tensor, batch: int) -> Tensor:
    """Key positions: the cached ones followed by the new ones, (T,) if both are, else (B, T)."""
    if past is None:
        return new
    if past.dim() == 1 and new.dim() == 1:
        return torch.cat((past, new))
    return torch.cat((past.expand(batch, -1), new.expand(batch, -1)), dim=-1)


class KVCache:
    """Keys and values of the tokens seen so far, for decoding token by token.

    Per layer, the keys *before* the encoding's rotate (just after the projection) and the
    values, (B, H, Tk, D) each, and the positions of the cached tokens, (Tk,) or (B, Tk).
    :meth:`TransformerLM.forward` with ``cache=`` reads it and, once the whole call has
    succeeded, appends the call's tokens (a failed call leaves it as it was). Why the keys are
    kept unrotated, and what it costs: see the module docstring.

    Exact (cached decoding = a full pass) when ``encoding.call_invariant`` is True, which holds
    for every registered encoding with its defaults. When it is False (dynamic NTK or longrope
    RoPE in ``dynamic_cache="rerotate"`` mode) the first layer is still exact, since its keys
    are re-rotated, but deeper layers' cached keys and values were computed from hidden states
    at a shorter length; :meth:`TransformerLM.generate` then decodes without a cache, and
    ``dynamic_cache="frozen"`` is the cache-exact choice.
    """

    def __init__(self, num_layers: int) -> None:
        check_positive_int(num_layers, "num_layers")
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.positions: Tensor | None = None

    def __len__(self) -> int:
        """Number of cached tokens, Tk."""
        return 0 if self.positions is None else self.positions.shape[-1]

    def past(self, layer: int) -> tuple[Tensor, Tensor] | None:
        """(keys, values) of ``layer``, or None when the cache is empty."""
        if self.keys[layer] is None:
            return None
        return self.keys[layer], self.values[layer]

    def next_positions(self, length: int, device: torch.device | None = None) -> Tensor:
        """Default positions of ``length`` new tokens: after the last cached one (arange when
        empty). Pass positions explicitly when the last cached slot is not the row's last
        position (right padding)."""
        if self.positions is None:
            return torch.arange(length, device=device)
        return self.positions[..., -1:] + 1 + torch.arange(length, device=self.positions.device)

    def update(self, presents: list[tuple[Tensor, Tensor]], positions: Tensor) -> None:
        """Replace the contents with every layer's (keys, values) and all key positions."""
        if len(presents) != len(self.keys):
            raise ValueError(f"presents: expected {len(self.keys)} layers, got {len(presents)}")
        for layer, (k, v) in enumerate(presents):
            self.keys[layer], self.values[layer] = k, v
        self.positions = positions


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.num_heads, self.backend = config.num_heads, config.backend
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(
        self, x: Tensor, q_positions: Tensor, k_positions: Tensor, encoding: PositionalEncoding,
        mask: Tensor | None = None, past: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (B, T, d) -> (output (B, T, d), (keys, values) (B, H, Tk, D) of past and new tokens);
        the keys are returned unrotated, for a cache."""
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)  # (B, H, Tk, D)
        out = attention(
            q, k, v, encoding, causal=True, q_positions=q_positions, k_positions=k_positions, mask=mask,
            backend=self.backend,
        )
        return self.proj(out.transpose(1, 2).reshape(batch, length, width)), (k, v)


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

    def forward(
        self, x: Tensor, q_positions: Tensor, k_positions: Tensor, encoding: PositionalEncoding,
        mask: Tensor | None = None, past: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        attended, present = self.attn(self.ln_attn(x), q_positions, k_positions, encoding, mask, past)
        x = x + attended
        return x + self.mlp(self.ln_mlp(x)), present


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

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Logits of every input token.

        Args:
            tokens: (B, T) int64.
            positions: integer (T,) or (B, T), the tokens' positions; default arange(T), or
                after the cache's last position (:meth:`KVCache.next_positions`).
            mask: boolean attention mask, True = may attend, (T, Tk), (B, T, Tk) or
                (B, H, T, Tk) (B, H and T may be 1 to broadcast) where Tk = len(cache) + T;
                combined with the causal mask. :func:`key_padding_mask` for padded rows,
                :func:`document_mask` for packed ones.
            cache: a :class:`KVCache`; the tokens attend to the cached ones and are appended.

        Returns:
            logits (B, T, vocab_size) float32.

        Raises:
            ValueError / TypeError: bad shapes or dtypes of tokens, positions or mask;
                positions past a learned table.
        """
        if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex \
                or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be an integer tensor, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tuple(tokens.shape)}")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.config.vocab_size:
            bad = int(tokens.max()) if int(tokens.max()) >= self.config.vocab_size else int(tokens.min())
            raise ValueError(f"tokens must be in [0, {self.config.vocab_size}), got {bad}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a posenc.model.KVCache or None, got {type(cache).__name__}")
        batch, length = tokens.shape
        if positions is None:
            positions = cache.next_positions(length, tokens.device) if cache is not None else torch.arange(length, device=tokens.device)
        else:
            check_positions(positions)
        k_positions = _cat_positions(cache.positions if cache is not None else None, positions, batch)
        x = self.token_embedding(tokens)
        if "embed" in self.encoding.hooks:
            x = self.encoding.embed(x, positions)
        presents = []
        for layer, block in enumerate(self.blocks):
            x, present = block(x, positions, k_positions, self.encoding, mask, cache.past(layer) if cache is not None else None)
            presents.append(present)
        if cache is not None:
            cache.update(presents, k_positions)
        return self.head(self.ln_final(x)).float()

    @torch.no_grad()
    def generate(
        self,
        tokens: Tensor,
        max_new_tokens: int,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Continue ``tokens`` by ``max_new_tokens`` tokens, one at a time with a :class:`KVCache`
        (without one if ``encoding.call_invariant`` is False: each step then re-runs the whole
        sequence, O(T) times the cost, to stay exact).

        Greedy (argmax, the first maximum on ties) when ``temperature`` and ``top_k`` are both
        None; otherwise samples from softmax(logits / temperature) (temperature 1.0 if only
        top_k is given) restricted to the ``top_k`` most likely tokens (tokens tied with the
        k-th are kept, as Hugging Face's ``TopKLogitsWarper`` does; top_k >= vocab_size keeps
        all). Sampling draws with ``generator``, so a seeded generator reproduces a run.

        Args:
            tokens: (B, T) int64 prompt, T >= 1.
            max_new_tokens: N >= 1.
            temperature: > 0, or None (greedy unless top_k is given).
            top_k: >= 1, or None.
            generator: a ``torch.Generator`` on the model's device for sampling.
            padding_mask: (B, T) bool or 0/1 for a left-padded batch (1 = real token; Hugging
                Face's ``attention_mask``): positions from :func:`positions_from_padding_mask`,
                pads hidden by :func:`key_padding_mask`, each row continued as if alone.

        Returns:
            (B, T + N) int64: the prompt followed by the new tokens.

        Raises:
            ValueError: a bad argument (named, with the allowed values); a row of padding only
                or padding not on the left; positions past the encoding's ``max_positions``.
            TypeError: tokens not an integer tensor, or generator not a torch.Generator.
        """
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, T) tensor with T >= 1, got {got}")
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"tokens must be an integer tensor, got {tokens.dtype}")
        check_positive_int(max_new_tokens, "max_new_tokens")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not 0 < temperature < float("inf")):
            raise ValueError(f"temperature must be a finite number > 0 (or None for greedy decoding), got {temperature!r}")
        if top_k is not None:
            check_positive_int(top_k, "top_k")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        batch, length = tokens.shape
        device = tokens.device
        if padding_mask is None:
            real = torch.ones(batch, length, dtype=torch.bool, device=device)
        else:
            real = _check_padding_mask(padding_mask).to(device)
            if real.shape != tokens.shape:
                raise ValueError(f"padding_mask must have the shape of tokens {tuple(tokens.shape)}, got {tuple(real.shape)}")
            if not bool(real[:, -1].all()) or bool((real[:, 1:] < real[:, :-1]).any()):
                raise ValueError("padding_mask: pad on the left only (zeros then ones), with at least one token per row")
        positions = positions_from_padding_mask(real)
        next_position = real.sum(-1, keepdim=True)  # (B, 1): each row's own length
        last = int(next_position.max()) + max_new_tokens - 2  # the furthest position fed to the model
        if self.max_positions is not None and last >= self.max_positions:
            raise ValueError(
                f"max_new_tokens: prompt ({int(next_position.max())} tokens) + max_new_tokens ({max_new_tokens}) "
                f"needs positions up to {last}, the encoding holds 0..{self.max_positions - 1}"
            )

        # An encoding that reads the whole call (encoding.call_invariant False, e.g. dynamic NTK
        # in "rerotate" mode) makes cached hidden states stale as the text grows: recompute the
        # whole sequence each step instead, so every step equals a full pass over its prefix.
        cache = KVCache(self.config.num_layers) if self.encoding.call_invariant else None
        logits = self(tokens, positions, mask=key_padding_mask(real), cache=cache)[:, -1]
        for step in range(max_new_tokens):
            new = self._next_token(logits, temperature, top_k, generator)  # (B, 1)
            tokens = torch.cat((tokens, new), dim=1)
            real = torch.cat((real, torch.ones_like(new, dtype=torch.bool)), dim=1)
            if step + 1 == max_new_tokens:
                break
            if cache is not None:
                logits = self(new, next_position, mask=key_padding_mask(real), cache=cache)[:, -1]
                next_position = next_position + 1
            else:
                logits = self(tokens, positions_from_padding_mask(real), mask=key_padding_mask(real))[:, -1]
        return tokens

    @staticmethod
    def _next_token(logits: Tensor, temperature: float | None, top_k: int | None, generator) -> Tensor:
        """logits (B, V) -> the chosen token (B, 1): argmax, or a draw (see :meth:`generate`)."""
        if temperature is None and top_k is None:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.float() / (1.0 if temperature is None else float(temperature))
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)

    @classmethod
    def from_checkpoint(cls, path: str | Path, map_location: str | torch.device = "cpu") -> TransformerLM:
        """Rebuild a trained model from a posenc training checkpoint.

        The file is a ``torch.save`` dict with ``"model"`` (the state_dict) and
        ``"fingerprint"`` holding the :class:`LMConfig` fields under ``fingerprint["model"]``
        and the registered encoding name under ``fingerprint["encoding"]``, as
        ``posenc extrapolate`` writes to ``OUT/checkpoints/<encoding>-seed<seed>.pt``. Loaded
        with ``weights_only=True`` (no code runs from the file); returned in eval mode.

        Raises:
            FileNotFoundError: no such file.
            ValueError: unreadable, missing keys, or weights that do not fit the config.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint: no such file: {path}")
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # torch raises many types for a truncated or foreign file
            raise ValueError(f"checkpoint: {path} is not a readable posenc checkpoint ({type(err).__name__})") from err
        try:
            fingerprint, weights = state["fingerprint"], state["model"]
            config, encoding = LMConfig(**fingerprint["model"]), fingerprint["encoding"]
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint: {path} lacks the 'model' weights or fingerprint['model'] / fingerprint['encoding'] "
                f"of a posenc training checkpoint ({type(err).__name__}: {err})"
            ) from err
        model = cls(config, encoding)
        try:
            model.load_state_dict(weights)
        except RuntimeError as err:
            detail = " ".join(str(err).split())  # one line
            raise ValueError(f"checkpoint: {path}: the weights do not fit its model config ({detail})") from err
        return model.eval()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
