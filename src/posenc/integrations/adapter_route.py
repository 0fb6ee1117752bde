"""use_encoding for the adapter families (GPT-2, OPT, BLOOM, MPT, Falcon, T5: their positions
are computed outside transformers' ``AttentionInterface``; :mod:`posenc.integrations.adapters`).

A PositionPlan of the family's own kind goes to its plan adapter; an encoding or a name replaces
the family's positions on the self-attention layers named, which then run posenc's attention.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from posenc.encodings import Hook, PositionalEncoding, create_for_model
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config import position_plan
from posenc.integrations import adapters
from posenc.integrations.attention_function import (
    ATTN_IMPLEMENTATION,
    ENCODING_ATTR,
    FALLBACK_ATTR,
    POSITIONS_ATTR,
    key_positions,
    register_with_transformers,
    transformers_attention_function,
)
from posenc.integrations.record import keep_plan, plan_record, with_name
from posenc.plan import PositionPlan


def prepare_adapter(model: nn.Module, adapter: adapters.Adapter, plan_or_encoding: Any, layers: Sequence[int] | None,
                     kwargs: dict) -> Callable[[], None]:
    """Check everything for an adapter family without changing the model; returns the function
    that applies it. A PositionPlan goes to the family's plan adapter (its own kinds of
    encoding, every layer); an encoding or a name replaces the family's positions on the
    self-attention layers named (all: also its absolute position table)."""
    model_type = model.config.model_type
    if isinstance(plan_or_encoding, PositionPlan):
        takes = ("a PositionPlan of the family's own kind (position_plan(model.config): learned tables for gpt2 and "
                 "opt, ALiBi for bloom and mpt, RoPE or ALiBi for falcon (as its config), T5 buckets per stack for t5)")
        if layers is not None:
            raise InvalidArgument(f"layers: the {model_type} adapter applies a plan to every layer at once; it takes "
                                  f"{takes}, or an encoding or a name with layers=")
        if kwargs:
            raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got a "
                              "PositionPlan")
        apply_plan = adapter.plan(model, plan_or_encoding)
        plan, record = plan_or_encoding, plan_record(None, None, plan_or_encoding)

        def apply() -> None:
            adapters.restore(model)
            apply_plan()
            keep_plan(model, plan, record)

        return apply
    return _prepare_adapter_encoding(model, adapter, plan_or_encoding, layers, kwargs)


def _stack_encodings(model_type: str, stacks: tuple, given: Any, kwargs: dict) -> list[PositionalEncoding]:
    """One encoding per stack: ``given``, or built from its name for the stack's sizes and
    direction (T5's encoder: bidirectional)."""
    if isinstance(given, PositionalEncoding):
        if kwargs:
            raise InvalidType(f"keyword arguments {sorted(kwargs)} are for building an encoding from a name; got "
                              f"{type(given).__name__}")
        return [given] * len(stacks)
    if not isinstance(given, str):
        raise InvalidType("plan_or_encoding must be a posenc PositionPlan, a posenc.PositionalEncoding or a registered "
                          f"name, got {type(given).__name__}")
    encodings = []
    for stack in stacks:
        try:
            encodings.append(create_for_model(given, d_model=stack.d_model, num_heads=stack.num_heads,
                                              head_dim=stack.head_dim, max_positions=stack.max_positions,
                                              causal=stack.causal, **kwargs))
        except (InvalidArgument, InvalidType) as err:
            raise type(err)(f"{model_type} {stack.name}: encoding {given!r}: {err}") from err
    return encodings


def _prepare_adapter_encoding(model: nn.Module, adapter: adapters.Adapter, given: Any, layers: Sequence[int] | None,
                              kwargs: dict) -> Callable[[], None]:
    """:func:`prepare_adapter` for an encoding or a name: every check, then the function that
    swaps the table, hooks the stacks and hands the layers named to posenc's attention."""
    model_type = model.config.model_type
    stacks = adapter.stacks(model)
    encodings = _stack_encodings(model_type, stacks, given, kwargs)
    name = given if isinstance(given, str) else type(given).__name__
    embeds = Hook.EMBED in encodings[0].hooks
    for stack, encoding in zip(stacks, encodings):
        _check_adapter_encoding(model_type, stack, encoding, name)
    offsets = [sum(len(s.attentions) for s in stacks[:i]) for i in range(len(stacks))]
    chosen = set(chosen_layers(layers, sum(len(s.attentions) for s in stacks)))
    if layers is not None and embeds:
        raise InvalidArgument(f"layers: {name} is an embedding encoding (embed hook), added before the first layer of "
                              f"{model_type}, not per layer; use it without layers=")
    # (stack, local index, attention module, the layer's encoding) of every layer that changes
    changed = [(stack, i, module, encoding.for_layer(i))
               for stack, encoding, offset in zip(stacks, encodings, offsets)
               for i, module in enumerate(stack.attentions) if offset + i in chosen]
    plan = _adapter_plan(model, stacks, encodings, changed, replace_table=layers is None)
    distinct = {id(e): e for e in [*encodings, *(c[3] for c in changed)]}
    registered = encodings[0] if len(distinct) == 1 else nn.ModuleList(distinct.values())
    single = encodings[0] if len({id(e) for e in encodings}) == 1 else None
    record = plan_record(single, layers, plan)
    if single is None:  # a name built once per stack (T5): from_pretrained builds it again by name
        record = with_name(record, given, kwargs)
    # the implementation the model had before any use_encoding (restored with the rest)
    original = model.__dict__.get(ORIGINAL_ATTN, model.config._attn_implementation)
    if adapter.attention is None:
        try:  # one that cannot serve the layers keeping the model's attention: refused now
            transformers_attention_function(original)
        except InvalidArgument as err:
            raise InvalidArgument(f"{model_type}: {name}: {err}") from err

    def apply() -> None:
        adapters.restore(model)
        base = model.base_model
        parameter = next(model.parameters(), None)
        if parameter is not None:
            registered.to(parameter.device)
        adapters.replace_attribute(model, base, "posenc_encoding", registered, submodule=True)
        positions = {stack.name: {} for stack in stacks}
        for stack in stacks:
            adapters.hook(model, stack.base.register_forward_pre_hook(
                _stack_positions_hook(positions[stack.name], [c[2] for c in changed if c[0] is stack]),
                with_kwargs=True))
        if adapter.table is not None and layers is None:
            owner, attribute = adapter.table(model)
            original_table = getattr(owner, attribute)
            table = adapters.EmbeddingPositions(encodings[0], stacks[0].d_model, original_table.weight) if embeds \
                else adapters.ZeroPositions()
            table.__dict__["original"] = original_table  # what the plan adapters check against
            adapters.replace_attribute(model, owner, attribute, table)
        elif embeds:  # no table: added to the first layer's input
            for stack, encoding in zip(stacks, encodings):
                adapters.hook(model, stack.first_block.register_forward_pre_hook(
                    _stack_embed_hook(encoding, positions[stack.name]), with_kwargs=True))
        adapters.on_undo(model, lambda: [c[2].__dict__.pop(POSITIONS_ATTR, None) for c in changed])
        for stack, _, module, encoding in changed:
            if adapter.attention is not None:
                forward = functools.partial(adapter.attention, module, encoding, positions[stack.name])
                adapters.replace_attribute(model, module, "forward", forward)
            else:
                adapters.replace_attribute(model, module, ENCODING_ATTR, encoding)
        if adapter.attention is None:
            register_with_transformers()
            for module in adapter.interface(model):
                adapters.replace_attribute(model, module, FALLBACK_ATTR, original)
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
            adapters.on_undo(model, lambda: model.set_attn_implementation(original))
            adapters.replace_attribute(model, model, ORIGINAL_ATTN, original)
        keep_plan(model, plan, record)

    return apply


#: Where an adapter family keeps the attention implementation it had before use_encoding.
ORIGINAL_ATTN = "_posenc_original_attn"


def _check_adapter_encoding(model_type: str, stack: adapters.Stack, encoding: PositionalEncoding, name: str) -> None:
    """Refuse, naming the family and the encoding, what posenc's attention cannot run in that stack."""
    where = f"{model_type} {stack.name}"
    if Hook.GATE in encoding.hooks:
        raise InvalidArgument(f"{where}: {name} has the gate hook (values of each layer's hidden state, kept per key), "
                              "which the model's cache cannot carry; use posenc.lab.model.TransformerLM")
    if getattr(encoding, "position_axes", 1) != 1:
        raise InvalidArgument(f"{where}: {name} reads {encoding.position_axes} position axes; {model_type} has one "
                              "position per token")
    heads = getattr(encoding, "num_heads", None)
    if isinstance(heads, int) and heads != stack.num_heads:
        raise InvalidArgument(f"{where}: {name} was built for num_heads={heads}, the model's attention has "
                              f"{stack.num_heads} query heads")
    head_dim = getattr(encoding, "head_dim", None)
    if Hook.EMBED not in encoding.hooks and isinstance(head_dim, int) and head_dim != stack.head_dim:
        raise InvalidArgument(f"{where}: {name} has head_dim={head_dim}, the model's heads {stack.head_dim}")
    d_model = getattr(encoding, "d_model", None)
    if Hook.EMBED in encoding.hooks and isinstance(d_model, int) and d_model != stack.d_model:
        raise InvalidArgument(f"{where}: {name} has d_model={d_model}, the model's hidden size {stack.d_model}")


def _adapter_plan(model: nn.Module, stacks: tuple, encodings: list, changed: list, replace_table: bool) -> PositionPlan:
    """The plan an encoding applied to an adapter family amounts to: the family's own plan
    (``position_plan(config)``) with the changed layers' encodings, the absolute table replaced
    (by the embedding encoding, or nothing) when every layer changed."""
    own = position_plan(model.config)
    by_stack = {"decoder": own, "encoder": own.encoder}
    plans = {}
    for stack, encoding in zip(stacks, encodings):
        stack_plan = by_stack[stack.name]
        new = {i: e for s, i, _, e in changed if s is stack}
        layers = tuple(dataclasses.replace(layer, encoding=new[i] if Hook.EMBED not in new[i].hooks else None)
                       if i in new else layer for i, layer in enumerate(stack_plan))
        embedding = stack_plan.embedding
        if replace_table:
            embedding = encoding if Hook.EMBED in encoding.hooks else None
        plans[stack.name] = PositionPlan(layers, embedding, stack_plan.model_type, None, stack_plan.notes)
    decoder = plans["decoder"]
    return dataclasses.replace(decoder, encoder=plans.get("encoder"))


def _stack_positions_hook(positions: dict, modules: list[nn.Module]):
    """A stack's forward pre-hook: the call's positions, (B|1, Tq) queries and (B|1, Tk) keys:
    the call's ``position_ids`` where given (negative ones, OPT's padding, read at 0; the keys
    the consecutive positions ending at the queries, as for the Llama-shaped families), else
    from its 2-d attention mask over the cached and new tokens (cumsum(mask) - 1, padding at
    0), else 0 .. Tk-1; kept in ``positions`` and on the modules of posenc's
    attention. A StaticCache is refused here, at the first call."""
    def read_positions(module, args, kwargs):
        tokens = args[0] if args else kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs["inputs_embeds"][..., 0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        refuse_static_layers(cache)
        cache = getattr(cache, "self_attention_cache", cache)
        past = cache.get_seq_length() if cache is not None else 0
        length = past + tokens.shape[1]
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 2 and isinstance(args[2], Tensor):
            mask = args[2]
        given = kwargs.get("position_ids")
        if isinstance(given, Tensor) and given.dim() == 2:  # the caller's (GPT-2, OPT, Falcon take them)
            queries = given.clamp(min=0)
            positions["q"], positions["k"] = queries, key_positions(queries, length)
        else:
            if mask is not None and mask.dim() == 2 and mask.shape[-1] == length:
                keys = (mask.long().cumsum(dim=-1) - 1).clamp(min=0)
            else:
                keys = torch.arange(length, device=tokens.device).unsqueeze(0)
            positions["k"], positions["q"] = keys, keys[:, past:]
        for attention_module in modules:
            attention_module.__dict__[POSITIONS_ATTR] = positions["q"]

    return read_positions


def _stack_embed_hook(encoding: PositionalEncoding, positions: dict):
    """The first layer's forward pre-hook adding an embedding encoding's rows at the stack's positions."""
    def add_position_embedding(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        hidden = encoding.embed(hidden, positions["q"].expand(hidden.shape[0], -1))
        if args:
            return (hidden, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": hidden}

    return add_position_embedding


def refuse_static_layers(cache: Any) -> None:
    if cache is None:
        return
    from transformers.cache_utils import StaticLayer

    for part in (cache, getattr(cache, "self_attention_cache", None)):
        if any(isinstance(layer, StaticLayer) for layer in getattr(part, "layers", None) or []):
            raise InvalidArgument(
                f"cache: a StaticCache ({type(cache).__name__}) keeps keys in fixed slots, which posenc's attention "
                "cannot position; generate with the default DynamicCache (no cache_implementation='static')")


def chosen_layers(layers: Sequence[int] | None, count: int) -> list[int]:
    if layers is None:
        return list(range(count))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise InvalidType(f"layers must be a sequence of layer indices, got {type(layers).__name__}")
    chosen = []
    for index in layers:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InvalidArgument(f"layers: {index!r} is not a layer index in [0, {count})")
        if index not in chosen:
            chosen.append(index)
    return sorted(chosen)
