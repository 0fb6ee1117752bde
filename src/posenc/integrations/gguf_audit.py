"""``posenc audit FILE.gguf``: a GGUF file's position plan, as llama.cpp reads it, against the
plan of its source config.json and against the model transformers' own GGUF loader builds.

:func:`audit_gguf` reads the file with :func:`posenc.hf_config.gguf.read_gguf_positions` (the
bounded reader: a file it cannot read is an :class:`~posenc.errors.InvalidArgument` of one line,
before anything else opens it), then compares its plan, layer by layer, with
:func:`posenc.hf_config.gguf.plan_differences` (by the rotation each layer computes; every
difference named with the GGUF key it was read from):

- ``against``: the plan :func:`posenc.hf_config.position_plan` reads from a config.json (a
  file, a folder holding one, or a model id in the local Hugging Face cache): what the
  conversion lost or changed (a YaRN factor written into ``yarn_ext_factor``, Gemma 3's sliding
  window left out, Phi-3's LongRoPE factors dropped, ...);
- always, the config transformers builds from the file (``AutoConfig.from_pretrained(folder,
  gguf_file=name)``, the first step of ``AutoModelForCausalLM.from_pretrained(...,
  gguf_file=...)``: metadata only, no tensor is read or dequantized), read by
  :func:`~posenc.hf_config.position_plan`: what transformers' GGUF loader drops or changes. In
  transformers 5.24 (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``,
  ``integrations/ggml.py`` ``GGUF_CONFIG_MAPPING``) the loader maps ``rope.freq_base``,
  ``context_length``, the head counts and, for a few architectures, ``attention.sliding_window``;
  it rebuilds ``rope_scaling`` for gpt-oss only, so a file's YaRN, linear and LongRoPE metadata
  and its ``rope_freqs`` / ``rope_factors_*`` tensors are dropped (the model it builds is
  unscaled), and Gemma 3's ``rope.freq_base_swa`` is replaced by its config class's default.

transformers (and the ``gguf`` package it reads the file with) is imported inside the functions;
without it the second comparison says why it was not made.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.errors import InvalidArgument, PosencError
from posenc.hf_config.gguf import (
    GGUFPositions,
    PlanDifference,
    plan_differences,
    read_gguf_positions,
)
from posenc.plan import PositionPlan, layer_ranges

__all__ = ["GGUFAuditReport", "GGUFComparison", "audit_gguf", "is_gguf_file", "transformers_gguf_config"]

#: The first four bytes of every GGUF file (``GGUF_MAGIC``, gguf-py's constants.py).
GGUF_MAGIC = b"GGUF"
#: The plan fields that belong to a rope scaling (``PlanDifference.field``).
SCALING_FIELDS = frozenset({"rope_type", "factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                            "beta_slow", "truncate", "frequencies"})
#: The position tensors llama.cpp reads (their values are in ``GGUFPositions.metadata`` when read).
POSITION_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
#: How the findings name the other side of the second comparison.
LOADER = "transformers' GGUF loader"


@dataclass(frozen=True)
class GGUFComparison:
    """The GGUF file's plan against one other plan.

    Attributes:
        against: what the other plan is (``"config.json PATH"``, ``"transformers 5.24's GGUF
            loader (LlamaConfig)"``).
        plan: the other plan; None when it could not be built (see ``unavailable``).
        differences: :func:`~posenc.hf_config.gguf.plan_differences` (the file's plan first).
        findings: one sentence per dropped or changed value, naming its GGUF key.
        unavailable: why there is no plan to compare with ("" when there is one).
    """

    against: str
    plan: PositionPlan | None
    differences: tuple[PlanDifference, ...] = ()
    findings: tuple[str, ...] = ()
    unavailable: str = ""


@dataclass(frozen=True)
class GGUFAuditReport:
    """What :func:`audit_gguf` found: the file's positions (:class:`GGUFPositions`: its plan,
    llama.cpp's rope type, the layout, the keys read), the comparison with the config.json when
    one was given (else None) and with transformers' GGUF loader."""

    path: str
    positions: GGUFPositions
    config: GGUFComparison | None
    transformers: GGUFComparison

    @property
    def comparisons(self) -> tuple[GGUFComparison, ...]:
        return tuple(c for c in (self.config, self.transformers) if c is not None)

    @property
    def ok(self) -> bool:
        """No difference in any comparison made (one that could not be made is not a difference)."""
        return not any(c.differences for c in self.comparisons)


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a GGUF file: its name ends in ``.gguf`` (any case; the file need not
    exist, so that a missing one is reported as a GGUF file that cannot be read) or it begins with
    the GGUF magic."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:  # a folder, a model id, a missing file: not ours to judge
        return False


def audit_gguf(path: str | os.PathLike, *, against: str | os.PathLike | None = None) -> GGUFAuditReport:
    """Audit a GGUF file's positions (module docstring).

    Args:
        path: a GGUF file of an architecture posenc reads (:data:`posenc.hf_config.gguf.ARCHES`).
        against: the source config.json (a file, a folder holding one, or a model id in the local
            Hugging Face cache; never downloaded), or None to compare with transformers only.

    Returns:
        A :class:`GGUFAuditReport`; ``report.ok`` is False when a comparison found a difference.

    Raises:
        InvalidArgument: the file cannot be read (:func:`~posenc.hf_config.gguf.read_gguf_positions`:
            one line naming the file); the config cannot be read, or posenc does not read its
            family (the message names the config).
    """
    positions = read_gguf_positions(path)
    config = None if against is None else _against_config(positions, against)
    return GGUFAuditReport(str(path), positions, config, _against_transformers(positions, Path(path)))


def _against_config(positions: GGUFPositions, source: str | os.PathLike) -> GGUFComparison:
    from posenc.hf_config import position_plan
    from posenc.integrations.audit import read_config

    config, where = read_config(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the plan's notes are not the audit's subject
            plan = position_plan(config)
    except PosencError as error:
        raise InvalidArgument(f"--against {where}: {error}") from None
    found = _differences(positions, plan)
    return GGUFComparison(f"config.json {where}", plan, found, tuple(_config_sentence(d) for d in found))


def _against_transformers(positions: GGUFPositions, path: Path) -> GGUFComparison:
    try:
        import transformers
    except ImportError:
        return GGUFComparison(LOADER, None, unavailable="transformers is not installed")
    against = f"transformers {transformers.__version__}'s GGUF loader"
    try:
        config = transformers_gguf_config(path)
    except Exception as error:  # noqa: BLE001 - whatever transformers raises on a file llama.cpp reads is a finding
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        return GGUFComparison(against, None, unavailable=f"it cannot build a config from this file ({reason})")
    against += f" ({type(config).__name__})"
    from posenc.hf_config import position_plan

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = position_plan(config)
    except PosencError as error:
        return GGUFComparison(against, None, unavailable=f"posenc does not read the config it builds ({error})")
    found = _differences(positions, plan)
    return GGUFComparison(against, plan, found, tuple(_loader_sentences(positions, plan, found)))


def transformers_gguf_config(path: str | os.PathLike) -> Any:
    """The config transformers builds from a GGUF file: ``AutoConfig.from_pretrained(folder,
    gguf_file=name)``, as ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` does
    first (the file's metadata only: no tensor is read). transformers' log messages about keys
    it does not map are silenced for the call.

    Raises:
        whatever transformers raises (ImportError without the ``gguf`` package, ValueError for an
        architecture its loader does not know, ...).
    """
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    path = Path(path).resolve()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    finally:
        hf_logging.set_verbosity(verbosity)


def _differences(positions: GGUFPositions, plan: PositionPlan) -> tuple[PlanDifference, ...]:
    return tuple(plan_differences(positions.plan, plan, context_length=positions.context_length, keys=positions.keys))


def _where(difference: PlanDifference) -> str:
    return f" ({difference.key})" if difference.key else ""


def _config_sentence(difference: PlanDifference) -> str:
    return (f"layers {layer_ranges(difference.layers)}: {difference.field}{_where(difference)}: the file says "
            f"{difference.value}, the config {difference.reference}")


def _scaling_in_file(positions: GGUFPositions) -> list[str]:
    """The file's rope scaling keys and position tensors, as ``name = value`` (tensors by name)."""
    prefix = f"{positions.architecture}.rope.scaling."
    names = [f"{key} = {value!r}" for key, value in positions.metadata.items() if key.startswith(prefix)]
    names += [name for name in POSITION_TENSORS if name in positions.metadata]
    return names


def _is_unscaled(plan: PositionPlan, layers: tuple[int, ...]) -> bool:
    return all(not getattr(plan[i].encoding, "scaling", None) for i in layers)


def _loader_sentences(positions: GGUFPositions, plan: PositionPlan,
                      found: tuple[PlanDifference, ...]) -> list[str]:
    """One sentence per value transformers' loader drops or changes: a rope scaling it leaves out
    as one sentence naming the file's scaling keys and tensors, every other difference as one."""
    dropped = tuple(sorted({i for d in found if d.field in SCALING_FIELDS for i in d.layers}))
    sentences = []
    unscaled = bool(dropped) and _is_unscaled(plan, dropped)
    if unscaled:
        names = ", ".join(_scaling_in_file(positions)) or "the file's rope scaling"
        sentences.append(f"{LOADER} drops {names}: the model it builds is unscaled on layers {layer_ranges(dropped)}")
    for difference in found:
        if unscaled and difference.field in SCALING_FIELDS:
            continue  # said by the sentence above
        sentences.append(f"layers {layer_ranges(difference.layers)}: {LOADER} builds {difference.field} "
                         f"{difference.reference} where the file says {difference.value}{_where(difference)}")
    return sentences

