"""The lab's one rule for fields added after runs were stored (configs, fingerprints).

Below the model, training and the experiments, so that all of them use it.
"""

from __future__ import annotations

from collections.abc import Mapping


def only_when_set(fields: dict, defaults: Mapping[str, object]) -> dict:
    """``fields`` without each field of ``defaults`` that holds its default value; a key
    ``"part.name"`` names the field ``name`` of the nested dict ``fields[part]``. Absent fields
    are skipped. The rule that keeps stored runs valid: an option added to an experiment
    enters its results.json and its runs' fingerprints only when set, so that the runs stored
    before it existed read the same. Returns a new dict (nested dicts copied where changed)."""
    fields = dict(fields)
    for key, default in defaults.items():
        part, _, name = key.rpartition(".")
        holder = fields
        if part:
            if part not in fields:
                continue
            holder = fields[part] = dict(fields[part])
        if name in holder and holder[name] == default:
            del holder[name]
    return fields
