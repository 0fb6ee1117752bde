"""Apply a :class:`~posenc.hf_config.plan.PositionPlan` to the transformers families whose
positions do not go through ``AttentionInterface`` and a ``rotary_emb`` module: one small
adapter per family, kept in :data:`ADAPTERS` (adding a family is one entry).

Each adapter hands the model's position computation to the plan's posenc encodings, the
model's own learned parameters shared with them (GPT-2's ``wpe``, OPT's ``embed_positions``
and T5's ``relative_attention_bias`` become the encodings' tables: one set of weights, trained
and saved as before), and leaves everything else to the model:

- ``gpt2``: ``wpe`` is replaced by a module that returns the plan's
  :class:`~posenc.LearnedAbsolute` rows at the model's ``position_ids``.
- ``opt``: ``embed_positions`` likewise, positions from the attention mask as OPT computes
  them (``cumsum(mask) * mask - 1``, padding -1), read through the table's offset of 2.
- ``bloom``: ``build_alibi_tensor`` returns posenc's ALiBi bias of each key as seen from
  position 0 (m * j, BLOOM's key-only form; the softmax ignores the per-query constant), at
  the positions of the attention mask; a model called without a mask is given one of ones
  (BLOOM otherwise builds its slopes itself).
- ``mpt``: ``build_mpt_alibi_tensor`` returns posenc's bias of every key as seen from the last
  position of the ``max_seq_len`` table, MPT's form.
- ``t5`` / ``mt5``: the first self-attention layer of each stack computes its bias with the
  stack's :class:`~posenc.T5RelativeBias` (encoder: the plan's :attr:`encoder`).
- ``falcon`` with RoPE: ``rotary_emb`` becomes posenc's
  :class:`~posenc.integrations.transformers.RotaryEmbedding`.
- ``falcon`` with ALiBi: transformers builds the bias in a module-level function, so a
  forward pre-hook on each decoder layer replaces the ``alibi`` keyword and the alibi folded
  into the 4-d attention mask that FalconModel passes with posenc's bias, at the positions of
  the attention mask (``cumsum(mask) - 1``, padding 0).

Guarantee: :func:`apply_plan` ``(model, plan)`` with the model's own plan
(``posenc.hf_config.families_other``) reproduces the model's logits, tested on tiny models.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc.encodings.alibi import ALiBi
from posenc.encodings.learned import LearnedAbsolute
from posenc.encodings.rope.rotary import RoPE
from posenc.encodings.t5 import T5RelativeBias
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config.plan import PositionPlan

__all__ = ["ADAPTERS", "apply_plan", "PositionTable", "OPTPositionTable", "RotaryEmbedding"]


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


def _share_table(table: LearnedAbsolute, weight: nn.Parameter, family: str) -> None:
    if tuple(table.weight.shape) != tuple(weight.shape):
        raise InvalidArgument(f"plan: its learned table is {tuple(table.weight.shape)}, the {family} model's "
                              f"{tuple(weight.shape)}")
    table.weight = weight


def _adapt_gpt2(model: nn.Module, plan: PositionPlan) -> None:
    base = model.transformer if hasattr(model, "transformer") else model
    if not isinstance(plan.embedding, LearnedAbsolute) or plan.embedding.offset:
        raise InvalidArgument("plan: the gpt2 adapter needs a learned table without offset as the plan's embedding")
    _share_table(plan.embedding, base.wpe.weight, "gpt2")
    base.wpe = PositionTable(plan.embedding)


def _adapt_opt(model: nn.Module, plan: PositionPlan) -> None:
    decoder = model.model.decoder if hasattr(model, "model") else model.decoder
    if not isinstance(plan.embedding, LearnedAbsolute) or plan.embedding.offset != decoder.embed_positions.offset:
        raise InvalidArgument("plan: the opt adapter needs a learned table with OPT's offset 2 as the plan's embedding")
    _share_table(plan.embedding, decoder.embed_positions.weight, "opt")
    decoder.embed_positions = OPTPositionTable(plan.embedding)


def _adapt_bloom(model: nn.Module, plan: PositionPlan) -> None:
    base = model.transformer if hasattr(model, "transformer") else model
    encoding = _only(plan, ALiBi, "bloom")
    _check_heads(encoding, base.num_heads, "bloom")

    def build_alibi_tensor(attention_mask: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
        _check_heads(encoding, num_heads, "bloom")
        positions = (attention_mask.cumsum(dim=-1) - 1) * attention_mask
        origin = positions.new_zeros((positions.shape[0], 1))
        bias = encoding.score_bias(origin, positions)  # (B, H, 1, T): m * j
        return bias.reshape(-1, 1, positions.shape[-1]).to(dtype)

    def with_mask(module, args, kwargs):
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

    base.build_alibi_tensor = build_alibi_tensor
    base.register_forward_pre_hook(with_mask, with_kwargs=True)


def _adapt_mpt(model: nn.Module, plan: PositionPlan) -> None:
    base = model.transformer if hasattr(model, "transformer") else model
    encoding = _only(plan, ALiBi, "mpt")
    _check_heads(encoding, base.num_heads, "mpt")

    def build_mpt_alibi_tensor(num_heads: int, sequence_length: int, alibi_bias_max: int = 8, device=None) -> Tensor:
        _check_heads(encoding, num_heads, "mpt")
        keys = torch.arange(sequence_length, device=device)
        return encoding.score_bias(keys[-1:], keys)  # (H, 1, L): -m (L - 1 - j)

    base.build_mpt_alibi_tensor = build_mpt_alibi_tensor


def _adapt_t5(model: nn.Module, plan: PositionPlan) -> None:
    if plan.encoder is None:
        raise InvalidArgument("plan: the t5 adapter needs the encoder's plan (PositionPlan.encoder)")
    for stack, stack_plan in ((model.encoder, plan.encoder), (model.decoder, plan)):
        encoding = _only(stack_plan, T5RelativeBias, "t5")
        attention = stack.block[0].layer[0].SelfAttention
        _check_heads(encoding, attention.n_heads, "t5")
        if encoding.bidirectional == attention.is_decoder or encoding.num_buckets != attention.relative_attention_num_buckets \
                or encoding.max_distance != attention.relative_attention_max_distance:
            raise InvalidArgument(f"plan: {encoding!r} is not the buckets of the model's "
                                  f"{'decoder' if attention.is_decoder else 'encoder'}")
        encoding.relative_attention_bias = attention.relative_attention_bias  # one table, the model's

        def compute_bias(query_length, key_length, device=None, past_seen_tokens=0, _encoding=encoding):
            device = _encoding.relative_attention_bias.weight.device if device is None else device
            queries = torch.arange(query_length, device=device) + past_seen_tokens
            return _encoding.score_bias(queries, torch.arange(key_length, device=device)).unsqueeze(0)

        attention.compute_bias = compute_bias


def _adapt_falcon(model: nn.Module, plan: PositionPlan) -> None:
    base = model.transformer if hasattr(model, "transformer") else model
    if base.use_alibi:
        _adapt_falcon_alibi(base, plan)
        return
    encoding = _only(plan, RoPE, "falcon")
    base.rotary_emb = RotaryEmbedding(encoding)


def _adapt_falcon_alibi(base: nn.Module, plan: PositionPlan) -> None:
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
    for handle in base.__dict__.pop("_posenc_alibi_hooks", ()):  # a plan applied again replaces the last
        handle.remove()
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

    handles = [base.register_forward_pre_hook(read_mask, with_kwargs=True)]
    handles += [layer.register_forward_pre_hook(replace_alibi, with_kwargs=True) for layer in base.h]
    base.__dict__["_posenc_alibi_hooks"] = handles


#: model_type -> adapter(model, plan): the families whose positions an adapter hands to posenc.
ADAPTERS: dict[str, Callable[[nn.Module, PositionPlan], None]] = {
    "gpt2": _adapt_gpt2,
    "opt": _adapt_opt,
    "bloom": _adapt_bloom,
    "mpt": _adapt_mpt,
    "t5": _adapt_t5,
    "mt5": _adapt_t5,
    "falcon": _adapt_falcon,
}


def apply_plan(model: nn.Module, plan: PositionPlan) -> nn.Module:
    """Make ``model`` (a transformers model of a family in :data:`ADAPTERS`) compute its
    positions with ``plan``'s posenc encodings, in place; returns it.

    The plan's encodings take the model's learned position tables as their own parameters
    (shared, not copied). Positions are the model's (``position_ids``, its attention mask).

    Raises:
        InvalidType: ``plan`` is not a PositionPlan.
        InvalidArgument: a family without an adapter (the message lists those with one), a
            plan whose encodings do not fit the model (head count, table shape, bucket
            settings, naming both).
    """
    if not isinstance(plan, PositionPlan):
        raise InvalidType(f"plan must be a PositionPlan, got {type(plan).__name__}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ADAPTERS:
        raise InvalidArgument(f"model: no adapter for model_type {model_type!r}; adapters: {sorted(ADAPTERS)}")
    ADAPTERS[model_type](model, plan)
    return model
