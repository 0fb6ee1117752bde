"""A small decoder-only language model whose positional encoding is a constructor argument.

Pre-LN GPT-style blocks (Radford et al. 2019): x + attn(LN(x)), x + mlp(LN(x)), a final LN
and an untied output head over a byte vocabulary. The encoding enters only through its hooks:
``embed`` at the input, and ``rotate`` / ``score_bias`` / ``content`` inside
:func:`posenc.attention`. The model never looks at the encoding's name. Layer ``i`` uses
``encoding.for_layer(i)``: one instance for every layer by default (T5 shares its bias table
across layers the same way), a per-layer schedule for iRoPE.

A **position plan** (:class:`posenc.plan.PositionPlan`, or a list of encodings, one
per layer) gives each layer its own encoding (None: NoPE) and attention span (full, a sliding
window of W keys, or chunks of C positions: :mod:`posenc.mask_rules`), as SmolLM3 (NoPE every
4th layer) and Cohere2 (RoPE on sliding-window layers, NoPE on full ones) do. The span is a
boolean mask on the call's positions and'ed with the user's ``mask``; a model of one encoding
runs exactly as before.

Shapes: B batch, T tokens, Tk keys (cached + new), d d_model, H heads, D = d / H.

Positions are explicit (DESIGN.md): ``forward(tokens, positions, mask=..., cache=...)`` runs a
full pass, a left-padded batch, packed documents or one decoding step through the same code.
Around the model: :mod:`posenc.masks` builds positions and masks for padded and packed
batches, :mod:`posenc.lab.generation` holds the KV cache and the decoding loop, and
:mod:`posenc.lab.checkpoint` owns the checkpoint format. Their public names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.fields import only_when_set
from posenc.lab import checkpoint
from posenc.attention import BACKENDS, attention
from posenc.attention.masks import check_mask, is_mask_mod
from posenc.encodings import REGISTRY, create_for_model
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.plan import LayerPlan, PositionPlan
from posenc.lab.generation import KVCache, generate
from posenc.mask_rules import in_sliding_window, position_at, same_chunk
from posenc.sequences import document_mask, key_padding_mask, positions_from_document_ids, positions_from_padding_mask
from posenc._validation import check_positions, check_positive_int
from posenc.errors import InvalidArgument, InvalidType


@dataclass(frozen=True)
class LMConfig:
    """Sizes of :class:`TransformerLM`. ``max_positions`` sizes tables that need one (the
    learned absolute encoding); other encodings ignore it. ``num_kv_heads``: the key-value
    heads, dividing ``num_heads`` (grouped-query attention, Ainslie et al. 2023; 1 is
    multi-query); None (default) means ``num_heads``, plain multi-head attention.

    Raises:
        ValueError: a size not an integer >= 1, d_model not divisible by num_heads,
            num_kv_heads not dividing num_heads, or an unknown backend.
    """

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 1024
    backend: str = "auto"
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio", "max_positions"):
            check_positive_int(getattr(self, name), name)
        if self.d_model % self.num_heads:
            raise InvalidArgument(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.num_kv_heads is not None:
            check_positive_int(self.num_kv_heads, "num_kv_heads")
            if self.num_heads % self.num_kv_heads:
                raise InvalidArgument(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.backend not in BACKENDS:
            raise InvalidArgument(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The key-value heads: ``num_kv_heads``, or ``num_heads`` when it is None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def encoding_sizes(self) -> dict:
        """The keyword arguments :func:`posenc.create_for_model` takes for this model."""
        return dict(d_model=self.d_model, num_heads=self.num_heads, head_dim=self.head_dim,
                    max_positions=self.max_positions, causal=True, num_layers=self.num_layers)

    def to_dict(self) -> dict:
        """The fields as plain data; ``num_kv_heads`` only when set, so that a config written
        before it existed (a run's fingerprint, a checkpoint) reads the same."""
        return only_when_set(asdict(self), {"num_kv_heads": None})


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LMConfig, sinks: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.backend = config.num_heads, config.kv_heads, config.backend
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.d_model, (config.num_heads + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        # gpt-oss's learned attention sinks: a logit per head in the softmax's denominator,
        # started at 0 (one extra key of logit 0 that no value follows)
        self.sinks = nn.Parameter(torch.zeros(config.num_heads)) if sinks else None

    def forward(
        self, x: Tensor, q_positions: Tensor | None, k_positions: Tensor | None, encoding: PositionalEncoding | None,
        mask: Tensor | None = None, past: tuple[Tensor, ...] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """x (B, T, d) -> (output (B, T, d), per-key tensors of past and new tokens: keys and
        values (B, H_kv, Tk, D), then the ``gate`` hook's values (B, H, Tk) for an encoding
        with it); the keys are returned unrotated, for a cache (why: :mod:`posenc.lab.generation`).
        Positions None: :func:`posenc.attention`'s defaults (the row indices). ``encoding``
        None: no positions (a NoPE layer of a plan)."""
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split([self.num_heads * self.head_dim, *[self.num_kv_heads * self.head_dim] * 2], dim=-1)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        # Everything kept per key has its token axis at dim 2: k, v (B, H_kv, T, D), and the gate
        # hook's values (B, H, T) (FoX's log forget gate), read from this layer's input x.
        per_key = (k, v, encoding.gate(x)) if encoding is not None and Hook.GATE in encoding.hooks else (k, v)
        if past is not None:
            per_key = tuple(torch.cat((old, new), dim=2) for old, new in zip(past, per_key))
        out = attention(
            q, per_key[0], per_key[1], encoding, causal=True, q_positions=q_positions, k_positions=k_positions,
            mask=mask, backend=self.backend, gates=per_key[2] if len(per_key) > 2 else None, sinks=self.sinks,
        )
        return self.proj(out.transpose(1, 2).reshape(batch, length, width)), per_key


class MLP(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: LMConfig, sinks: bool = False) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config, sinks)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, q_positions: Tensor, k_positions: Tensor, encoding: PositionalEncoding | None,
        mask: Tensor | None = None, past: tuple[Tensor, ...] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        attended, present = self.attn(self.ln_attn(x), q_positions, k_positions, encoding, mask, past)
        x = x + attended
        return x + self.mlp(self.ln_mlp(x)), present


class TransformerLM(nn.Module):
    """Decoder-only LM: tokens (B, T) int64 -> logits (B, T, vocab_size) float32.

    Args:
        config: sizes (:class:`LMConfig`).
        encoding: a :class:`~posenc.PositionalEncoding` instance, or a registered name built
            with :func:`posenc.create_for_model` for these sizes; or a **position plan**: a
            :class:`posenc.plan.PositionPlan` with one :class:`LayerPlan` per layer,
            or a list with one entry per layer, each an encoding, a registered name, None (NoPE)
            or a :class:`LayerPlan`. Layer i of a plan uses its encoding's ``for_layer(i)`` (a
            layer schedule such as iRoPE keeps its own plan), and its span: ``"full"``,
            ``"sliding"`` (query at position p sees keys at p - W < p' <= p) or ``"chunked"``
            (p' // C == p // C, p' <= p), applied as a boolean mask on positions, so a KV cache,
            left padding and packed rows chunk and slide on each sequence's own positions. A
            plan's ``embedding`` (an ``embed`` encoding) is added to the token embeddings.
            Encodings shared by several layers are one module (one set of parameters).

    The token embedding starts at unit variance per component, the scale of a sinusoidal
    vector, so that an absolute encoding neither drowns the tokens nor is drowned by them.

    Attributes:
        encoding: the model's one encoding; None for a plan model.
        plan: the :class:`PositionPlan` of a plan model; None for a model of one encoding.

    Raises:
        TypeError: config not an LMConfig, or encoding neither an encoding, a name nor a plan.
        ValueError: an unknown encoding name (the message lists the available ones); a plan
            whose length is not ``config.num_layers``, a layer with a logit soft-cap (this LM has
            none), an ``embed`` encoding on a layer (it belongs in ``plan.embedding``). A plan
            layer with ``sinks`` gets gpt-oss's learned attention sinks (a logit per head, started
            at 0, ``blocks[i].attn.sinks``).
    """

    def __init__(self, config: LMConfig, encoding: PositionalEncoding | str | PositionPlan | Sequence) -> None:
        super().__init__()
        if not isinstance(config, LMConfig):
            raise InvalidType(f"config must be a posenc.lab.model.LMConfig, got {type(config).__name__}")
        self.config = config
        self.plan: PositionPlan | None = None
        if isinstance(encoding, (PositionPlan, list, tuple)):
            self.plan = _as_plan(encoding, config)
            self.encoding = None
            # each distinct encoding once, so that layers sharing one share its parameters
            distinct = {id(e): e for e in (self.plan.embedding, *(layer.encoding for layer in self.plan)) if e is not None}
            self.plan_encodings = nn.ModuleList(distinct.values())
        else:
            if isinstance(encoding, str):
                encoding = create_for_model(encoding, **config.encoding_sizes())
            if not isinstance(encoding, PositionalEncoding):
                raise InvalidType("encoding must be a posenc.PositionalEncoding or a registered name (or a position plan: "
                                  f"a PositionPlan or a list, one entry per layer), got {type(encoding).__name__}")
            self.encoding = encoding
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, sinks=self.plan is not None and self.plan[index].sinks)
                                    for index in range(config.num_layers))
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
        """Largest number of positions the encoding (every encoding of a plan) can represent
        (None: unbounded)."""
        if self.plan is None:
            return self.encoding.max_positions
        bounds = [e.max_positions for e in self.plan_encodings if e.max_positions is not None]
        return min(bounds) if bounds else None

    @property
    def call_invariant(self) -> bool:
        """Whether a KV cache is exact: every encoding's ``call_invariant`` (see :class:`KVCache`)."""
        if self.plan is None:
            return self.encoding.call_invariant
        return all(e.call_invariant for e in self.plan_encodings)

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
                positions past a learned table. Checks that read values (tokens in the
                vocabulary, positions >= 0 or within a learned table) run in eager calls only:
                under ``torch.compile`` (``torch.compiler.is_compiling()``) they are skipped so
                that the forward is one graph; validate such inputs before the compiled call.
        """
        if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex \
                or tokens.dtype == torch.bool:
            raise InvalidType(f"tokens must be an integer tensor, got {getattr(tokens, 'dtype', type(tokens).__name__)}")
        if tokens.dim() != 2:
            raise InvalidArgument(f"tokens must have shape (B, T), got {tuple(tokens.shape)}")
        # The range check reads the tokens (a device sync, a graph break): eager calls only.
        if tokens.numel() and not torch.compiler.is_compiling() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.config.vocab_size:
            bad = int(tokens.max()) if int(tokens.max()) >= self.config.vocab_size else int(tokens.min())
            raise InvalidArgument(f"tokens must be in [0, {self.config.vocab_size}), got {bad}")
        if cache is not None and not isinstance(cache, KVCache):
            raise InvalidType(f"cache must be a posenc.lab.model.KVCache or None, got {type(cache).__name__}")
        batch, length = tokens.shape
        # the attention is told "default positions" (None) when they are: a kernel that reads
        # row indices (FlashAttention-2's ALiBi) may then serve it without checking them
        default_positions = positions is None and cache is None
        if positions is None:
            positions = cache.next_positions(length, tokens.device) if cache is not None else torch.arange(length, device=tokens.device)
        else:
            check_positions(positions[..., :0] if torch.compiler.is_compiling() else positions)
        k_positions = cache.key_positions(positions, batch) if cache is not None else positions
        attention_positions = (None, None) if default_positions else (positions, k_positions)
        x = self.token_embedding(tokens)
        if self.plan is not None:
            return self._forward_plan(x, positions, k_positions, attention_positions, mask, cache)
        if Hook.EMBED in self.encoding.hooks:
            x = self.encoding.embed(x, positions)
        presents = []
        for layer, block in enumerate(self.blocks):
            x, present = block(x, *attention_positions, self.encoding.for_layer(layer), mask,
                               cache.past(layer) if cache is not None else None)
            presents.append(present)
        if cache is not None:
            cache.update(presents, k_positions)
        return self.head(self.ln_final(x)).float()

    def _forward_plan(self, x: Tensor, positions: Tensor, k_positions: Tensor,
                      attention_positions: tuple[Tensor | None, Tensor | None], mask: Tensor | None,
                      cache: KVCache | None) -> Tensor:
        """The layers of a plan: each its encoding's ``for_layer(i)`` and its span's mask (one
        per distinct span, built once per call) and'ed with ``mask``."""
        if self.plan.embedding is not None:
            x = self.plan.embedding.embed(x, positions)
        batch, length = x.shape[:2]
        spans: dict[tuple[str, int | None], Tensor | None] = {}
        presents = []
        for layer, (block, step) in enumerate(zip(self.blocks, self.plan)):
            key = (step.span, step.window)
            if key not in spans:
                spans[key] = _with_span(mask, step, positions, k_positions, batch=batch, heads=self.config.num_heads,
                                        length=length)
            encoding = None if step.encoding is None else step.encoding.for_layer(layer)
            x, present = block(x, *attention_positions, encoding, spans[key],
                               cache.past(layer) if cache is not None else None)
            presents.append(present)
        if cache is not None:
            cache.update(presents, k_positions)
        return self.head(self.ln_final(x)).float()

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
        sequence, O(T) times the cost, to stay exact). Runs under ``torch.no_grad()``; the loop
        is :func:`posenc.lab.generation.generate`.

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
        return generate(self, tokens, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator,
                        padding_mask=padding_mask)

    def encoding_spec(self) -> dict:
        """``{"name": registry name, "kwargs": plain options}`` that rebuild the current
        encoding for this config (:func:`posenc.lab.checkpoint.encoding_spec`), from the
        constructor arguments the encoding recorded; for a plan model ``{"plan": ...}``
        (:func:`posenc.lab.checkpoint.plan_spec`: each distinct encoding's spec, and per layer
        its encoding's index, span, window and layer type).

        Raises:
            ValueError: an encoding cannot be rebuilt from a registered name and plain options.
        """
        if self.plan is not None:
            return checkpoint.plan_spec(self.plan, **self.config.encoding_sizes())
        return checkpoint.encoding_spec(self.encoding, **self.config.encoding_sizes())

    def save(self, path: str | Path) -> None:
        """Write a model checkpoint (config, encoding spec, weights) that
        :meth:`from_checkpoint` reads; the format is :mod:`posenc.lab.checkpoint`'s.

        Raises:
            ValueError: the encoding cannot be rebuilt (see :meth:`encoding_spec`).
        """
        checkpoint.save(Path(path), self.state_dict(), config=self.config.to_dict(), encoding=self.encoding_spec())

    @classmethod
    def from_checkpoint(cls, path: str | Path, map_location: str | torch.device = "cpu") -> TransformerLM:
        """Rebuild a model from a posenc checkpoint: one written by :meth:`save`, or a training
        checkpoint such as ``posenc extrapolate`` writes to ``OUT/checkpoints/<encoding>-seed<seed>.pt``
        (:mod:`posenc.lab.checkpoint` describes the format). Loaded with ``weights_only=True`` (no
        code runs from the file); returned in eval mode.

        Raises:
            FileNotFoundError: no such file.
            ValueError: unreadable, missing keys, or weights that do not fit the config.
        """
        config, spec, weights = checkpoint.read_model(path, map_location)
        try:
            config = LMConfig(**config)
            _check_sizes_fit_weights(config, spec, weights, path)
            if "plan" in spec:
                encoding = checkpoint.build_plan(spec, **config.encoding_sizes())
            else:
                encoding = create_for_model(spec["name"], **config.encoding_sizes(), **spec["kwargs"])
        except TypeError as err:
            raise InvalidArgument(f"checkpoint: {path}: its config or encoding is not one this posenc builds ({err})") from err
        model = cls(config, encoding)
        try:
            model.load_state_dict(weights)
        except RuntimeError as err:
            detail = " ".join(str(err).split())  # one line
            raise InvalidArgument(f"checkpoint: {path}: the weights do not fit its model config ({detail})") from err
        return model.eval()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _check_sizes_fit_weights(config: LMConfig, spec: dict, weights: dict, path: str | Path) -> None:
    """Refuse a checkpoint whose config asks for more parameters than it stores, before any
    allocation: a crafted ``num_layers`` of 10^6 or ``max_positions`` of 10^12 with a learned
    table would otherwise allocate until memory runs out. The bound is a floor of what every
    model of that config holds (token embedding, and per layer q, k, v, the output projection
    and the MLP: at least 4 d^2; a learned position table: max_positions x d), so an honest
    checkpoint always passes."""
    d = config.d_model
    floor = config.vocab_size * d + config.num_layers * 4 * d * d
    if "name" in spec and spec["name"] in REGISTRY:  # an encoding sized by max_positions: its table
        sizes = REGISTRY[spec["name"]].model_sizes
        if "max_positions" in (sizes.values() if isinstance(sizes, dict) else sizes) and \
                Hook.EMBED in REGISTRY[spec["name"]].hooks:
            floor += config.max_positions * d
    stored = sum(t.numel() for t in weights.values() if isinstance(t, Tensor))
    if floor > stored:
        raise InvalidArgument(f"checkpoint: {path}: the weights do not fit its model config (d_model {d}, num_layers "
                              f"{config.num_layers}, max_positions {config.max_positions} needs at least {floor:,} "
                              f"parameters, the file stores {stored:,}): refused before building it")


def _as_plan(plan: PositionPlan | Sequence, config: LMConfig) -> PositionPlan:
    """A plan of ``config.num_layers`` layers from a PositionPlan or a list (one entry per
    layer: an encoding, a registered name built for ``config``, None, or a LayerPlan)."""
    if not isinstance(plan, PositionPlan):
        built: dict[str, PositionalEncoding] = {}  # a name given for several layers is one instance

        def layer_plan(entry) -> LayerPlan:
            if isinstance(entry, LayerPlan):
                return entry
            if isinstance(entry, str):
                if entry not in built:
                    built[entry] = create_for_model(entry, **config.encoding_sizes())
                entry = built[entry]
            if entry is not None and not isinstance(entry, PositionalEncoding):
                raise InvalidType("a plan's entries must be posenc encodings, registered names, None (NoPE) or "
                                  f"LayerPlan, got {type(entry).__name__}")
            return LayerPlan(entry)

        plan = PositionPlan(tuple(layer_plan(entry) for entry in plan))
    if len(plan) != config.num_layers:
        raise InvalidArgument(f"plan: {len(plan)} layers for a model of num_layers={config.num_layers}: give one per layer")
    for index, layer in enumerate(plan):
        if layer.softcap is not None:  # not applied, not checkpointed: refused rather than dropped
            raise InvalidArgument(f"plan: layer {index} has a logit soft-cap ({layer.softcap}), which this LM does not "
                                  "apply")
        if layer.encoding is not None and Hook.EMBED in layer.encoding.hooks:
            raise InvalidArgument(
                f"plan: layer {index}'s {type(layer.encoding).__name__} adds positions to the embeddings (embed hook), "
                "not inside a layer: give it as the plan's embedding (PositionPlan(..., embedding=...))"
            )
    return plan


def _span_rule(layer: LayerPlan):
    """The elementwise rule of a sliding or chunked span (:mod:`posenc.mask_rules`)."""
    return in_sliding_window if layer.span == "sliding" else same_chunk


def span_mask(layer: LayerPlan, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
    """The span of ``layer`` on the grid of integer positions q (Tq,) or (B, Tq) and k (Tk,) or
    (B, Tk): boolean (Tq, Tk) or (B, Tq, Tk), True where the query may attend the key
    (:func:`posenc.mask_rules.in_sliding_window` for ``"sliding"``, q - k < W;
    :func:`~posenc.mask_rules.same_chunk` for ``"chunked"``, q // C == k // C; the causal mask
    is the attention's); None for a full span."""
    if layer.span == "full":
        return None
    return _span_rule(layer)(q_positions.unsqueeze(-1), k_positions.unsqueeze(-2), layer.window)


def _with_span(mask, layer: LayerPlan, q_positions: Tensor, k_positions: Tensor, *, batch: int, heads: int,
               length: int):
    """``mask`` (the user's: None, a boolean tensor or a mask_mod) and'ed with ``layer``'s span:
    a 4-D boolean tensor, or a mask_mod when ``mask`` is one; ``mask`` itself for a full span."""
    if layer.span == "full":
        return mask
    if is_mask_mod(mask):
        rule, window = _span_rule(layer), layer.window

        def mask_mod(b, h, q_idx, kv_idx):
            return mask(b, h, q_idx, kv_idx) & rule(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx),
                                                    window)

        return mask_mod
    span = span_mask(layer, q_positions, k_positions)
    span = span[None, None] if span.dim() == 2 else span[:, None]  # (B or 1, 1, Tq, Tk)
    if mask is None:
        return span
    return check_mask(mask, batch, heads, length, k_positions.shape[-1]).to(span.device) & span


__all__ = [
    "LMConfig", "CausalSelfAttention", "LayerPlan", "PositionPlan", "span_mask", "MLP", "Block", "TransformerLM", "KVCache",
    "positions_from_padding_mask", "key_padding_mask", "positions_from_document_ids", "document_mask",
]
