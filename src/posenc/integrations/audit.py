"""``posenc audit``: check the position plan posenc reads from a Hugging Face config against the
model transformers builds from that config, layer by layer.

:func:`audit` reads the config as :func:`~posenc.hf_config.position_plan` does (an alias or an
unknown ``model_type`` through its ``architectures`` class, a wrapper through its text model)
and builds the family as a tiny random model with the same positional keys (head width as the
plan read it, rotary keys, rope dicts, layer pattern keys, sliding windows, chunk sizes,
position limits kept; hidden size, heads (2 query, 1 key/value; as many key/value heads as
query heads for multi-head latent attention), intermediate sizes, vocabulary, experts, LoRA
ranks and Gemma 4's shared-cache layers shrunk; as many layers as it takes to hold every kind
of layer of the plan and at least :data:`MIN_LAYERS`, per-layer lists and dicts such as
``layer_types`` / ``per_layer_config`` trimmed to that count), every parameter drawn with std
0.2 (so that a wrong position moves the outputs visibly), float32. It runs the model as built
(its own attention and positions) on random tokens, then applies the plan to the same model
(:func:`posenc.integrations.transformers.use_encoding`, or
:func:`posenc.integrations.adapters.apply_plan` for GPT-2, OPT, BLOOM, MPT, Falcon and T5) and
runs it again on the same tokens, capturing each decoder layer's attention module output with
forward hooks both times. The report holds, per group of layers (grouped as
:meth:`PositionPlan.describe` groups them), the plan, the max absolute difference and its
tolerance, which holds the model's own float32 noise (its two attention implementations, and
its float32 angles: :data:`ANGLE_ROUNDING`). What the table route leaves to the model, each
layer's span and whether it rotates at all, is measured on the model as built (the mask
transformers hands each layer; its output with identity rotary tables) and compared with the
plan: a row whose layers disagree is a mismatch whatever the outputs say. Whatever
transformers raises on the config (building the config or the model, a forward pass) becomes
an :class:`~posenc.errors.InvalidArgument` quoting it.

The length exercises the spans where cheap: T = min(2 x the widest sliding window or chunk (at
least the span + 8), 1024), 32 for a model without spans, never past the model's position
limit (``max_position_embeddings``, GPT-2's ``n_positions``, MPT's ``max_seq_len``).

transformers is imported inside the functions (posenc does not need it otherwise).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.errors import InvalidArgument, PosencError
from posenc.plan import LayerPlan, PositionPlan, layer_ranges

__all__ = ["ANGLE_ROUNDING", "MIN_LAYERS", "TOLERANCE", "AuditReport", "AuditRow", "audit", "read_config", "shrink_config"]

#: A layer matches when its attention outputs differ by at most this times max(1, max |output|)
#: (float32), or by at most twice the model's own eager / sdpa difference.
TOLERANCE = 1e-5
#: The sizes of the audit model.
HEADS, KV_HEADS, VOCAB, INTERMEDIATE, EXPERTS = 2, 1, 128, 32, 2
#: The longest input the audit runs by default.
MAX_LENGTH = 1024
#: The fewest layers of the audit model (where the config has as many): every layer pattern of
#: the families posenc reads repeats within 6 layers (Gemma 3's 5 sliding : 1 full, the 3:1 of
#: SmolLM3's NoPE layers, OLMo 3, Cohere 2, Llama 4).
MIN_LAYERS = 6
#: The relative change of the model's own rotary frequencies that measures its float32 angle
#: noise: transformers rounds inv_freq to float32 (half an ulp, 2^-24 relative) and computes
#: ``position * inv_freq`` in float32 (another 2^-24 of the angle); posenc computes the angles in
#: float64. Moving every inv_freq by 2^-23 moves every angle by the most those two roundings can.
ANGLE_ROUNDING = 2.0 ** -23

# Shrinking: key -> new value (or a function of the original config and the head width).
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "n_embed", "d_model")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_SMALL = {
    **dict.fromkeys(("intermediate_size", "intermediate_size_mlp", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "ffn_dim", "d_ff", "ffn_hidden_size", "n_inner"), INTERMEDIATE),
    **dict.fromkeys(_EXPERT_KEYS, EXPERTS),
    # one expert group, of which one is picked (n_group <= the experts), 1 expert per token
    # (Bailing's and Kimi Linear's spellings num_expert_group, num_experts_per_token)
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "top_k_experts", "n_shared_experts", "n_group",
                     "num_expert_group", "topk_group"), 1),
    # Gemma 3n / 4's layers that reuse an earlier layer's keys and values: none in the audit model
    # (a shared layer reads keys rotated with the same tables, and the shrunk model may not hold
    # the layer it would share from)
    "num_kv_shared_layers": 0,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "q_lora_rank": 16, "kv_lora_rank": 16, "vocab_size": VOCAB,
    "decoder_start_token_id": 0, "sep_token_id": 2,
}
#: Sizes shrunk only where positive: 0 turns the feature off (Gemma 4's per-layer inputs; its
#: released 26B / 31B configs say 0), and a shrunk 16 would build a model the config has not.
_SMALL_WHERE_ON = {"vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16}
#: The Mamba-2 mixer of the hybrid families (Bamba, Granite 4.0 / GraniteMoeHybrid, Falcon-H1):
#: its heads and state, shrunk together; their config classes require mamba_n_heads x mamba_d_head
#: == the mixer's width (mamba_d_ssm, else mamba_expand x hidden_size) and mamba_n_groups | heads.
MAMBA_HEADS, MAMBA_STATE = 2, 16
#: token ids inside the small vocabulary (set even where the config leaves them to the class's defaults).
_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DROPPED = ("torch_dtype", "dtype", "quantization_config", "auto_map", "_name_or_path", "transformers_version",
            "architectures", "attn_implementation", "_attn_implementation")
#: The families whose attention splits the key/value heads in two (DiffLlama's differential
#: attention chunks its values along them, and its config class requires an even count): as
#: many key/value heads as query heads.
_EVEN_KV_HEADS = frozenset({"diffllama"})
#: lists of layer indices (not one entry per layer): kept below the new layer count.
_INDEX_LISTS = ("moe_layers", "mlp_only_layers")


@dataclass(frozen=True)
class AuditRow:
    """One group of layers with the same plan: ``stack`` ("decoder", or "encoder" for T5),
    ``layers`` (indices in the audit model), ``plan`` (:meth:`LayerPlan.describe`) and
    ``max_diff``, the largest |own - posenc| over the group's attention outputs; ``noise``,
    the largest |own - the model's other attention implementation (eager / sdpa)| on the same
    weights and input (0 where the family has one implementation); ``scale``, the largest
    |own| (std-0.2 weights make outputs of tens with wide heads); ``tolerance``, the larger of
    :data:`TOLERANCE` x max(1, scale) and twice the noise; ``disagreement``: what the model's
    own layers do that the plan says otherwise (empty when they agree): a span (the model's
    attention mask) or whether the layer rotates at all (NoPE), which posenc's tables route
    leaves to the model, so that the outputs alone could not show it."""

    stack: str
    layers: tuple[int, ...]
    plan: str
    max_diff: float
    noise: float = 0.0
    scale: float = 1.0
    disagreement: str = ""

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE * max(1.0, self.scale), 2 * self.noise)

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tolerance and not self.disagreement


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found: the family, the plan of the config as given (``plan``, all its
    layers), the audit model's sizes, the input length and one :class:`AuditRow` per group."""

    model_type: str
    plan: PositionPlan
    num_layers: int
    audit_layers: int
    sizes: str
    length: int
    rows: tuple[AuditRow, ...]
    method: str

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)


def read_config(source: str | os.PathLike) -> tuple[dict, str]:
    """A config.json as a dict and where it came from: ``source`` is a file, a folder holding
    ``config.json``, or a model id already in the local Hugging Face cache (looked up with
    ``huggingface_hub.try_to_load_from_cache``; nothing is downloaded, no network is used).

    Raises:
        InvalidArgument: none of those, or a file that is not a JSON object.
    """
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise InvalidArgument(f"CONFIG: the folder {source} holds no config.json")
    elif not path.is_file():
        cached = _cached_config(str(source))
        if cached is None:
            raise InvalidArgument(f"CONFIG: {source} is neither a file, a folder with a config.json, nor a model in "
                                  "the local Hugging Face cache (posenc audit never downloads)")
        path = Path(cached)
    try:
        config = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidArgument(f"CONFIG: {path} is not a readable JSON file ({err})") from None
    except RecursionError:  # json.loads on JSON nested ~100,000 deep (issue 22)
        raise InvalidArgument(f"CONFIG: {path} is nested too deep to be a model config (the JSON parser's "
                              "recursion limit)") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"CONFIG: {path} must hold a JSON object (a model config.json), got {type(config).__name__}")
    return config, str(path)


def _cached_config(repo_id: str) -> str | None:
    """The cached config.json of a model id, or None (never a download)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an invalid repo id (HFValidationError), an unreadable cache
        return None
    return found if isinstance(found, str) else None  # None, or _CACHED_NO_EXIST


def _text_config(config: Mapping[str, Any]) -> dict:
    """The decoder's config: a multimodal wrapper's ``text_config`` under its family's name."""
    from posenc.hf_config.families import FAMILIES

    family = FAMILIES.get(config.get("model_type"))
    if family is None or family.text_config is None:
        return dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        return {**dict(text), "model_type": family.text_config}
    return {**config, "model_type": family.text_config}


def _seq2seq(model_type: str) -> bool:
    """Whether the family's record names an encoder stack (T5): a sequence-to-sequence model."""
    from posenc.hf_config.families import FAMILIES

    family = FAMILIES.get(model_type)
    return family is not None and "encoder" in family.stacks


def _quiet_plan(config: Mapping[str, Any]) -> PositionPlan:
    from posenc.hf_config import position_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notes are in the plan
        return position_plan(dict(config))


def _layers_needed(plan: PositionPlan) -> int:
    """The fewest leading layers that hold every kind of layer of the plan, and at least
    :data:`MIN_LAYERS`: a plan that misreads a layer's kind (a NoPE layer read as RoPE) would
    otherwise shrink the model to the layers it reads and never meet the layer it misreads."""
    first: dict[tuple, int] = {}
    for index, layer in enumerate(plan):
        first.setdefault((layer.describe(), layer.layer_type), index)
    return min(len(plan), max(MIN_LAYERS, max(first.values()) + 1))


def _head_dim(cfg: Mapping[str, Any]) -> int:
    for key in ("head_dim", "d_kv"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    hidden = next((cfg[k] for k in _HIDDEN_KEYS if isinstance(cfg.get(k), int)), None)
    heads = next((cfg[k] for k in _HEAD_KEYS if isinstance(cfg.get(k), int)), None)
    if not hidden or not heads:
        raise InvalidArgument(f"config ({cfg.get('model_type')}): cannot read its head width (no head_dim, "
                              f"hidden size or head count)")
    return hidden // heads


def shrink_config(config: Mapping[str, Any], num_layers: int, *, head_dim: int | None = None) -> dict:
    """``config`` (a decoder's config.json dict) made tiny with its positional keys kept: 2
    query heads and 1 key/value head of the same head width (2 where the attention splits them in
    two: :data:`_EVEN_KV_HEADS`), hidden size 2 x head_dim (T5:
    ``d_kv`` kept, ``d_model`` 64), intermediate sizes 32, vocabulary 128, 2 experts in one group with 1 per
    token (also where a routing config leaves them None), a Mamba-2 mixer of 2 heads and state
    16 (its widths kept consistent as its config class validates them), ``num_layers`` layers (per-layer lists cut to that length, lists of layer indices
    kept below it); dtype and quantization keys dropped. ``head_dim``: the head width as
    :func:`~posenc.hf_config.position_plan` read it (the family's default where the config
    has none: Gemma 3's 256), written into the config; default: the config's ``head_dim``, or
    hidden size // heads."""
    cfg = {k: v for k, v in config.items() if k not in _DROPPED}
    if head_dim is not None and "d_kv" not in cfg and not _mla(cfg) and _head_dim_or_none(cfg) != head_dim:
        cfg["head_dim"] = head_dim  # the family's default (Gemma 3's 256), which hidden // heads is not
    head_dim = _head_dim(cfg)
    layers = next((cfg[k] for k in _LAYER_KEYS if isinstance(cfg.get(k), int)), None)
    for key, value in _SMALL.items():
        if key in cfg and cfg[key] is not None:
            cfg[key] = value
    for key, value in _SMALL_WHERE_ON.items():
        if isinstance(cfg.get(key), int) and cfg[key] > 0:
            cfg[key] = value
    _route_one_expert(cfg)
    cfg.update(_TOKENS)
    for key in _HEAD_KEYS:
        if isinstance(cfg.get(key), int):
            cfg[key] = HEADS
    for key in _KV_KEYS:
        if isinstance(cfg.get(key), int):
            # multi-head latent attention expands its latent to one key/value head per query head
            cfg[key] = HEADS if _mla(cfg) or cfg.get("model_type") in _EVEN_KV_HEADS else KV_HEADS
    for key in _HIDDEN_KEYS:
        if isinstance(cfg.get(key), int):
            cfg[key] = 64 if "d_kv" in cfg else HEADS * head_dim
    if "word_embed_proj_dim" in cfg:  # OPT
        cfg["word_embed_proj_dim"] = cfg.get("hidden_size", HEADS * head_dim)
    if "head_dim" in cfg and cfg["head_dim"] is None:
        cfg.pop("head_dim")
    _shrink_mamba(cfg)
    for key in _LAYER_KEYS:
        if isinstance(cfg.get(key), int):
            cfg[key] = num_layers
    for key, value in list(cfg.items()):
        if isinstance(value, list) and layers is not None and len(value) == layers and key not in _INDEX_LISTS:
            cfg[key] = value[:num_layers]
        elif key in _INDEX_LISTS and isinstance(value, list):
            cfg[key] = [i for i in value if isinstance(i, int) and i < num_layers]
        elif isinstance(value, dict) and value and all(_layer_index(k) is not None for k in value):
            # a dict by layer index (Gemma 4's per_layer_config: {"05": {...}}): the layers kept
            cfg[key] = {k: v for k, v in value.items() if _layer_index(k) < num_layers}
    return cfg


def _route_one_expert(cfg: dict) -> None:
    """1 expert per token wherever the shrunk config routes to experts, also where the config
    leaves the count to None (DeepSeek-V2's default: its router's ``topk(k=None)`` fails); a
    routing config (one naming ``num_experts_per_tok``) whose expert counts are None gets
    :data:`EXPERTS` routed and 1 shared (dots.llm1's default: transformers builds no experts
    of None)."""
    if "num_experts_per_tok" in cfg:
        for key, value in (*((key, EXPERTS) for key in _EXPERT_KEYS), ("n_shared_experts", 1)):
            if key in cfg and cfg[key] is None:
                cfg[key] = value
    routed = any(isinstance(cfg.get(key), int) and cfg[key] > 0
                 for key in _EXPERT_KEYS)
    if routed and "num_experts_per_tok" in cfg:
        cfg["num_experts_per_tok"] = 1


def _shrink_mamba(cfg: dict) -> None:
    """The Mamba-2 mixer's sizes (:data:`MAMBA_HEADS` heads, state :data:`MAMBA_STATE`, one
    group) made consistent with the shrunk hidden size, as its config class validates them:
    heads x head width == mamba_d_ssm (shrunk to 2 x 16 where set), else mamba_expand x hidden
    size. Nothing positional: the mixer takes no positions."""
    if not isinstance(cfg.get("mamba_n_heads"), int):
        return
    cfg["mamba_n_heads"] = MAMBA_HEADS
    if isinstance(cfg.get("mamba_n_groups"), int):
        cfg["mamba_n_groups"] = 1
    if isinstance(cfg.get("mamba_d_state"), int):
        cfg["mamba_d_state"] = MAMBA_STATE
    if isinstance(cfg.get("mamba_d_ssm"), int):
        cfg["mamba_d_ssm"] = MAMBA_HEADS * 16
        width = cfg["mamba_d_ssm"]
    else:
        hidden = next((cfg[k] for k in _HIDDEN_KEYS if isinstance(cfg.get(k), int)), None)
        width = cfg.get("mamba_expand", 2) * hidden if hidden else None
    if width is not None and isinstance(cfg.get("mamba_d_head"), int):
        cfg["mamba_d_head"] = width // MAMBA_HEADS


def _head_dim_or_none(cfg: Mapping[str, Any]) -> int | None:
    try:
        return _head_dim(cfg)
    except InvalidArgument:
        return None


def _layer_index(key: Any) -> int | None:
    """``key`` as a layer index (an int, or a string of digits), else None."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    return int(key) if isinstance(key, str) and key.isdigit() else None


def _mla(cfg: Mapping[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek): the rotary width is ``qk_rope_head_dim``, not the head width."""
    return "qk_rope_head_dim" in cfg or "kv_lora_rank" in cfg


def _default_length(plan: PositionPlan, cfg: Mapping[str, Any]) -> int:
    windows = [layer.window for stack in (plan, plan.encoder) if stack is not None for layer in stack if layer.window]
    # twice the span: half the queries lose keys to it, so a window read wrong moves them visibly
    length = min(max(2 * max(windows), max(windows) + 8), MAX_LENGTH) if windows else 32
    for key in ("n_positions", "max_seq_len"):  # absolute tables / ALiBi tables with a fixed size
        if isinstance(cfg.get(key), int):
            length = min(length, cfg[key])
    if cfg.get("model_type") in ("opt", "gpt2") and isinstance(cfg.get("max_position_embeddings"), int):
        length = min(length, cfg["max_position_embeddings"])
    return length


def _build(cfg: dict, attn_implementation: str | None = None, auto: str | None = None):
    """The family's transformers model for ``cfg``, float32, every parameter drawn with std 0.2
    (the same weights on every call); ``attn_implementation`` None: transformers' default;
    ``auto``: the Auto class (default: the causal LM, or the sequence-to-sequence LM for T5)."""
    import torch

    import transformers

    model_type = cfg["model_type"]
    try:
        config = transformers.AutoConfig.for_model(**cfg)
    except Exception as err:  # unknown to transformers, or a value its config class refuses
        raise InvalidArgument(f"config: transformers cannot build a {model_type!r} config from it "
                              f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None
    if auto is not None:
        auto = getattr(transformers, auto)
    else:
        auto = transformers.AutoModelForSeq2SeqLM if _seq2seq(model_type) else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    try:
        options = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        model = auto.from_config(config, dtype=torch.float32, **options)
    except Exception as err:
        raise InvalidArgument(f"config: transformers cannot build a {model_type!r} model from it "
                              f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def _attention_outputs(model, inputs: dict) -> dict[tuple[str, int], Any]:
    import torch

    captured: dict[tuple[str, int], Any] = {}
    handles = []
    from posenc.integrations.families import decoder_stacks

    for stack, modules in decoder_stacks(model):
        for index, module in enumerate(modules):
            def hook(_module, _args, output, key=(stack, index)):
                captured[key] = (output[0] if isinstance(output, tuple) else output).detach().clone()
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def audit(config: Mapping[str, Any] | str | os.PathLike, *, length: int | None = None, seed: int = 0) -> AuditReport:
    """Check ``position_plan(config)`` against the model transformers builds from ``config``.

    Args:
        config: a config.json dict, or what :func:`read_config` takes (a file, a folder, a
            cached model id). Read as :func:`~posenc.hf_config.position_plan` reads it: an alias
            or an unknown ``model_type`` through its ``architectures`` class, a wrapper through
            its ``text_config`` (the audit model is then the text model alone).
        length: tokens per input (default: see the module docstring).
        seed: the seed of the random tokens.

    Returns:
        An :class:`AuditReport`; ``report.ok`` when every layer's attention output matches
        within its row's tolerance: the larger of :data:`TOLERANCE` relative to the outputs'
        scale (absolute for outputs up to 1) and twice the model's own float32 noise: |eager -
        sdpa| on the same weights and input, and |own - own with every rotary frequency moved
        by :data:`ANGLE_ROUNDING`| (transformers computes the angles in float32, posenc in
        float64: a difference that grows with the position, and is no error of the plan).

    Raises:
        InvalidArgument: a config it cannot read, a family posenc does not read, a model that
            transformers (or use_encoding / apply_plan) cannot build or run (its message
            quoted), a bad length.
        ImportError: transformers is not installed.
    """
    import torch

    if not isinstance(config, Mapping):
        config, _ = read_config(config)
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise InvalidArgument(f"length must be a positive int, got {length!r}")
    full_plan = _quiet_plan(config)
    decoder_config = _text_config(_resolved(config))
    plan_layers = _layers_needed(full_plan)
    if full_plan.encoder is not None:
        plan_layers = max(plan_layers, _layers_needed(full_plan.encoder))
    cfg = shrink_config(decoder_config, plan_layers, head_dim=_plan_head_dim(full_plan))
    plan = _quiet_plan(cfg)
    build = _builder(_resolved(config), cfg)
    model = build()
    from posenc.integrations.adapters import adapter_of, apply_plan
    from posenc.integrations.transformers import use_encoding

    model_type = model.config.model_type
    length = length if length is not None else _default_length(plan, cfg)
    tokens = torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))
    inputs = {"input_ids": tokens}
    if _seq2seq(model_type):
        inputs["decoder_input_ids"] = tokens
    own = _run(model, inputs, "the model transformers builds")
    noise = _noise(build, model, inputs, own)
    structure = _layer_structure(model, inputs)
    adapted = adapter_of(model) is not None
    method = "adapters.apply_plan" if adapted else "use_encoding"
    try:
        apply_plan(model, plan) if adapted else use_encoding(model, plan)
    except PosencError as err:
        raise InvalidArgument(f"config ({model_type}): posenc cannot apply its plan to the model ({err})") from None
    ours = _run(model, inputs, f"the model with posenc's plan ({method})")
    rows = []
    for stack, stack_plan in (("encoder", plan.encoder), ("decoder", plan)):
        if stack_plan is None:
            continue
        groups: dict[str, list[int]] = {}
        for index, layer in enumerate(stack_plan):
            groups.setdefault(_row_text(layer), []).append(index)
        for text, indices in groups.items():
            # a layer the model does not run on this input (Mllama's cross-attention layers
            # without an image) has no output on either side: the row says so
            ran = [i for i in indices if (stack, i) in own]
            one_sided = [i for i in indices if ((stack, i) in own) != ((stack, i) in ours)]
            if not ran and not one_sided:
                rows.append(AuditRow(stack, tuple(indices), f"{text} (not run by the model on this input)", 0.0))
                continue
            diff = max(((own[(stack, i)] - ours[(stack, i)]).abs().max().item() for i in ran if (stack, i) in ours),
                       default=0.0)
            disagreement = "; ".join(dict.fromkeys(
                [found for i in indices if (found := _disagreement(stack_plan[i], structure.get((stack, i)), i))]
                + [f"layer {i}: its attention runs in one of the two models only" for i in one_sided]))
            rows.append(AuditRow(stack, tuple(indices), text, diff, max(noise.get((stack, i), 0.0) for i in ran),
                                 max(own[(stack, i)].abs().max().item() for i in ran), disagreement))
    sizes = _sizes(model.config, cfg)
    return AuditReport(str(config.get("model_type")), full_plan, len(full_plan), len(plan), sizes, length,
                       tuple(rows), method)


def _sizes(built: Any, cfg: Mapping[str, Any]) -> str:
    """The audit model's sizes as transformers built them (a key the config lacks takes its
    class's default: Gemma 3 4B's text_config names no head counts)."""
    hidden = next((v for k in _HIDDEN_KEYS if isinstance(v := getattr(built, k, None), int)), None)
    heads = next((v for k in _HEAD_KEYS if isinstance(v := getattr(built, k, None), int)), HEADS)
    kv = next((v for k in _KV_KEYS if isinstance(v := getattr(built, k, None), int)), heads)
    return f"hidden {hidden}, heads {heads}/{kv}, head_dim {_head_dim_or_none(cfg) or getattr(built, 'head_dim', None)}"


#: A vision tower's sizes in the audit model (only the text model runs: the input holds no image).
_VISION_SMALL = {"depth": 1, "num_hidden_layers": 1, "embed_dim": 32, "num_heads": 2, "num_attention_heads": 2,
                 "intermediate_size": 32, "mlp_ratio": 1, "fullatt_block_indexes": [0]}
#: A multimodal wrapper's placeholder tokens: past the audit vocabulary, so never in its input.
_WRAPPER_TOKENS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                   "image_token_index", "boi_token_index", "eoi_token_index")


def _builder(config: Mapping[str, Any], cfg: dict) -> Callable[..., Any]:
    """How to build the audit model of ``cfg`` (the shrunk text config), with an attention
    implementation or transformers' default: its causal LM, or, for a text tower transformers
    builds only inside its wrapper (Qwen2-VL, Qwen2.5-VL), the wrapper of ``config`` around it
    with a one-block vision tower that the text-only input never runs."""
    from posenc.hf_config.families import FAMILIES

    family = FAMILIES.get(config.get("model_type"))
    wrapped = family is not None and family.text_config is not None and isinstance(config.get("vision_config"), Mapping)
    if wrapped and not _causal_lm_builds(cfg["model_type"]):
        wrapper = _wrapper_config(config, cfg)
        return lambda attn_implementation=None: _build(wrapper, attn_implementation, "AutoModelForImageTextToText")
    return lambda attn_implementation=None: _build(cfg, attn_implementation)


def _causal_lm_builds(model_type: str) -> bool:
    """Whether transformers has a causal LM class for ``model_type`` (its auto mapping's names)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _small_tower(tower: Mapping[str, Any]) -> dict:
    """A vision tower's config with :data:`_VISION_SMALL`'s sizes where it has those keys, and
    in its own sub-configs (DeepSeek-OCR-2's SAM encoder and its 32-layer, 4096-wide encoder:
    28 GB in float32 at their defaults, built for a tower the text-only input never runs)."""
    small = {k: v for k, v in dict(tower).items() if k not in _DROPPED}
    # a size in the type the config has it (a strict config class refuses mlp_ratio 1 for 1.0)
    small.update({k: float(v) if isinstance(small[k], float) else v for k, v in _VISION_SMALL.items() if k in small})
    if isinstance(small.get("layer_types"), list) and isinstance(small.get("num_hidden_layers"), int):
        small["layer_types"] = small["layer_types"][: small["num_hidden_layers"]]
    for key, value in small.items():
        if isinstance(value, Mapping) and "model_type" in value:
            small[key] = _small_tower(value)
    return small


def _wrapper_config(config: Mapping[str, Any], text: dict) -> dict:
    vision = _small_tower(config["vision_config"])
    hidden = next(text[k] for k in _HIDDEN_KEYS if isinstance(text.get(k), int))
    # the merger's output enters the text model: its width (out_hidden_size where the tower has one)
    if "out_hidden_size" in vision:
        vision.update(hidden_size=32, out_hidden_size=hidden)  # Qwen2.5-VL: its own width, then the text's
    else:
        vision["hidden_size"] = hidden
    wrapper = {k: v for k, v in config.items() if k not in _DROPPED and k not in ("text_config", "vision_config")}
    wrapper.update({key: VOCAB + i for i, key in enumerate(_WRAPPER_TOKENS) if key in wrapper})
    return {**wrapper, "text_config": {k: v for k, v in text.items() if k != "model_type"}, "vision_config": vision,
            "vocab_size": VOCAB}


def _resolved(config: Mapping[str, Any]) -> dict:
    """The config as position_plan reads it: an alias or an architectures class resolved, a
    wrapper's text_config taken (no warning here: the plan's notes say it)."""
    from posenc.hf_config.families import resolve_family

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resolve_family(dict(config))[0]


def _plan_head_dim(plan: PositionPlan) -> int | None:
    """The head width the plan's rotary encodings were read with (the family's defaults and
    aliases applied, as position_plan reads them), or None for a plan without one."""
    for layer in plan:
        head_dim = getattr(layer.encoding, "head_dim", None)
        if isinstance(head_dim, int):
            return head_dim
    return None


def _run(model, inputs: dict, what: str) -> dict:
    """:func:`_attention_outputs`, where whatever the forward pass raises becomes an
    InvalidArgument quoting it (exit 2 in the CLI, never an internal error)."""
    try:
        return _attention_outputs(model, inputs)
    except PosencError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever transformers raises is quoted, never an internal error
        raise InvalidArgument(f"config ({model.config.model_type}): {what} fails on {inputs['input_ids'].shape[1]} "
                              f"tokens ({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None


def _noise(build: Callable[..., Any], model, inputs: dict, own: dict) -> dict:
    """Per layer, the model's own float32 noise: the larger of |own - the same model with its
    other attention implementation (eager for sdpa and back)| (where the family has two) and
    :func:`_angle_noise`."""
    noise = _angle_noise(build, inputs, own)
    other = "eager" if model.config._attn_implementation != "eager" else "sdpa"
    try:
        outputs = _attention_outputs(build(other), inputs)
    except Exception:  # the family refuses the other implementation (Gemma 2, gpt-oss, BLOOM)
        return noise
    for key, value in outputs.items():
        if key in own:
            noise[key] = max(noise.get(key, 0.0), (own[key] - value).abs().max().item())
    return noise


def _angle_noise(build: Callable[..., Any], inputs: dict, own: dict) -> dict:
    """Per layer, |own - the same model with every rotary ``inv_freq`` buffer x (1 +
    :data:`ANGLE_ROUNDING`)|: how far the float32 angles transformers computes can move its
    outputs at these positions (empty for a model without rotary buffers)."""
    import torch

    model = build()
    moved: set[int] = set()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.rsplit(".", 1)[-1].endswith("inv_freq") and buffer.is_floating_point() and id(buffer) not in moved:
                buffer.mul_(1 + ANGLE_ROUNDING)
                moved.add(id(buffer))
    if not moved:
        return {}
    try:
        outputs = _attention_outputs(model, inputs)
    except Exception:  # noqa: BLE001 - already run once on these inputs; nothing to measure
        return {}
    return {key: (own[key] - value).abs().max().item() for key, value in outputs.items() if key in own}


def _layer_structure(model, inputs: dict) -> dict[tuple[str, int], tuple[Any, bool | None]]:
    """Per attention layer of the model as built, what it does with positions, measured: the
    attention mask transformers hands it (a boolean (Tq, Tk) tensor, True = may attend; None:
    plain causal, or a mask object this does not read) and whether it rotates at all (its
    output with identity rotary tables, cos 1 and sin 0, differs from its own; None where the
    layer takes no ``position_embeddings``: positions inside the module, ALiBi, tables)."""
    import torch

    from posenc.integrations.families import decoder_stacks

    found: dict[tuple[str, int], tuple[Any, bool | None]] = {}
    handles, probing = [], []

    def pre_hook(module, args, kwargs, key):
        if probing:
            return
        tables = kwargs.get("position_embeddings")
        # transformers' attention interface (True / 0 = may attend); the adapter families' own
        # attention modules (MPT: True = masked) keep masks of their own
        mask = _bool_mask(kwargs.get("attention_mask")) if "position_embeddings" in kwargs else None
        rotates = None
        if _identity_tables(tables) is not None:
            # the probes must not write to the model's cache
            uncached = {k: (None if k in _CACHE_KEYS else v) for k, v in kwargs.items()}
            probing.append(key)
            try:
                plain = module(*args, **{**uncached, "position_embeddings": _identity_tables(tables)})
                own = module(*args, **uncached)
            finally:
                probing.pop()
            plain, own = (out[0] if isinstance(out, tuple) else out for out in (plain, own))
            rotates = not torch.equal(plain, own)
        found[key] = (mask, rotates)

    for stack, modules in decoder_stacks(model):
        for index, module in enumerate(modules):
            handles.append(module.register_forward_pre_hook(
                lambda m, a, k, key=(stack, index): pre_hook(m, a, k, key), with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    except Exception:  # noqa: BLE001 - the outputs' comparison stands alone where this probe cannot run
        return {}
    finally:
        for handle in handles:
            handle.remove()
    return found


_CACHE_KEYS = ("cache", "past_key_values", "past_key_value")


def _identity_tables(tables: Any) -> Any:
    """Rotary tables that rotate nothing, in the format of ``tables`` ((cos, sin), or one
    complex tensor); None for anything else."""
    import torch

    if isinstance(tables, tuple) and len(tables) == 2 and all(isinstance(t, torch.Tensor) for t in tables):
        return torch.ones_like(tables[0]), torch.zeros_like(tables[1])
    if isinstance(tables, torch.Tensor) and tables.is_complex():
        return torch.ones_like(tables)
    return None


def _bool_mask(mask: Any) -> Any:
    """transformers' attention mask as a boolean (Tq, Tk) tensor of the first row and head
    (True = may attend), or None (no mask: plain causal attention; a mask object)."""
    import torch

    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return None
    mask = mask.reshape(-1, *mask.shape[-2:])[0]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2 if mask.is_floating_point() else None


def _planned_mask(layer: LayerPlan, queries: int, keys: int) -> Any:
    """The boolean (Tq, Tk) mask of the plan's span: causal; within ``window`` keys of the
    query (itself included) for "sliding"; the query's own chunk of ``window`` for "chunked"."""
    import torch

    q = torch.arange(keys - queries, keys).unsqueeze(1)
    k = torch.arange(keys).unsqueeze(0)
    mask = k <= q
    if layer.span == "sliding":
        mask &= q - k < layer.window
    elif layer.span == "chunked":
        mask &= q // layer.window == k // layer.window
    return mask


def _disagreement(layer: LayerPlan, measured: tuple[Any, bool | None] | None, index: int) -> str:
    """What the model's layer ``index`` does that ``layer`` says otherwise, or ""."""
    if measured is None:
        return ""
    mask, rotates = measured
    found = []
    if mask is not None and not bool((_planned_mask(layer, *mask.shape) == mask).all()):
        found.append(f"layer {index}: the model's attention mask is not the plan's {layer.span} span"
                     + (f" of {layer.window}" if layer.window else ""))
    planned = layer.encoding is not None and hasattr(layer.encoding, "inv_freq")
    if rotates is not None and rotates != planned:
        found.append(f"layer {index}: the model's layer " + ("rotates q and k" if rotates else "uses no rotary tables")
                     + (", the plan's does not" if rotates else f", the plan's {layer.describe()} does"))
    return "; ".join(found)


def _row_text(layer: LayerPlan) -> str:
    return layer.describe() + (f" [{layer.layer_type}]" if layer.layer_type else "")


def format_layers(row: AuditRow, with_stack: bool = False) -> str:
    """``"0-4"``; ``"encoder 0-1"`` / ``"decoder 0-1"`` with ``with_stack`` or for an encoder."""
    text = layer_ranges(row.layers)
    return f"{row.stack} {text}" if with_stack or row.stack != "decoder" else text
