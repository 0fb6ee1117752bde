"""Atomic writes and checked reads of results and training checkpoints.

A file is written to a temporary name in the same folder and renamed over the target, so a
process killed mid-write leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


class CheckpointMismatch(ValueError):
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


def load_checkpoint(path: Path, fingerprint: dict) -> dict:
    """Load a training checkpoint and check it was made with the same ``fingerprint``.

    Raises:
        CheckpointMismatch: unreadable, or made with other arguments or another version.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for a truncated or foreign file
        raise CheckpointMismatch(f"{path} is corrupt or not a posenc checkpoint ({type(err).__name__}); delete it to retrain") from err
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"{path} was made with other arguments or another posenc version; use another --out folder or delete it"
        )
    return state
