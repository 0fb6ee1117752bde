"""Save / load: :func:`from_pretrained` loads a folder saved after
:func:`~posenc.integrations.transformers.use_encoding` or
:func:`~posenc.integrations.transformers.extend_context` with the posenc plan it had.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from posenc.errors import InvalidArgument
from posenc.integrations import branch_attention as branches
from posenc.integrations.extend import extend_context
from posenc.integrations.record import BUILT_FROM_NAME, CONFIG_KEY
from posenc.integrations.routes import use_encoding
from posenc.plan import PositionPlan, encoding_from_dict


def from_pretrained(path: Any, **kwargs: Any) -> nn.Module:
    """Load a model saved after :func:`use_encoding` (or :func:`extend_context` with a position
    map) with the posenc plan it had.

    A config with ``posenc_context_extension`` (a position map of :func:`extend_context`):
    ``AutoModelForCausalLM.from_pretrained``, then ``extend_context(model, method, **params)``
    with the recorded method and resolved parameters. A config with a rope_type transformers
    cannot build (``dynamic_yarn``) and a recorded plan: built with the default rope_type in
    its place, then the plan applied and the config's rope dict put back as saved.

    ``transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)`` (T5:
    ``AutoModelForSeq2SeqLM``), then :func:`use_encoding` with the plan recorded in config.json
    (``posenc_plan``; the single encoding or ``layers=`` given, where one was), then the
    encoding's learned parameters (``base_model.posenc_encoding.*``) read from the saved weights
    (``model.safetensors`` or its shards). A folder without a recorded plan loads as
    transformers loads it.

    A plain ``from_pretrained`` (without posenc) of such a folder loads the model with its own
    positions: the recorded plan is an unread config attribute and the encoding's weights are
    reported as unexpected keys and dropped (docs/integration.md).

    Raises:
        InvalidArgument: a recorded plan this posenc cannot rebuild (another format, an unknown
            encoding); saved weights lacking an encoding parameter (named). ImportError:
            transformers or safetensors is not installed.
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(path)
    auto = transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else \
        transformers.AutoModelForCausalLM
    posenc_only = _posenc_only_rope(config) if "config" not in kwargs and isinstance(
        getattr(config, CONFIG_KEY, None), dict) else None
    if posenc_only:  # transformers cannot build that rotary module: built with the default one, then the plan's
        kwargs = {**kwargs, "config": config}
    model = auto.from_pretrained(path, **kwargs)
    for owner, name, value in posenc_only or ():
        setattr(model.config if owner is config else owner, name, value)
    extension = getattr(model.config, branches.CONFIG_KEY, None)
    if extension is not None:  # a position map of extend_context: applied again
        if not isinstance(extension, dict) or not isinstance(extension.get("params"), dict):
            raise InvalidArgument(f"config.{branches.CONFIG_KEY} must be a dict with 'method' and 'params', got "
                                  f"{extension!r}")
        return extend_context(model, extension.get("method"), **extension["params"])
    record = getattr(model.config, CONFIG_KEY, None)
    if record is None:
        return model
    if not isinstance(record, dict):
        raise InvalidArgument(f"config.{CONFIG_KEY} must be a dict (PositionPlan.to_dict), got {type(record).__name__}")
    if "error" in record:
        raise InvalidArgument(f"{path}: the model was saved with a plan posenc could not record: {record['error']}")
    given, by_name = record.get("encoding"), record.get(BUILT_FROM_NAME)
    if isinstance(by_name, dict):  # an adapter family's encoding built by name per stack (T5)
        use_encoding(model, by_name.get("name"), layers=record.get("applied_layers"), **(by_name.get("kwargs") or {}))
    else:
        target = encoding_from_dict(given, f"{CONFIG_KEY}.encoding") if given is not None else \
            PositionPlan.from_dict(record)
        use_encoding(model, target, layers=record.get("applied_layers"))
    wanted = [name for name in model.state_dict() if ".posenc_encoding." in f".{name}"]
    if wanted:
        saved = _saved_tensors(path, wanted)
        missing = [name for name in wanted if name not in saved]
        if missing:
            raise InvalidArgument(f"{path}: the saved weights lack the encoding's parameters {missing}")
        parameter = next(model.parameters())
        model.load_state_dict({name: saved[name].to(parameter.device) for name in wanted}, strict=False)
    return model


#: rope_types of posenc's that transformers' rotary modules do not know (its ROPE_INIT_FUNCTIONS).
_POSENC_ONLY_ROPE_TYPES = ("dynamic_yarn", "yarn_log")


def _posenc_only_rope(config: Any) -> list[tuple[Any, str, Any]]:
    """Swap, in ``config``, every rope dict of a type transformers cannot build (dynamic_yarn,
    written by :func:`extend_context`) for the default rope_type with the same theta, so that
    transformers builds the model; returns (owner, attribute, original value) to put back. The
    recorded plan then gives those layers posenc's RoPE of the original dict."""
    swapped = []
    for key in ("rope_parameters", "rope_scaling"):
        value = getattr(config, key, None)
        if not isinstance(value, dict) or not value:
            continue
        per_type = all(isinstance(v, dict) for v in value.values())
        dicts = value if per_type else {None: value}
        if not any(d.get("rope_type") in _POSENC_ONLY_ROPE_TYPES for d in dicts.values()):
            continue
        plain = {name: ({k: v for k, v in d.items() if k in ("rope_theta", "partial_rotary_factor")}
                        | {"rope_type": "default"} if d.get("rope_type") in _POSENC_ONLY_ROPE_TYPES else d)
                 for name, d in dicts.items()}
        swapped.append((config, key, value))
        setattr(config, key, plain if per_type else plain[None])
    return swapped


def _saved_tensors(path: Any, names: list[str]) -> dict[str, Tensor]:
    """The tensors ``names`` from a save_pretrained folder (safetensors, one file or shards)."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {weight_map[name] for name in names if name in weight_map}
    else:
        files = {"model.safetensors"}
    found: dict[str, Tensor] = {}
    for file in files:
        with safe_open(str(folder / file), framework="pt") as handle:
            for name in names:
                if name in handle.keys():
                    found[name] = handle.get_tensor(name)
    return found
