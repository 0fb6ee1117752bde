"""Apply a :class:`~posenc.plan.PositionPlan` to the transformers families whose
positions do not go through ``AttentionInterface`` and a ``rotary_emb`` module: one small
adapter per family whose attention is outside ``AttentionInterface``, kept in :data:`ADAPTERS`
by name and named by the family's record (:attr:`posenc.hf_config.families.Family.adapter`).

Each adapter hands the model's position computation to the plan's posenc encodings, the
model's own learned parameters shared with them (GPT-2's ``wpe``, OPT's ``embed_positions``
and T5's ``relative_attention_bias`` become the encodings' tables: one set of weights, trained
and saved as before), and leaves everything else to the model:

- ``gpt2`` (GPT-2, GPTBigCode): ``wpe`` is replaced by a module that returns the plan's
  :class:`~posenc.LearnedAbsolute` rows at the model's ``position_ids``.
- ``opt``: ``embed_positions`` likewise, positions from the attention mask as OPT computes
  them (``cumsum(mask) * mask - 1``, padding -1), read through the table's offset of 2; BioGPT's
  table takes OPT's call and offset, and BioGptModel always passes its ``position_ids``.
- ``bloom``: ``build_alibi_tensor`` returns posenc's ALiBi bias of each key as seen from
  position 0 (m * j, BLOOM's key-only form; the softmax ignores the per-query constant), at
  the positions of the attention mask; a model called without a mask is given one of ones
  (BLOOM otherwise builds its slopes itself).
- ``mpt``: ``build_mpt_alibi_tensor`` returns posenc's bias of every key as seen from the last
  position of the ``max_seq_len`` table, MPT's form.
- ``t5`` (T5, mT5, Switch Transformers, UMT5): the first self-attention layer of each stack
  computes its bias with the stack's :class:`~posenc.T5RelativeBias` (encoder: the plan's
  :attr:`encoder`); UMT5's every layer with its own.
- ``falcon`` with RoPE: ``rotary_emb`` becomes posenc's
  :class:`~posenc.integrations.transformers.RotaryEmbedding`.
- ``falcon`` with ALiBi: transformers builds the bias in a module-level function, so a
  forward pre-hook on each decoder layer replaces the ``alibi`` keyword and the alibi folded
  into the 4-d attention mask that FalconModel passes with posenc's bias, at the positions of
  the attention mask (``cumsum(mask) - 1``, padding 0).

Guarantee: :func:`apply_plan` ``(model, plan)`` with the model's own plan
(``posenc.hf_config.families_other``) reproduces the model's logits, tested on tiny models.

Any other posenc encoding (``use_encoding(model, encoding or name, layers=)``) replaces the
family's positions on the self-attention layers named (:class:`Stack`, T5: the encoder's
layers first, then the decoder's; cross-attention has no positions) and runs them through
:func:`posenc.attention`: GPT-2, OPT and T5 call transformers' ``AttentionInterface``, where
posenc's attention is registered (as for the Llama-shaped families); BLOOM, MPT and Falcon
compute attention in their own modules, so the layers named get a replacement ``forward``
(:attr:`Adapter.attention`: the model's own q/k/v projections, cache and output projection,
posenc's attention between). Without ``layers=`` the family's absolute table (GPT-2's ``wpe``,
OPT's ``embed_positions``) is replaced too, by the rows of an embedding encoding or by nothing;
with ``layers=`` it stays (it is added to the input, not per layer). Positions: the call's
``position_ids`` where the family takes them, else ``cumsum(attention_mask) - 1`` over the
cached and new tokens, else 0 .. T-1 (a forward pre-hook per stack); the cache holds the
model's unrotated keys. Every change is recorded and undone by the next :func:`apply_plan` or
``use_encoding`` (:func:`restore`): a second call replaces the first, never stacks on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.attention import attention as posenc_attention
from posenc.encodings.alibi import ALiBi
from posenc.encodings.base import PositionalEncoding
from posenc.encodings.learned import LearnedAbsolute
from posenc.encodings.rope.rotary import RoPE
from posenc.encodings.t5 import T5RelativeBias
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config.families import FAMILIES
from posenc.integrations.families import layer_stacks
from posenc.integrations.hf_masks import boolean_mask
from posenc.plan import PositionPlan

__all__ = ["ADAPTERS", "Adapter", "adapter_of", "Stack", "apply_plan", "restore", "PositionTable", "OPTPositionTable",
           "RotaryEmbedding", "ZeroPositions", "EmbeddingPositions"]


class RotaryEmbedding(nn.Module):
    """A drop-in for a Llama-shaped transformers rotary embedding module, backed by a posenc
    :class:`RoPE`: ``forward(x, position_ids) -> (cos, sin)``, each (B, T, rotary_dim) in x's
    dtype, in the RoPE's layout, attention factor included. Angles in float64, rounded once.
    (:func:`use_encoding` serves tables per layer instead; this module is for hand wiring.)"""

    def __init__(self, rope: RoPE) -> None:
        super().__init__()
        self.rope = rope

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.rope.cos_sin(position_ids, torch.promote_types(x.dtype, torch.float32))
        return cos.to(x.dtype), sin.to(x.dtype)


class PositionTable(nn.Module):
    """A drop-in for GPT-2's ``wpe``: ``forward(position_ids (B, T)) -> (B, T, d)``, the rows
    of a posenc :class:`~posenc.LearnedAbsolute` at those positions (in the table's dtype).

    The table's weight is this module's ``weight`` (the one parameter, shared with the
    encoding), so the model's state dict keeps the family's own key (``transformer.wpe.weight``,
    ``model.decoder.embed_positions.weight``): ``save_pretrained`` writes what a plain
    ``from_pretrained`` reads."""

    def __init__(self, table: LearnedAbsolute) -> None:
        super().__init__()
        self.weight = table.weight
        self.__dict__["table"] = table  # not a submodule: its one parameter is registered above

    def forward(self, position_ids: Tensor) -> Tensor:
        zeros = self.table.weight.new_zeros((*position_ids.shape, self.table.weight.shape[1]))
        return self.table.embed(zeros, position_ids)


class OPTPositionTable(PositionTable):
    """A drop-in for OPT's ``OPTLearnedPositionalEmbedding``: ``forward(attention_mask,
    cache_length=0, position_ids=None) -> (B, T, d)``; without ``position_ids`` the positions
    are OPT's, ``cumsum(mask) * mask - 1`` (padding -1) cut to the last ``T - cache_length``."""

    def __init__(self, table: LearnedAbsolute) -> None:
        super().__init__(table)
        self.offset = table.offset  # as OPTLearnedPositionalEmbedding's

    def forward(self, attention_mask: Tensor, cache_length: int = 0, position_ids: Tensor | None = None) -> Tensor:
        if position_ids is None:
            position_ids = (attention_mask.cumsum(dim=1) * attention_mask - 1).long()[:, cache_length:]
        return super().forward(position_ids)


def _only(plan: PositionPlan, kind: type, family: str):
    """The one encoding every layer of the plan holds (the families here share one)."""
    encodings = {id(layer.encoding): layer.encoding for layer in plan}
    if len(encodings) != 1 or not isinstance(next(iter(encodings.values())), kind):
        raise InvalidArgument(f"plan: the {family} adapter applies one {kind.__name__} on every layer, "
                              f"got {plan.describe()!r}")
    return next(iter(encodings.values()))


def _check_heads(encoding, num_heads: int, family: str) -> None:
    if encoding.num_heads != num_heads:
        raise InvalidArgument(f"plan: its encoding has {encoding.num_heads} heads, the {family} model {num_heads}")


def _check_table(table: LearnedAbsolute, weight: nn.Parameter, family: str) -> None:
    if tuple(table.weight.shape) != tuple(weight.shape):
        raise InvalidArgument(f"plan: its learned table is {tuple(table.weight.shape)}, the {family} model's "
                              f"{tuple(weight.shape)}")


# -- undo: a second use_encoding / apply_plan replaces the first, never stacks on it ---------------

#: Where the undo steps of what posenc changed on a model are kept (model.__dict__, not a submodule).
_UNDO = "_posenc_adapter_undo"


def restore(model: nn.Module) -> None:
    """Undo every change :func:`apply_plan` or ``use_encoding`` made to ``model``, last first:
    modules and functions swapped back, hooks removed. A model never changed is left as is."""
    for undo in reversed(model.__dict__.pop(_UNDO, [])):
        undo()


def on_undo(model: nn.Module, undo: Callable[[], None]) -> None:
    """Keep ``undo`` to be run by the next :func:`restore` of ``model``."""
    model.__dict__.setdefault(_UNDO, []).append(undo)


def replace_attribute(model: nn.Module, owner: Any, name: str, value: Any, submodule: bool = False) -> None:
    """``owner.name = value``, undone by :func:`restore`: a submodule swapped (``name`` one of
    ``owner``'s submodules, or ``submodule``), else a plain attribute of ``owner.__dict__``
    (a bound function shadowing a method, an encoding kept unregistered, a config field)."""
    modules = owner.__dict__.get("_modules", {})
    if name in modules or submodule:
        old_module = modules.get(name)
        setattr(owner, name, value)

        def undo_module() -> None:
            if old_module is not None:
                setattr(owner, name, old_module)
            else:
                delattr(owner, name)

        on_undo(model, undo_module)
        return
    had, old = name in owner.__dict__, owner.__dict__.get(name)
    owner.__dict__[name] = value

    def undo() -> None:
        if had:
            owner.__dict__[name] = old
        else:
            owner.__dict__.pop(name, None)

    on_undo(model, undo)


def hook(model: nn.Module, handle) -> None:
    """A hook handle removed by :func:`restore`."""
    on_undo(model, handle.remove)


# -- the plan adapters: each checks the plan against the model, then returns its application -------

def _base(model: nn.Module) -> nn.Module:
    return model.transformer if hasattr(model, "transformer") else model


def _own_table(module: nn.Module) -> nn.Module:
    """The family's own position table, where an encoding replaced it (kept as ``original``)."""
    return module.__dict__.get("original", module)


def _adapt_gpt2(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    base = _base(model)
    if not isinstance(plan.embedding, LearnedAbsolute) or plan.embedding.offset:
        raise InvalidArgument("plan: the gpt2 adapter needs a learned table without offset as the plan's embedding")
    _check_table(plan.embedding, _own_table(base.wpe).weight, "gpt2")

    def apply() -> None:
        plan.embedding.weight = base.wpe.weight
        replace_attribute(model, base, "wpe", PositionTable(plan.embedding))

    return apply


def _adapt_opt(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    decoder = _opt_decoder(model)
    table = _own_table(decoder.embed_positions)
    if not isinstance(plan.embedding, LearnedAbsolute) or plan.embedding.offset != table.offset:
        raise InvalidArgument("plan: the opt adapter needs a learned table with OPT's offset 2 as the plan's embedding")
    _check_table(plan.embedding, table.weight, "opt")

    def apply() -> None:
        plan.embedding.weight = decoder.embed_positions.weight
        replace_attribute(model, decoder, "embed_positions", OPTPositionTable(plan.embedding))

    return apply


def _ones_mask_hook(module, args, kwargs):
    """A base model's forward pre-hook giving a call without an attention mask one of ones
    over the cached and new tokens (BLOOM builds its own slopes without a mask)."""
    if kwargs.get("attention_mask") is not None:
        return None
    tokens = args[0] if args else kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs["inputs_embeds"][..., 0]
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    past = cache.get_seq_length() if cache is not None else 0
    kwargs["attention_mask"] = torch.ones(tokens.shape[0], past + tokens.shape[1], dtype=torch.long,
                                          device=tokens.device)
    return args, kwargs


def _adapt_bloom(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    base = _base(model)
    encoding = _only(plan, ALiBi, "bloom")
    _check_heads(encoding, base.num_heads, "bloom")

    def build_alibi_tensor(attention_mask: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
        _check_heads(encoding, num_heads, "bloom")
        positions = (attention_mask.cumsum(dim=-1) - 1) * attention_mask
        origin = positions.new_zeros((positions.shape[0], 1))
        bias = encoding.score_bias(origin, positions)  # (B, H, 1, T): m * j
        return bias.reshape(-1, 1, positions.shape[-1]).to(dtype)

    def apply() -> None:
        replace_attribute(model, base, "build_alibi_tensor", build_alibi_tensor)
        hook(model, base.register_forward_pre_hook(_ones_mask_hook, with_kwargs=True))

    return apply


def _adapt_mpt(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    base = _base(model)
    encoding = _only(plan, ALiBi, "mpt")
    _check_heads(encoding, base.num_heads, "mpt")

    def build_mpt_alibi_tensor(num_heads: int, sequence_length: int, alibi_bias_max: int = 8, device=None) -> Tensor:
        _check_heads(encoding, num_heads, "mpt")
        keys = torch.arange(sequence_length, device=device)
        return encoding.score_bias(keys[-1:], keys)  # (H, 1, L): -m (L - 1 - j)

    return lambda: replace_attribute(model, base, "build_mpt_alibi_tensor", build_mpt_alibi_tensor)


def _t5_tables(stack: nn.Module, stack_plan: PositionPlan) -> list[tuple[T5RelativeBias, nn.Module]]:
    """(encoding, self-attention module) for each bucket table of a T5 stack: T5's one table in the
    first layer, shared by the stack (the plan: one encoding on every layer), or UMT5's table in
    every layer (the plan: a distinct encoding per layer)."""
    attentions = [block.layer[0].SelfAttention for block in stack.block]
    if not all(attention.has_relative_attention_bias for attention in attentions[1:]):
        return [(_only(stack_plan, T5RelativeBias, "t5"), attentions[0])]
    encodings = [layer.encoding for layer in stack_plan]
    if len(encodings) != len(attentions) or not all(isinstance(e, T5RelativeBias) for e in encodings) \
            or len({id(e) for e in encodings}) != len(encodings):
        raise InvalidArgument(f"plan: the model has a bucket table in each of its {len(attentions)} layers of the stack; "
                              f"the t5 adapter needs a T5RelativeBias of its own per layer, got {stack_plan.describe()!r}")
    return list(zip(encodings, attentions))


def _adapt_t5(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    if plan.encoder is None:
        raise InvalidArgument("plan: the t5 adapter needs the encoder's plan (PositionPlan.encoder)")
    checked = []  # both stacks checked before either changes: a refusal leaves the model as it was
    for stack, stack_plan in ((model.encoder, plan.encoder), (model.decoder, plan)):
        for encoding, attention in _t5_tables(stack, stack_plan):
            _check_heads(encoding, attention.n_heads, "t5")
            if encoding.bidirectional == attention.is_decoder \
                    or encoding.num_buckets != attention.relative_attention_num_buckets \
                    or encoding.max_distance != attention.relative_attention_max_distance:
                raise InvalidArgument(f"plan: {encoding!r} is not the buckets of the model's "
                                      f"{'decoder' if attention.is_decoder else 'encoder'}")
            checked.append((encoding, attention))

    def apply() -> None:
        for encoding, attention in checked:
            encoding.relative_attention_bias = attention.relative_attention_bias  # one table, the model's

            def compute_bias(query_length, key_length, device=None, past_seen_tokens=0, _encoding=encoding):
                device = _encoding.relative_attention_bias.weight.device if device is None else device
                queries = torch.arange(query_length, device=device) + past_seen_tokens
                return _encoding.score_bias(queries, torch.arange(key_length, device=device)).unsqueeze(0)

            replace_attribute(model, attention, "compute_bias", compute_bias)

    return apply


def _adapt_falcon(model: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    base = _base(model)
    if base.use_alibi:
        return _adapt_falcon_alibi(model, base, plan)
    encoding = _only(plan, RoPE, "falcon")
    return lambda: replace_attribute(model, base, "rotary_emb", RotaryEmbedding(encoding))


def _adapt_falcon_alibi(model: nn.Module, base: nn.Module, plan: PositionPlan) -> Callable[[], None]:
    """Falcon with ``alibi``: FalconModel builds its bias in the module-level
    ``build_alibi_tensor`` and hands it to every decoder layer twice, as the ``alibi``
    keyword (B, H, 1, T_k), m * j, which the eager attention adds to q.k before its
    1/sqrt(head_dim), and folded into the 4-d ``attention_mask`` (B, H, T_q, T_k),
    m * j / sqrt(head_dim) on the attended entries, the dtype's min elsewhere (both attentions
    add it). A forward pre-hook on each layer replaces both with posenc's bias at FalconModel's
    positions, ``(cumsum(mask) - 1) * mask`` of the 2-d attention mask (ones without one),
    read by a pre-hook on FalconModel: the mask gets the encoding's bias of each key as seen
    from position 0 (scale included), the keyword the same divided by the encoding's scale."""
    encoding = _only(plan, ALiBi, "falcon")
    _check_heads(encoding, base.num_heads, "falcon")
    seen: dict[str, Tensor | None] = {}

    def read_mask(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        seen["mask"] = mask if mask is not None or len(args) < 3 else args[2]

    def replace_alibi(module, args, kwargs):
        hidden, mask_4d = args[0] if args else kwargs["hidden_states"], kwargs.get("attention_mask")
        if kwargs.get("alibi") is None or mask_4d is None or mask_4d.ndim != 4:
            raise InvalidArgument("falcon alibi: posenc replaces the bias FalconModel folds into a 4-d attention "
                                  "mask (eager or sdpa attention); this call has none")
        mask = seen.get("mask")
        key_length = mask_4d.shape[-1]
        if mask is None:
            mask = torch.ones(hidden.shape[0], key_length, dtype=torch.long, device=hidden.device)
        if mask.ndim != 2 or mask.shape[-1] != key_length:
            raise InvalidArgument(f"falcon alibi: a 2-d attention mask over the {key_length} keys is needed, "
                                  f"got shape {tuple(mask.shape)}")
        positions = (mask.cumsum(dim=-1) - 1) * mask
        bias = encoding.score_bias(positions.new_zeros((positions.shape[0], 1)), positions)  # (B, H, 1, T_k)
        kwargs["alibi"] = (bias / encoding.scale).to(hidden.dtype)
        kwargs["attention_mask"] = torch.masked_fill(bias.to(hidden.dtype), mask_4d < -1,
                                                     torch.finfo(hidden.dtype).min)
        return args, kwargs

    def apply() -> None:
        hook(model, base.register_forward_pre_hook(read_mask, with_kwargs=True))
        for layer in base.h:
            hook(model, layer.register_forward_pre_hook(replace_alibi, with_kwargs=True))

    return apply


# -- any posenc encoding: the family's self-attention layers, stack by stack ------------------------

@dataclass(frozen=True)
class Stack:
    """One stack of a family's self-attention layers, as the encoding route sees it.

    Attributes:
        name: "decoder" or "encoder" (T5).
        base: the module whose forward pre-hook reads each call's positions (its ``input_ids``
            or ``inputs_embeds``, ``attention_mask`` and cache).
        first_block: the stack's first layer, whose input an embedding encoding is added to
            (where the family has no absolute table to replace).
        attentions: the self-attention module of each layer, in order.
        causal: the stack's attention is causal.
        num_heads, head_dim, d_model, max_positions: the sizes an encoding by name is built for.
    """

    name: str
    base: nn.Module
    first_block: nn.Module
    attentions: tuple[nn.Module, ...]
    causal: bool
    num_heads: int
    head_dim: int
    d_model: int
    max_positions: int


@dataclass(frozen=True)
class Adapter:
    """One family's entry of :data:`ADAPTERS`.

    Attributes:
        plan: ``(model, plan) -> apply``: checks a plan of the family's own kind against the
            model (raising before any change) and returns the function applying it.
        stacks: ``model -> (Stack, ...)``: the self-attention stacks, encoder first.
        attention: the replacement forward of one self-attention module on a layer that takes
            a posenc encoding, ``(module, encoding, positions, *args, **kwargs)`` with the
            module's own arguments, returning what the module returns; None: the family's
            attention goes through transformers' ``AttentionInterface`` (posenc's attention is
            registered there, as for the Llama-shaped families).
        table: ``model -> (owner, name)`` of the family's absolute position table, which an
            encoding replaces (an embedding encoding's rows, or nothing); None: no table.
        interface: ``model -> modules``: every module that calls ``AttentionInterface``
            (cross-attention included), for the layers that keep the model's own attention.
    """

    plan: Callable[[nn.Module, PositionPlan], Callable[[], None]]
    stacks: Callable[[nn.Module], tuple[Stack, ...]]
    attention: Callable[..., Any] | None = None
    table: Callable[[nn.Module], tuple[nn.Module, str]] | None = None
    interface: Callable[[nn.Module], list[nn.Module]] | None = None

    def __call__(self, model: nn.Module, plan: PositionPlan) -> None:
        """Apply a plan of the family's own kind (the earlier ``ADAPTERS[model_type](model, plan)``)."""
        apply = self.plan(model, plan)
        restore(model)
        apply()


class ZeroPositions(nn.Module):
    """A drop-in for a family's absolute position table that adds nothing (the positions
    come from the layers' encoding): ``forward(*args, position_ids=None) -> 0`` broadcastable
    to (B, T, d) (GPT-2 calls it with ``position_ids``, OPT with its mask and ``position_ids``)."""

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        reference = kwargs.get("position_ids")
        if reference is None:
            reference = args[-1] if args and isinstance(args[-1], Tensor) else args[0]
        return torch.zeros((), device=reference.device)


class EmbeddingPositions(nn.Module):
    """A drop-in for a family's absolute position table backed by an embedding encoding
    (sinusoidal, learned): ``forward(position_ids (B, T)) -> (B, T, d)`` in the replaced
    table's dtype (``like``'s), the encoding's ``embed`` of zeros at those positions; OPT's
    call ``(mask, cache_length, position_ids)`` too. Padding positions (OPT's -1) are read at
    0 (their rows are masked)."""

    def __init__(self, encoding: PositionalEncoding, d_model: int, like: Tensor) -> None:
        super().__init__()
        self.__dict__["encoding"] = encoding  # registered once, on the base model
        self.d_model = d_model
        # follows the model's dtype and device (model.to(...)): the rows come in the table's dtype
        self.register_buffer("like", like.new_zeros(0), persistent=False)

    def forward(self, *args: Any, position_ids: Tensor | None = None) -> Tensor:
        if position_ids is None:
            position_ids = args[-1] if len(args) in (1, 3) and isinstance(args[-1], Tensor) else None
        if position_ids is None:  # OPT without position_ids: its own cumsum(mask) * mask - 1
            mask, cache_length = args[0], args[1] if len(args) > 1 else 0
            position_ids = (mask.cumsum(dim=1) * mask - 1).long()[:, cache_length:]
        position_ids = position_ids.clamp(min=0)
        zeros = self.like.new_zeros((*position_ids.shape, self.d_model))
        return self.encoding.embed(zeros, position_ids.to(zeros.device))


def _heads_out(context: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, T, H * D)."""
    return context.transpose(1, 2).reshape(context.shape[0], context.shape[2], -1)


def _attend(module: nn.Module, encoding: PositionalEncoding, positions: dict, q: Tensor, k: Tensor, v: Tensor,
            mask: Tensor | None, scale: float, dropout: float) -> Tensor:
    """posenc's attention of one layer: q (B, H, Tq, D), k and v (B, H_kv, Tk, D) with the
    cache's keys (unrotated: posenc rotates each key at its position on every call), at the
    call's positions read by the stack's pre-hook -> (B, H, Tq, D)."""
    q_positions, k_positions = positions["q"], positions["k"]
    if k.shape[2] != k_positions.shape[-1]:
        raise InvalidArgument(f"layer {getattr(module, 'layer_idx', '?')}: {k.shape[2]} keys for "
                              f"{k_positions.shape[-1]} positions: a StaticCache keeps keys in fixed slots, which "
                              "posenc's attention cannot position; generate with the default DynamicCache")
    batch = q.shape[0]
    return posenc_attention(q, k, v, encoding, causal=True, q_positions=q_positions.expand(batch, -1),
                            k_positions=k_positions.expand(batch, -1), mask=mask, scale=scale, dropout_p=dropout)


def _bloom_attention(module, encoding, positions, hidden_states, residual, alibi=None, attention_mask=None,
                     layer_past=None, use_cache=False, output_attentions=False, **kwargs):
    """BloomAttention.forward without its ALiBi: (output + residual, None)."""
    q, k, v = module._reshape(module.query_key_value(hidden_states))
    if layer_past is not None:
        k, v = layer_past.update(k, v, module.layer_idx)
    dropout = module.attention_dropout.p if module.training else 0.0
    out = _attend(module, encoding, positions, q, k, v, boolean_mask(attention_mask), module.inv_norm_factor, dropout)
    out = module.dense(_heads_out(out))
    return residual + nn.functional.dropout(out, p=module.hidden_dropout, training=module.training), None


def _mpt_attention(module, encoding, positions, hidden_states, position_bias=None, cache=None, attention_mask=None,
                   **kwargs):
    """MptAttention.forward without its ALiBi: (output, None)."""
    batch, length = hidden_states.shape[:2]
    mixed = module.Wqkv(hidden_states)
    if module.clip_qkv:
        mixed = mixed.clamp(min=-module.clip_qkv, max=module.clip_qkv)
    q, k, v = (x.reshape(batch, length, module.n_heads, module.head_dim).transpose(1, 2) for x in mixed.chunk(3, dim=2))
    if cache is not None:
        k, v = cache.update(k, v, module.layer_idx)
    dropout = module.attn_dropout_p if module.training else 0.0
    out = _attend(module, encoding, positions, q, k, v, boolean_mask(attention_mask, true_masks=True),
                  module.softmax_scale, dropout)
    return module.out_proj(_heads_out(out)), None


def _falcon_attention(module, encoding, positions, hidden_states, alibi=None, attention_mask=None, position_ids=None,
                      layer_past=None, use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
    """FalconAttention.forward without its rotary or ALiBi: (output, None)."""
    q, k, v = module._split_heads(module.query_key_value(hidden_states))
    num_kv_heads = module.num_heads if module.new_decoder_architecture else module.num_kv_heads
    batch, length = q.shape[:2]
    q = q.transpose(1, 2).reshape(batch, module.num_heads, length, module.head_dim)
    k = k.transpose(1, 2).reshape(batch, num_kv_heads, length, module.head_dim)
    v = v.transpose(1, 2).reshape(batch, num_kv_heads, length, module.head_dim)
    if layer_past is not None:
        k, v = layer_past.update(k, v, module.layer_idx)
    dropout = module.attention_dropout.p if module.training else 0.0
    out = _attend(module, encoding, positions, q, k, v, boolean_mask(attention_mask), module.inv_norm_factor, dropout)
    return module.dense(_heads_out(out)), None


def _sizes(config: Any, num_heads: int, max_positions: int) -> dict:
    return {"num_heads": num_heads, "head_dim": config.hidden_size // num_heads, "d_model": config.hidden_size,
            "max_positions": max_positions}


def _stacks(model: nn.Module, sizes: dict) -> tuple[Stack, ...]:
    """The model's self-attention stacks where its family's record says its layers and their
    attention live (:func:`~posenc.integrations.families.layer_stacks`); the decoder's causal."""
    return tuple(Stack(stack.name, stack.module, stack.layers[0], stack.attentions, stack.name == "decoder", **sizes)
                 for stack in layer_stacks(model))


def _gpt2_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    return _stacks(model, _sizes(config, config.num_attention_heads, config.max_position_embeddings))


def _opt_decoder(model: nn.Module) -> nn.Module:
    """The module holding ``embed_positions`` and the layers, where the family's record says the
    layers live (OPT's ``model.decoder``, BioGPT's ``biogpt``)."""
    return layer_stacks(model)[0].module


def _opt_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    return _stacks(model, _sizes(config, config.num_attention_heads, config.max_position_embeddings))


def _bloom_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    # BLOOM has no length limit of its own (ALiBi): a learned or FIRE table gets 2048 positions
    max_positions = getattr(config, "seq_length", None) or 2048
    return _stacks(model, _sizes(config, _base(model).num_heads, max_positions))


def _mpt_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    return _stacks(model, _sizes(config, config.n_heads, config.max_seq_len))


def _falcon_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    return _stacks(model, _sizes(config, config.num_attention_heads, config.max_position_embeddings))


def _t5_stacks(model: nn.Module) -> tuple[Stack, ...]:
    config = model.config
    return _stacks(model, {"num_heads": config.num_heads, "head_dim": config.d_kv, "d_model": config.d_model,
                           "max_positions": getattr(config, "n_positions", None) or 512})


def _t5_interface(model: nn.Module) -> list[nn.Module]:
    modules = []
    for stack in (model.encoder, model.decoder):
        for block in stack.block:
            modules += [layer.SelfAttention if hasattr(layer, "SelfAttention") else layer.EncDecAttention
                        for layer in block.layer if hasattr(layer, "SelfAttention") or hasattr(layer, "EncDecAttention")]
    return modules


def _gpt2_interface(model: nn.Module) -> list[nn.Module]:
    return [module for block in _base(model).h for module in (block.attn, getattr(block, "crossattention", None))
            if module is not None]


#: adapter name -> :class:`Adapter`: the code that serves the families whose positions do not go
#: through a ``rotary_emb`` module, each with its plan adapter and its self-attention stacks. A
#: family names its adapter in its record (:attr:`posenc.hf_config.families.Family.adapter`;
#: mT5 names T5's); :func:`adapter_of` looks a model's up.
ADAPTERS: dict[str, Adapter] = {
    "gpt2": Adapter(_adapt_gpt2, _gpt2_stacks, table=lambda model: (_base(model), "wpe"), interface=_gpt2_interface),
    "opt": Adapter(_adapt_opt, _opt_stacks, table=lambda model: (_opt_decoder(model), "embed_positions"),
                   interface=lambda model: [layer.self_attn for layer in _opt_decoder(model).layers]),
    "bloom": Adapter(_adapt_bloom, _bloom_stacks, attention=_bloom_attention),
    "mpt": Adapter(_adapt_mpt, _mpt_stacks, attention=_mpt_attention),
    "t5": Adapter(_adapt_t5, _t5_stacks, interface=_t5_interface),
    "falcon": Adapter(_adapt_falcon, _falcon_stacks, attention=_falcon_attention),
}


def adapter_of(model: nn.Module) -> Adapter | None:
    """The :class:`Adapter` that the record of ``model``'s family names (its config's
    ``model_type``), or None: the family's attention goes through ``AttentionInterface``."""
    family = FAMILIES.get(getattr(getattr(model, "config", None), "model_type", None))
    return None if family is None or family.adapter is None else ADAPTERS[family.adapter]


def apply_plan(model: nn.Module, plan: PositionPlan) -> nn.Module:
    """Make ``model`` (a transformers model of a family whose record names an adapter) compute its
    positions with ``plan``'s posenc encodings, in place; returns it.

    The plan's encodings take the model's learned position tables as their own parameters
    (shared, not copied). Positions are the model's (``position_ids``, its attention mask).
    The plan is checked whole before the model changes; a plan applied again replaces the
    last one (:func:`restore`), it never stacks on it.

    Raises:
        InvalidType: ``plan`` is not a PositionPlan.
        InvalidArgument: a family without an adapter (the message lists those with one), a
            plan whose encodings do not fit the model (head count, table shape, bucket
            settings, naming both). On an error the model is left as it was.
    """
    if not isinstance(plan, PositionPlan):
        raise InvalidType(f"plan must be a PositionPlan, got {type(plan).__name__}")
    adapter = adapter_of(model)
    if adapter is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise InvalidArgument(f"model: no adapter for model_type {model_type!r}; adapters: "
                              f"{sorted(name for name, family in FAMILIES.items() if family.adapter is not None)}")
    adapter(model, plan)
    return model
