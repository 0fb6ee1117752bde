"""Atomic writes and checked reads of results, and the one checkpoint format.

A file is written to a temporary name in the same folder and renamed over the target, so a
process killed mid-write leaves either the old file or the new one, never half of one.

A checkpoint (:func:`save`, :func:`read_model`) is a ``torch.save`` dict of plain data and
tensors only, so every read uses ``torch.load(..., weights_only=True)`` and runs no code
from the file::

    {"format": 2,
     "config": {...},                              # the LMConfig fields
     "encoding": {"name": str, "kwargs": {...}},   # create_for_model(name, <sizes>, **kwargs)
       # or, for a model with a position plan (format 2; see plan_spec):
       #   {"plan": {"encodings": [{"name", "kwargs"}, ...],   # each distinct encoding once
       #             "embedding": int | None,                  # index into encodings
       #             "layers": [{"encoding": int | None,       # None: NoPE
       #                         "span": "full" | "sliding" | "chunked", "window": int | None,
       #                         "layer_type": str | None,
       #                         "sinks": true}, ...]}}            # only for a layer with attention sinks
     "model": state_dict,
     # a training checkpoint (posenc.lab.train) adds:
     "fingerprint": {...}, "step": int, "losses": [float], "optimizer": state_dict,
     "generator": ByteTensor}                      # torch.Generator.get_state()

The encoding is named by its registry name and its own options (:func:`encoding_spec`: the
constructor arguments it recorded, less the sizes); its sizes (d_model, num_heads, head_dim,
max_positions, num_layers) come from the config, as when the model builds it from a name. A plan
model's encodings are named the same way, each distinct one once (layers that share an encoding
share it again after loading), with each layer's span. Format 2 added the plan; files of
format 1 (a single encoding) read unchanged. Files written before format 1 (training checkpoints with the config and encoding
name only inside ``fingerprint["model"]`` and ``fingerprint["encoding"]``) still read.

This module knows the encodings' registry but not the model: the model imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posenc.encodings import REGISTRY, create_for_model
from posenc.encodings.base import PositionalEncoding
from posenc.errors import InvalidArgument
from posenc.plan import LayerPlan, PositionPlan, is_plain_data

#: Version of the checkpoint layout above; a reader refuses a newer one. 2: a position plan
#: may stand in for the single encoding (an older posenc then refuses the file instead of
#: misreading it).
FORMAT = 2


class CheckpointMismatch(InvalidArgument):
    """A stored checkpoint or result was made with other arguments, or is unreadable."""


def _atomic(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file of this process, fsynced, then renamed:
    readers see the old file or the new one, and two writers never share a temporary file."""
    _atomic(path, lambda handle: handle.write(data))


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files (``.<name>.<pid>.tmp``) that a process killed mid-write left
    in ``folder`` and below; those of live processes stay. Returns the paths removed."""
    removed = []
    for tmp in Path(folder).rglob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_json(path: Path, obj: Any) -> None:
    _atomic(path, lambda handle: handle.write(json.dumps(obj, indent=2).encode("utf-8")))


def atomic_save(path: Path, obj: Any) -> None:
    _atomic(path, lambda handle: torch.save(obj, handle))


def read_json(path: Path) -> dict:
    """Read a JSON file written by :func:`atomic_write_json`.

    Raises:
        CheckpointMismatch: the file is not valid JSON (corrupt).
    """
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointMismatch(f"{path} is corrupt ({err}); delete it to recompute") from err


# -- the encoding as plain data ------------------------------------------------------------

def encoding_spec(encoding: PositionalEncoding, **sizes: Any) -> dict:
    """``{"name": registry name, "kwargs": options}`` that rebuild ``encoding`` with
    :func:`posenc.create_for_model` for a model of ``sizes`` (its keyword arguments: d_model,
    num_heads, head_dim, max_positions, causal, num_layers).

    The options are the encoding's own record of its constructor arguments
    (:meth:`~posenc.PositionalEncoding.config`), less the model's sizes
    (:meth:`~posenc.PositionalEncoding.options_for_model`): plain data, nothing read back from
    the instance's attributes.

    Raises:
        ValueError: ``encoding`` is not of a registered class, was built with sizes other than
            the model's, or has an option that is not plain data (int, float, str, bool, None,
            or lists and dicts of those).
    """
    cls = type(encoding)
    prefix = "cannot save a model whose encoding cannot be rebuilt: "
    advice = "; build the model from a registered name, or from posenc.create_for_model with the model's sizes"
    if REGISTRY.get(cls.name) is not cls:
        raise InvalidArgument(f"{prefix}{cls.__name__} is not a registered encoding class{advice}")
    try:
        options = encoding.options_for_model(**sizes)
    except InvalidArgument as err:
        raise InvalidArgument(f"{prefix}{cls.__name__} has options that cannot be read back as this model's ({err}){advice}") from err
    if not is_plain_data(options):
        raise InvalidArgument(f"{prefix}{cls.__name__} has options that cannot be read back from a checkpoint "
                              f"(not plain data: {options!r}){advice}")
    return {"name": cls.name, "kwargs": options}


def plan_spec(plan: PositionPlan, **sizes: Any) -> dict:
    """``{"plan": {"encodings", "embedding", "layers"}}`` (the layout in this module's
    docstring) that :func:`build_plan` turns back into ``plan`` for a model of ``sizes``: each
    distinct encoding (by identity) as its :func:`encoding_spec`, and per layer the index of
    its encoding (None for NoPE), its span, window and layer type.

    Raises:
        ValueError: an encoding that :func:`encoding_spec` cannot name.
    """
    encodings: list[dict] = []
    index: dict[int, int] = {}

    def number(encoding: PositionalEncoding | None) -> int | None:
        if encoding is None:
            return None
        if id(encoding) not in index:
            index[id(encoding)] = len(encodings)
            encodings.append(encoding_spec(encoding, **sizes))
        return index[id(encoding)]

    embedding = number(plan.embedding)
    layers = []
    for layer in plan:
        entry = {"encoding": number(layer.encoding), "span": layer.span, "window": layer.window,
                 "layer_type": layer.layer_type}
        if layer.sinks:  # only when set: a spec written before sinks reads (and fingerprints) the same
            entry["sinks"] = True
        layers.append(entry)
    return {"plan": {"encodings": encodings, "embedding": embedding, "layers": layers}}


def build_plan(spec: Mapping[str, Any], **sizes: Any) -> PositionPlan:
    """The :class:`PositionPlan` that :func:`plan_spec` wrote, its encodings built with
    :func:`posenc.create_for_model` for ``sizes`` (each once, shared by the layers that name it).

    Raises:
        ValueError: a malformed spec (a missing key, an index out of range, a bad span).
    """
    try:
        plan = spec["plan"]
        encodings = [create_for_model(e["name"], **sizes, **dict(e["kwargs"])) for e in plan["encodings"]]

        def encoding_at(number: int | None) -> PositionalEncoding | None:
            if number is None:
                return None
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < len(encodings):
                raise InvalidArgument(f"encoding index {number!r} is not one of the plan's {len(encodings)} encodings")
            return encodings[number]

        layers = tuple(LayerPlan(encoding_at(layer["encoding"]), span=layer["span"], window=layer["window"],
                                 layer_type=layer.get("layer_type"), sinks=layer.get("sinks", False) is True)
                       for layer in plan["layers"])
        return PositionPlan(layers, embedding=encoding_at(plan.get("embedding")))
    except (KeyError, TypeError) as err:
        raise InvalidArgument(f"checkpoint: a malformed position plan ({type(err).__name__}: {err})") from err


# -- model checkpoints ---------------------------------------------------------------------

def save(path: Path, model: Mapping[str, torch.Tensor], *, config: Mapping[str, Any] | None,
         encoding: Mapping[str, Any] | None, **training: Any) -> None:
    """Write a checkpoint atomically: ``model`` (a state_dict), ``config`` (the LMConfig
    fields) and ``encoding`` (:func:`encoding_spec`), plus any ``training`` state as plain
    data or tensors. ``config`` and ``encoding`` are None only for a model that
    :func:`read_model` cannot rebuild (a training checkpoint of another module)."""
    state = {"format": FORMAT, "model": model, **training}  # as given: a state_dict's _metadata is kept
    if config is not None:
        state["config"] = dict(config)
    if encoding is not None:
        state["encoding"] = ({"plan": encoding["plan"]} if "plan" in encoding
                             else {"name": encoding["name"], "kwargs": dict(encoding["kwargs"])})
    atomic_save(path, state)


def read_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, dict, dict]:
    """(config fields, encoding spec (``{"name", "kwargs"}``, or ``{"plan": ...}`` for a plan
    model: :func:`build_plan`), state_dict) of a checkpoint written by :func:`save`, or
    of a training checkpoint from before format 1. Loaded with ``weights_only=True``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unreadable, of a newer format, or missing keys.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: no such file: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for a truncated or foreign file
        raise InvalidArgument(f"checkpoint: {path} is not a readable posenc checkpoint ({type(err).__name__})") from err
    if isinstance(state, dict) and isinstance(state.get("format"), int) and state["format"] > FORMAT:
        raise InvalidArgument(f"checkpoint: {path} has format {state['format']}, newer than this posenc reads ({FORMAT})")
    try:
        if isinstance(state, dict) and "format" in state:
            config, encoding = dict(state["config"]), dict(state["encoding"])
            encoding = ({"plan": encoding["plan"]} if "plan" in encoding
                        else {"name": encoding["name"], "kwargs": dict(encoding["kwargs"])})
        else:  # before format 1: only the experiment's fingerprint named the model
            config = dict(state["fingerprint"]["model"])
            encoding = {"name": state["fingerprint"]["encoding"], "kwargs": {}}
        return config, encoding, state["model"]
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidArgument(
            f"checkpoint: {path} lacks the 'model' weights or fingerprint of a posenc checkpoint: neither 'config' "
            f"and 'encoding' (format {FORMAT}) nor fingerprint['model'] / fingerprint['encoding'] (older training "
            f"checkpoints) ({type(err).__name__}: {err})"
        ) from err


def load_checkpoint(path: Path, fingerprint: dict) -> dict:
    """Load a training checkpoint (``weights_only=True``) and check it was made with the same
    ``fingerprint``.

    Raises:
        CheckpointMismatch: unreadable, or made with other arguments or another version.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a truncated or foreign file
        raise CheckpointMismatch(f"{path} is corrupt or not a posenc checkpoint ({type(err).__name__}); delete it to retrain") from err
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"{path} was made with other arguments or another posenc version; use another --out folder or delete it"
        )
    return state
