"""The family sweep: every causal-LM family of the installed transformers, read exactly by
posenc, refused by name, or not buildable, each with its reason (issue 34, item 1).

:func:`families` enumerates the families from transformers itself, never from a list kept here:

- ``causal-lm``: the model type of every ``...ForCausalLM`` class defined in a
  ``transformers/models/<name>/modeling_<name>.py`` (its ``config_class.model_type``), plus
  every other model type transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` maps to one of
  those classes (``exaone`` -> LlamaForCausalLM, ``llama4`` -> Llama4ForCausalLM, ...);
- ``conditional-generation``: the text-generating model types of ``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``
  and ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` not already listed (T5, Qwen2-VL, LLaVA, ...).

:func:`sweep_family` classifies one model type. Its config is the config class's defaults
(``AutoConfig.for_model(model_type)``); ``position_plan`` reads it or refuses it (**refused**,
the message as the reason). A family read is built tiny by :mod:`posenc.integrations.audit`'s
own shrinking and building (:func:`~posenc.integrations.audit.shrink_config`: 2 query heads, 1
key/value head of the default head width, vocabulary 128, as many layers as the plan has kinds
of layers, every positional key kept; every parameter drawn with std 0.2, float32). Where that
tiny model does not build or run, the family **cannot build** when transformers cannot build
its class from the default config either (tried on the meta device: its config class refuses
its own defaults, an extra not installed) or its forward pass (8 tokens on the meta device)
raises the tiny model's very error (Bamba's and GraniteMoeHybrid's defaults: every layer Mamba,
and transformers 5.24's hybrid cache asks an attention layer for the sequence length), with
transformers' message; otherwise the shrinking is at fault, a **failure**.
A built family is **read exactly** when both hold:

(a) the plan says what the model's layers do (each attention layer's mask, and whether it
    rotates with the tables it is handed, measured as ``posenc audit`` measures them: equal
    logits cannot see a RoPE plan on a layer the model leaves unrotated), and
    ``use_encoding(model, position_plan(model.config))`` (or ``apply_plan`` for the adapter
    families) gives the model's own logits within :func:`tolerance` (the model's own float32
    noise: twice the larger of |eager - sdpa| on the same weights and :func:`_angle_noise`,
    at least 1e-5 relative to the logits' scale, as ``posenc audit`` judges; on
    :func:`_length` random tokens) and the same greedy
    ``generate()`` tokens with the cache (an 8-token prompt, 6 new tokens);
(b) ``extend_context(model, "yarn", 2.0)`` on a fresh copy either round-trips through
    ``save_pretrained`` and a plain transformers ``from_pretrained`` (the same logits within the
    tolerance, or twice the reloaded model's own :func:`_angle_noise` where larger), or is refused with InvalidArgument and leaves ``config.to_dict()`` and the
    logits unchanged.

Anything else is a **failure** (a mismatch, or an error that is not a refusal), which the
tests report. :func:`write_section` writes the verdicts into docs/integration.md between
:data:`BEGIN` and :data:`END`::

    python -m posenc.lab.family_sweep --write docs/integration.md

transformers is imported inside the functions (posenc does not need it otherwise).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.errors import InvalidArgument

__all__ = [
    "BEGIN",
    "END",
    "Family",
    "Verdict",
    "families",
    "refusal_group",
    "render_section",
    "section_names",
    "sweep",
    "sweep_family",
    "tolerance",
    "write_section",
]

BEGIN = "<!-- family sweep: begin -->"
END = "<!-- family sweep: end -->"
#: The verdicts, in the order the section lists them.
VERDICTS = ("read exactly", "refused", "cannot build", "failed")
#: The fewest tokens of the logits check, and the generate() prompt and new tokens.
LENGTH, PROMPT, NEW_TOKENS = 24, 8, 6
#: The most parameters a tiny model may hold (the largest read family's holds a few million).
MAX_PARAMETERS = 50_000_000
#: The longest logits check, for a family whose default window is short (gpt-oss: 128).
MAX_SPAN_LENGTH = 256
#: The extension (b) tries.
EXTENSION = ("yarn", 2.0)


@dataclass(frozen=True)
class Family:
    """One family of the installed transformers: its ``model_type``, ``kind`` (``"causal-lm"``
    or ``"conditional-generation"``) and the transformers class that names it."""

    model_type: str
    kind: str
    model_class: str


@dataclass(frozen=True)
class Verdict:
    """What :func:`sweep_family` found for one family: ``verdict`` (one of :data:`VERDICTS`),
    ``reason`` (why refused / not buildable / failed; empty when read exactly), ``plan``
    (:meth:`PositionPlan.describe` of the tiny model's plan, "; "-joined), ``max_diff``
    (max |logits(model) - logits(use_encoding)|), ``tolerance`` and ``extension`` (what (b)
    found: ``"round-trips (diff ...)"`` or ``"refused: ..."``)."""

    model_type: str
    kind: str
    verdict: str
    reason: str = ""
    plan: str = ""
    max_diff: float | None = None
    tolerance: float | None = None
    extension: str = ""
    seconds: float = 0.0


def _models_dir() -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models"


def _causal_classes() -> dict[str, str]:
    """folder -> the ``...ForCausalLM`` class its modeling file defines."""
    found = {}
    for folder in sorted(_models_dir().iterdir()):
        modeling = folder / f"modeling_{folder.name}.py"
        if folder.name == "auto" or not modeling.is_file():
            continue
        names = re.findall(r"^class (\w+ForCausalLM)\b", modeling.read_text("utf-8"), re.MULTILINE)
        for name in names:
            found[f"{folder.name}.{name}"] = name
    return found


def _own_model_type(folder: str, class_name: str) -> str | None:
    """The model type of ``class_name``'s ``config_class`` (imports its modeling module)."""
    import importlib

    try:
        module = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
        return getattr(module, class_name).config_class.model_type
    except Exception:  # noqa: BLE001 - an extra not installed: the mapping names it, or the folder's name does
        return None


def families() -> list[Family]:
    """Every causal-LM and text conditional-generation family of the installed transformers,
    sorted by model type (see the module docstring for the rule)."""
    from transformers.models.auto import modeling_auto

    causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    by_class: dict[str, list[str]] = {}
    for model_type, names in causal.items():
        for name in names if isinstance(names, (tuple, list)) else (names,):
            by_class.setdefault(name, []).append(model_type)
    found: dict[str, Family] = {}
    for key, class_name in _causal_classes().items():
        folder = key.split(".")[0]
        types = list(by_class.get(class_name, ()))
        own = _own_model_type(folder, class_name) if not types or len(types) > 1 else types[0]
        for model_type in ([own] if own else [folder]) + types:
            found.setdefault(model_type, Family(model_type, "causal-lm", class_name))
    for mapping in (modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                    modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        for model_type, names in mapping.items():
            name = names[0] if isinstance(names, (tuple, list)) else names
            found.setdefault(model_type, Family(model_type, "conditional-generation", name))
    return sorted(found.values(), key=lambda family: family.model_type)


def _short(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word before ``limit`` characters (then "...")."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _message(err: BaseException) -> str:
    return _short(f"{type(err).__name__}: {err}", 240)


#: Per-family keys set on the default config before it is read and shrunk, as a released
#: config.json has them, where the default config builds no model of the family's positions:
#: an all-Mamba hybrid (no attention layer to check; transformers 5.24's hybrid cache cannot
#: even run it), or a head width or key/value head count left None (no model builds).
RELEASED_SHAPES: dict[str, dict[str, Any]] = {
    # ibm-ai-platform/Bamba-9B: attention at layers 9, 18, 27 of 32
    "bamba": {"attn_layer_indices": [9, 18, 27]},
    # ibm-granite/granite-4.0-h-*: one attention layer (NoPE) in every ten, the others Mamba 2
    "granitemoehybrid": {"layer_types": ["attention" if i % 10 == 5 else "mamba" for i in range(32)]},
    # tencent/Hunyuan-7B-Instruct and Hunyuan-A13B-Instruct: head_dim 128
    "hunyuan_v1_dense": {"head_dim": 128},
    "hunyuan_v1_moe": {"head_dim": 128},
    # mistralai/Ministral-8B-Instruct-2410: head_dim 128
    "ministral": {"head_dim": 128},
    # LiquidAI/LFM2-8B-A1B: attention at layers 2, 6, 10, 14, 18, 21 of 24, short convolutions elsewhere
    # (Lfm2MoeConfig has no default schedule: transformers builds no model without layer_types)
    "lfm2_moe": {"num_hidden_layers": 24,
                 "layer_types": ["full_attention" if i in (2, 6, 10, 14, 18, 21) else "conv" for i in range(24)]},
    # zai-org/GLM-4.5: head_dim 128 (Glm4MoeConfig has none: 4096 // 96 floored, an odd rotated width)
    "glm4_moe": {"head_dim": 128},
    # nvidia/Minitron-8B-Base: 8 key/value heads (NemotronConfig's default is None)
    "nemotron": {"num_key_value_heads": 8},
}


#: Per-family keys of the shrunk config (None: the key removed) that ``posenc audit``'s
#: shrinking does not know: sizes the config class derives (Zamba's and Zamba2's widths,
#: recomputed from the shrunk hidden size once removed) and expert counts under another spelling.
TINY_SHAPES: dict[str, dict[str, Any]] = {
    "zamba2": dict.fromkeys(("mamba_headdim", "attention_hidden_size", "attention_head_dim", "hybrid_layer_ids",
                             "kv_channels", "num_query_groups")),
    "zamba": dict.fromkeys(("attention_hidden_size", "attention_head_dim", "mamba_dt_rank")),
    "kimi_linear": {"num_experts_per_token": 1},
    # Youtu's model as built holds lm_head apart from the embeddings that its reload ties
    # (transformers 5.24): untied, a plain save / load keeps the weights drawn
    "youtu": {"tie_word_embeddings": False},
    # NeMo SpeechLM's NemotronH decoder: its layer list is the layer count (no num_hidden_layers for the
    # shrinking to cut by), kept to its first six blocks (Mamba, experts, ..., its first attention layer)
    "nemo_speechlm": {"layers_block_type": ["linear_attention", "moe", "linear_attention", "moe", "linear_attention",
                                            "full_attention"], "moe_shared_expert_intermediate_size": 32},
    # Muse Glimmer's vision tower lists one layer type per block: as many as the one block kept
    "muse_glimmer": {"vision_config": {"layer_types": ["full_attention"]}},
    # Muse Spark: Muse Glimmer's towers and an audio encoder, whose output width must be the text model's
    # (2 heads of 64), kept to one stage of width 16; its vision adapter 32 wide (4096 by default: 42M parameters)
    "muse_spark": {"vision_config": {"layer_types": ["full_attention"]}, "projector_hidden_size": 32,
                   "audio_config": {"out_hidden_size": 128, "num_hidden_layers": 1, "patch_sizes": [16],
                                    "hidden_sizes": [16], "depths": [1]}},
    # Phi-4-multimodal's image and audio towers (871M parameters by default) at width 16
    "phi4_multimodal": {"vision_config": {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2,
                                          "num_attention_heads": 2},
                        "audio_config": {"hidden_size": 16, "intermediate_size": 16, "num_blocks": 1,
                                         "num_attention_heads": 2, "ext_pw_out_channel": 16,
                                         "depthwise_separable_out_channel": 16, "nemo_conv_channels": 16}},
    # Molmo2's vision adapter: the one vision block's features, its widths the tiny towers' (text: 2 heads of 128)
    "molmo2": {"adapter_config": {"vision_feature_layer": [-1], "hidden_size": 16, "num_attention_heads": 2,
                                  "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 16,
                                  "text_hidden_size": 256}},
    # Dory's config.json lists an mlp block after each attention block and counts both (its config class
    # halves the counts), and its input, recurrent and output blocks must add up to the layers: 1 input,
    # 2 recurrent, 1 output layer (sliding, sliding, sliding, full), as released configs split them
    "dory": {"num_hidden_layers": 8, "n_input_layers": 2, "n_recurrent_layers": 4, "n_output_layers": 2,
             "layer_types": [block for i in range(4) for block in
                             ("full_attention" if i == 3 else "sliding_attention", "mlp")]},
}
#: Per-family fewest layers of the tiny model: Zamba ties its shared attention block across the
#: hybrid layers, and transformers refuses a model with only one of them.
MIN_LAYERS: dict[str, int] = {"zamba": 8}


def _tiny_shape(model_type: str, cfg: dict) -> dict:
    """The shrunk ``cfg`` with :data:`TINY_SHAPES`' keys for ``model_type`` set or removed (a
    dict value over a sub-config dict: its keys set or removed there)."""
    return _shaped(cfg, TINY_SHAPES.get(model_type, {}))


def _shaped(cfg: dict, shape: dict) -> dict:
    out = dict(cfg)
    for key, value in shape.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _shaped(out[key], value)
        else:
            out[key] = value
    return out


def _default_config(model_type: str) -> dict:
    """The config class's defaults (``AutoConfig.for_model``), with :data:`RELEASED_SHAPES`' keys."""
    import transformers

    shape = RELEASED_SHAPES.get(model_type, {})
    config = transformers.AutoConfig.for_model(model_type, **shape)
    return config.to_dict()


def _plan(config: dict):
    from posenc.hf_config import position_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return position_plan(config)


def tolerance(scale: float, noise: float) -> float:
    """The largest |logits difference| that is float32 noise: ``posenc audit``'s rule,
    max(TOLERANCE x max(1, scale), 2 x noise), with ``scale`` the largest |logit| and ``noise``
    the model's own float32 noise on the same weights and tokens: the larger of |eager -
    sdpa| (0 where it has one) and :func:`_angle_noise`."""
    from posenc.integrations.audit import TOLERANCE

    return max(TOLERANCE * max(1.0, scale), 2.0 * noise)


def _inputs(model, tokens) -> dict:
    from posenc.integrations.audit import _seq2seq

    inputs = {"input_ids": tokens}
    if _seq2seq(model.config.model_type):
        inputs["decoder_input_ids"] = tokens
    return inputs


def _logits(model, tokens):
    import torch

    with torch.no_grad():
        return model(**_inputs(model, tokens)).logits.detach().clone()


def _structure_disagreement(model, plan, tokens) -> str:
    """What the tiny model's layers do with positions that the plan says otherwise, measured
    as ``posenc audit`` measures it (:func:`posenc.integrations.audit._layer_structure`: the mask
    each attention layer gets, and whether it rotates at all with the tables it is handed);
    "" when they agree. Equal logits cannot see a RoPE plan on a layer the model leaves
    unrotated: on the table route that layer ignores the tables posenc hands it."""
    from posenc.integrations.audit import _disagreement, _layer_structure

    structure = _layer_structure(model, _inputs(model, tokens))
    found = []
    for stack, stack_plan in (("encoder", plan.encoder), ("decoder", plan)):
        if stack_plan is None:
            continue
        for index, layer in enumerate(stack_plan):
            if text := _disagreement(layer, structure.get((stack, index)), index):
                found.append(f"{stack} {text}" if stack == "encoder" else text)
    return "; ".join(dict.fromkeys(found))


def _generate(model, tokens):
    import torch

    with torch.no_grad():
        return model.generate(tokens[:, :PROMPT], max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                              min_new_tokens=NEW_TOKENS, pad_token_id=0)


def _noise(cfg: dict, model, tokens, own) -> float:
    other = "eager" if model.config._attn_implementation != "eager" else "sdpa"
    try:
        return (_logits(_build_tiny(cfg, other), tokens) - own).abs().max().item()
    except Exception:  # noqa: BLE001 - the family has one attention implementation (Gemma 2, gpt-oss, BLOOM)
        return 0.0


def _angle_noise(model, tokens, own) -> float:
    """max |own - logits| of ``model`` with every rotary ``inv_freq`` buffer x (1 +- ``posenc
    audit``'s ANGLE_ROUNDING), the buffers restored after: how far transformers' float32
    angles (inv_freq rounded to float32, ``position * inv_freq`` in float32) move these logits,
    while posenc computes the angles in float64. Both signs, since the tiny models (std 0.2)
    amplify a rounding chaotically and one direction can move them far less than the other
    (VaultGemma's default config: 7.5e-3 one way; posenc's exact plan 2.4e-3 from transformers'
    logits). 0.0 for a model without such buffers."""
    import torch

    from posenc.integrations.audit import ANGLE_ROUNDING

    buffers = {id(b): b for name, b in model.named_buffers()
               if name.rsplit(".", 1)[-1].endswith("inv_freq") and b.is_floating_point()}
    if not buffers:
        return 0.0
    saved = {key: b.clone() for key, b in buffers.items()}
    noise = 0.0
    try:
        for sign in (1.0, -1.0):
            with torch.no_grad():
                for key, b in buffers.items():
                    b.copy_(saved[key] * (1 + sign * ANGLE_ROUNDING))
            noise = max(noise, (_logits(model, tokens) - own).abs().max().item())
    finally:
        with torch.no_grad():
            for key, b in buffers.items():
                b.copy_(saved[key])
    return noise


def _apply(model, plan):
    from posenc.integrations.adapters import adapter_of, apply_plan
    from posenc.integrations.transformers import use_encoding

    return apply_plan(model, plan) if adapter_of(model) is not None else use_encoding(model, plan)


def _length(plan, cfg: dict) -> int:
    """Tokens of the logits check: ``posenc audit``'s default length (8 past the longest
    sliding window or chunk) where that is at most :data:`MAX_SPAN_LENGTH`, so that a short
    span is exercised; else :data:`LENGTH`. Longer inputs would measure transformers' float32
    angles against posenc's float64 ones (a difference growing with the position, issue 34
    item 4), not the plan."""
    from posenc.integrations.audit import _default_length

    length = _default_length(plan, cfg.get("text_config") or cfg)
    return length if LENGTH < length <= MAX_SPAN_LENGTH else LENGTH


def _one_line(described: str) -> str:
    """:meth:`PositionPlan.describe` on one line: groups joined by " / ", a stack's heading
    ("encoder:") kept with its first group."""
    text = ""
    for line in (line.strip() for line in described.splitlines()):
        text += (" " if text.endswith(":") else " / " if text else "") + line
    return text


def _check_extension(cfg: dict, tokens, limit: float) -> tuple[bool, str]:
    """(b): (ok, what happened) for ``extend_context(model, *EXTENSION)`` on a fresh model."""
    import transformers

    from posenc.integrations.audit import _seq2seq
    from posenc.integrations.transformers import extend_context

    model = _build_tiny(cfg)
    before, config = _logits(model, tokens), model.config.to_dict()
    try:
        extend_context(model, *EXTENSION)
    except InvalidArgument as err:
        unchanged = model.config.to_dict() == config and (_logits(model, tokens) - before).abs().max().item() == 0
        text = f"refused: {_short(str(err), 160)}"
        return unchanged, text if unchanged else f"refused but changed the model or its config ({text})"
    extended = _logits(model, tokens)
    auto = (transformers.AutoModelForImageTextToText if "text_config" in cfg else
            transformers.AutoModelForSeq2SeqLM if _seq2seq(model.config.model_type) else transformers.AutoModelForCausalLM)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plain = auto.from_pretrained(folder, attn_implementation=model.config._attn_implementation).eval()
        except Exception as err:  # noqa: BLE001 - whatever transformers raises is the finding
            return False, f"the extended checkpoint does not load with a plain from_pretrained ({_message(err)})"
    reloaded = _logits(plain, tokens)
    # the reloaded model's own float32 angles, now at the extended frequencies
    limit = max(limit, 2.0 * _angle_noise(plain, tokens, reloaded))
    diff = (reloaded - extended).abs().max().item()
    return diff <= limit, f"round-trips ({diff:.1e})" if diff <= limit else f"plain from_pretrained differs by {diff:.2e}"


#: The smallest vision tower of a multimodal wrapper (Qwen2-VL's keys; 1 block, width 16).
_VISION = {**dict.fromkeys(("depth", "num_hidden_layers", "num_layers"), 1),
           **dict.fromkeys(("embed_dim", "hidden_size", "intermediate_size"), 16),
           **dict.fromkeys(("num_heads", "num_attention_heads"), 2),
           "patch_size": 2, "spatial_merge_size": 1, "temporal_patch_size": 1}


def _tiny_config(config: dict, layers: int) -> dict:
    """``config`` shrunk by ``posenc audit``'s :func:`~posenc.integrations.audit.shrink_config`
    (its text model's config for a wrapper whose text model transformers builds on its own as
    a causal LM; else the wrapper with its text config shrunk and its vision tower at
    :data:`_VISION`)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from posenc.integrations.audit import shrink_config

    text = _audit_shrink(config, layers)
    inner = text.get("text_config")
    if isinstance(inner, dict):  # the audit's shrinking left a wrapper whole: its text model shrunk here
        text = shrink_config(inner, layers)
    elif text["model_type"] == config["model_type"] or text["model_type"] in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return text
    wrapper = {key: value for key, value in config.items() if key not in ("architectures", "dtype", "_name_or_path")}
    hidden = next(text[key] for key in ("hidden_size", "n_embd", "d_model") if isinstance(text.get(key), int))
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        wrapper["vision_config"] = {**{k: v for k, v in vision.items() if k != "architectures"},
                                    **{k: v for k, v in _VISION.items() if k in vision}, "out_hidden_size": hidden}
    return {**wrapper, "text_config": text}


def _audit_shrink(config: dict, layers: int) -> dict:
    """The decoder's config shrunk as :func:`posenc.integrations.audit.audit` shrinks it: read
    as position_plan reads it (an alias or an ``architectures`` class resolved, a wrapper's
    ``text_config`` taken: ``_resolved``), the head width the plan was read with
    (``_plan_head_dim``)."""
    from posenc.integrations import audit

    head_dim = audit._plan_head_dim(_plan(config))
    return audit.shrink_config(audit._text_config(audit._resolved(config)), layers, head_dim=head_dim)


def _check_size(auto, cfg: dict) -> None:
    """Refuse a "tiny" model past :data:`MAX_PARAMETERS` (counted on the meta device), so that
    a size key the shrinking misses cannot take a shared machine's memory."""
    import torch
    import transformers

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        count = sum(p.numel() for p in auto.from_config(transformers.AutoConfig.for_model(**cfg)).parameters())
    if count > MAX_PARAMETERS:
        raise InvalidArgument(f"config: the tiny model would hold {count / 1e6:.0f}M parameters (more than "
                              f"{MAX_PARAMETERS / 1e6:.0f}M): a size key the shrinking keeps")


def _build_tiny(cfg: dict, attn_implementation: str | None = None):
    """``posenc audit``'s model builder (std 0.2, float32), or for a wrapper
    (``text_config`` kept whole) transformers' image-text-to-text class, drawn the same way."""
    import torch
    import transformers

    from posenc.integrations.audit import _build, _seq2seq

    wrapper = "text_config" in cfg
    auto = (transformers.AutoModelForImageTextToText if wrapper else
            transformers.AutoModelForSeq2SeqLM if _seq2seq(cfg["model_type"]) else transformers.AutoModelForCausalLM)
    _check_size(auto, cfg)
    if not wrapper:
        return _build(cfg, attn_implementation)
    config = transformers.AutoConfig.for_model(**cfg)
    options = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32, **options)
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def _default_build_refusal(family: Family, config: dict, tiny_error: BaseException | None = None) -> str | None:
    """Why transformers cannot build ``family``'s class from its default config (built on the
    meta device: no memory, no weights), or cannot run it the way the tiny model failed
    (``tiny_error``: a forward pass of 8 tokens on the meta device raising the same error), or
    None when it can."""
    import torch
    import transformers

    model_class = getattr(transformers, family.model_class, None) if family.model_class else None
    if model_class is None:
        return f"transformers names no class for {family.model_type!r}"
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = model_class(transformers.AutoConfig.for_model(**config))
    except Exception as err:  # noqa: BLE001 - whatever transformers raises is the reason
        return f"transformers' {family.model_class} from its default config: {_message(err)}"
    if tiny_error is None:
        return None
    try:
        with warnings.catch_warnings(), torch.device("meta"), torch.no_grad():
            warnings.simplefilter("ignore")
            model(**_inputs(model, torch.zeros(1, PROMPT, dtype=torch.long)))
    except Exception as err:  # noqa: BLE001 - the default config's own failure, compared with the tiny model's
        if type(err) is type(tiny_error) and str(err) == str(tiny_error):
            return f"transformers' {family.model_class} from its default config runs no forward pass: {_message(err)}"
    return None


def sweep_family(family: Family | str, *, seed: int = 0) -> Verdict:
    """Classify one family (see the module docstring); never raises for the family's sake."""
    import torch

    from posenc.integrations.audit import VOCAB, _layers_needed

    if isinstance(family, str):
        family = Family(family, "causal-lm", "")
    start = time.perf_counter()

    def verdict(kind: str, reason: str = "", **found: Any) -> Verdict:
        return Verdict(family.model_type, family.kind, kind, reason, seconds=time.perf_counter() - start, **found)

    try:
        config = _default_config(family.model_type)
    except Exception as err:  # noqa: BLE001 - the config class refuses its own defaults
        return verdict("cannot build", f"its config class: {_message(err)}")
    try:
        full_plan = _plan(config)
    except InvalidArgument as err:
        return verdict("refused", " ".join(str(err).split()))
    except Exception as err:  # noqa: BLE001 - position_plan must refuse with InvalidArgument, nothing else
        return verdict("failed", f"position_plan raised {_message(err)}")
    try:
        layers = max(_layers_needed(full_plan), _layers_needed(full_plan.encoder) if full_plan.encoder else 0,
                     MIN_LAYERS.get(family.model_type, 0))
        cfg = _tiny_shape(family.model_type, _tiny_config(config, layers))
        plan = _plan(cfg)
        model = _build_tiny(cfg)
        tokens = torch.randint(3, VOCAB, (1, _length(plan, cfg)), generator=torch.Generator().manual_seed(seed))
        own, own_tokens = _logits(model, tokens), _generate(model, tokens)
    except Exception as err:  # noqa: BLE001 - transformers' own model, as shrunk, does not build or run
        tiny = _short(str(err), 300) if isinstance(err, InvalidArgument) else f"the tiny model: {_message(err)}"
        refusal = _default_build_refusal(family, config, err)
        if refusal is None:  # transformers builds and runs the default config: the shrinking is at fault
            return verdict("failed", f"shrinking (posenc audit's shrink_config): {tiny}")
        return verdict("cannot build", refusal)
    plan_text = _one_line(plan.describe())
    text_type = (cfg.get("text_config") or cfg)["model_type"]
    if text_type != family.model_type:
        plan_text = f"(text model `{text_type}`) {plan_text}"
    try:
        noise = max(_noise(cfg, model, tokens, own), _angle_noise(model, tokens, own))
        limit = tolerance(own.abs().max().item(), noise)
        structure = _structure_disagreement(model, plan, tokens)
        _apply(model, plan)
        diff = (_logits(model, tokens) - own).abs().max().item()
        same_tokens = torch.equal(_generate(model, tokens), own_tokens)
    except Exception as err:  # noqa: BLE001 - an internal error is a failure, reported
        return verdict("failed", f"use_encoding: {_message(err)}", plan=plan_text)
    found = {"plan": plan_text, "max_diff": diff, "tolerance": limit}
    if structure:
        return verdict("failed", f"the model's layers disagree with the plan: {structure}", **found)
    if diff > limit or not same_tokens:
        why = f"logits differ by {diff:.2e} (tolerance {limit:.2e})" if diff > limit else "generate() tokens differ"
        return verdict("failed", why, **found)
    try:
        ok, extension = _check_extension(cfg, tokens, limit)
    except Exception as err:  # noqa: BLE001 - an internal error is a failure, reported
        return verdict("failed", f"extend_context: {_message(err)}", **found)
    return verdict("read exactly" if ok else "failed", "" if ok else extension, extension=extension, **found)


def sweep(names: Iterable[Family | str] | None = None, *, progress: bool = False) -> list[Verdict]:
    """:func:`sweep_family` on each of ``names`` (default: every one of :func:`families`)."""
    results = []
    for family in families() if names is None else names:
        results.append(sweep_family(family))
        if progress:
            found = results[-1]
            print(f"{found.model_type:32s} {found.verdict:13s} {found.seconds:5.1f}s {found.reason[:90]}", flush=True)
    return results


def refusal_group(reason: str) -> str:
    """A refusal's group: ``"no family record"`` (position_plan lists the model types it
    reads instead) or ``"a named positional feature"`` (anything else it names)."""
    return "no family record" if re.search(r"model_type'?\]? = .*posenc reads \[", reason) else "a named positional feature"


def _reason_cell(verdict: Verdict) -> str:
    if verdict.verdict == "refused" and refusal_group(verdict.reason) == "no family record":
        return "no family record"
    return _cell(verdict.reason)


def render_section(verdicts: list[Verdict]) -> str:
    """The docs section (between :data:`BEGIN` and :data:`END`): a table per verdict."""
    import transformers

    by = {kind: [v for v in verdicts if v.verdict == kind] for kind in VERDICTS}
    lines = [BEGIN, "", f"Generated by `python -m posenc.lab.family_sweep --write docs/integration.md` from transformers "
             f"{transformers.__version__}: {len(verdicts)} families, {len(by['read exactly'])} read exactly, "
             f"{len(by['refused'])} refused ("
             + ", ".join(f"{group} {sum(refusal_group(v.reason) == group for v in by['refused'])}"
                         for group in ("no family record", "a named positional feature"))
             + f"), {len(by['cannot build'])} cannot build"
             + (f", {len(by['failed'])} failing" if by["failed"] else "") + ".", ""]
    read_title = ("**Read exactly** (logits within the model's own float32 noise, the same cached greedy tokens; "
                  f"`extend_context(model, \"{EXTENSION[0]}\", {EXTENSION[1]})` round-trips or is refused unchanged):")
    lines += [read_title, "",
              "| model type | plan of the tiny model | max diff (tolerance) | extend_context |", "|---|---|---|---|"]
    lines += [f"| `{v.model_type}` | {_cell(v.plan)} | {v.max_diff:.1e} ({v.tolerance:.1e}) | {_cell(v.extension)} |" for v in by["read exactly"]]
    for kind, title in (("refused", "**Refused** by `position_plan`, with its reason"),
                        ("cannot build", "**Cannot build** (no tiny model of the family's default config)"),
                        ("failed", "**Failing**")):
        if not by[kind]:
            continue
        lines += ["", f"{title}:", "", "| model type | kind | reason |", "|---|---|---|"]
        lines += [f"| `{v.model_type}` | {v.kind} | {_reason_cell(v)} |" for v in by[kind]]
    return "\n".join(lines + ["", END])


def _cell(text: str) -> str:
    # brackets escaped: a reason quoting config['a']['b'] is otherwise a Markdown reference link
    return text.replace("|", "\\|").replace("\n", " ").replace("[", "\\[").replace("]", "\\]")


def section_names(text: str) -> dict[str, str]:
    """model type -> verdict, as the generated section of ``text`` (docs/integration.md) lists them."""
    start, end = text.index(BEGIN), text.index(END)
    names, verdict = {}, None
    for line in text[start:end].splitlines():
        for kind, marker in (("read exactly", "**Read exactly**"), ("refused", "**Refused**"),
                             ("cannot build", "**Cannot build**"), ("failed", "**Failing**")):
            if line.startswith(marker):
                verdict = kind
        match = re.match(r"\| `([^`]+)` \|", line)
        if match and verdict:
            names[match.group(1)] = verdict
    return names


def write_section(path: str | Path, verdicts: list[Verdict]) -> None:
    """Replace the generated section of ``path`` (or append one) with :func:`render_section`."""
    path = Path(path)
    text = path.read_text("utf-8")
    section = render_section(verdicts)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, "utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.lab.family_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="model types to sweep (default: every family)")
    parser.add_argument("--write", metavar="DOC", help="write the generated section into DOC (docs/integration.md)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    known = {family.model_type: family for family in families()}
    chosen = [known.get(name, Family(name, "causal-lm", "")) for name in args.model_types] or None
    import transformers

    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    verdicts = sweep(chosen, progress=True)
    print(f"{len(verdicts)} families in {time.perf_counter() - start:.0f}s: "
          + ", ".join(f"{kind} {sum(v.verdict == kind for v in verdicts)}" for kind in VERDICTS))
    if args.write:
        write_section(args.write, verdicts)
    return 1 if any(v.verdict == "failed" for v in verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
