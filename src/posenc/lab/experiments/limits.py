"""What a sweep needs of the machine, checked before any work: memory, the ``--out`` folder, threads.

A bad size is refused up front, in one line naming the options, instead of failing after
minutes (or never: a batch of 10^8 windows, a model of 10^12 parameters, 10^5 threads). The
memory check compares an estimate of the largest moment of one run (:class:`Workload`) with the
memory the machine has free now (Linux ``/proc/meminfo`` ``MemAvailable``; on CUDA the device's
free memory); where neither can be read it is skipped. The estimate is a floor, never a
guess on the high side, so a run it refuses could not have fit:

- training (float32 weights, AdamW): parameters x 16 bytes (weights, gradients, two moments),
  plus the activations the backward pass keeps, ``B T d (10 + 2 m)`` floats per layer
  (``m`` the MLP ratio), one layer's attention scores ``B H T^2``, and the logits ``B T V``
  twice (forward and gradient);
- inference (evaluation): the weights, one layer's activations and scores, the logits, and
  the KV cache where the evaluation decodes with one (``2 B T d`` floats per layer).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from posenc.encodings import encoding_class
from posenc.errors import InvalidArgument
from posenc.lab.model import LMConfig

#: The largest ``--threads``: this many threads per CPU core. More gains nothing and, at
#: 10^5, runs the machine out of process ids (the process then dies with SIGSEGV).
THREADS_PER_CORE = 4

#: The largest seed (exclusive): torch's generators take a 64-bit seed, stored signed.
SEED_LIMIT = 2**63

#: Free space ``--out`` must offer before a sweep starts, beyond its checkpoints' estimate:
#: records, results, figures.
MIN_FREE_BYTES = 64 * 2**20

FLOAT_BYTES = 4


def max_threads() -> int:
    """The largest ``--threads`` / ``--workers``: :data:`THREADS_PER_CORE` x ``os.cpu_count()``."""
    return THREADS_PER_CORE * (os.cpu_count() or 1)


def check_threads(value: int | None, option: str) -> None:
    """Raise unless ``value`` (None: not given) is an integer in [1, :func:`max_threads`].

    Raises:
        InvalidArgument: the message names ``option`` and the range.
    """
    if value is None:
        return
    top = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{option} must be an integer >= 1, got {value!r}")
    if value > top:
        raise InvalidArgument(f"{option} must be at most {top} ({THREADS_PER_CORE} x the {os.cpu_count() or 1} CPUs), "
                              f"got {value}")


def check_seed(value: int, option: str) -> None:
    """Raise unless ``value`` is an integer in [0, 2^63).

    Raises:
        InvalidArgument: the message names ``option`` and the range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise InvalidArgument(f"{option} must be an integer in [0, 2**63), got {value!r}")


@dataclass(frozen=True)
class Workload:
    """The largest moment of a run: ``model`` on a batch of ``batch`` sequences of ``length``
    tokens, trained (``training``) or not; ``kv_cache``: decoded with a KV cache;
    ``extra_bytes``: what else it holds (random positions, instances); ``what`` names it."""

    what: str
    model: LMConfig
    batch: int
    length: int
    training: bool
    table: bool = False
    kv_cache: bool = False
    extra_bytes: int = 0


def holds_a_table(names: Iterable[str]) -> bool:
    """Whether any of the encodings ``names`` keeps a table of ``max_positions`` rows (learned)."""
    for name in names:
        sizes = encoding_class(name).model_sizes
        if "max_positions" in (sizes.values() if isinstance(sizes, Mapping) else sizes):
            return True
    return False


def parameter_floor(model: LMConfig, table: bool) -> int:
    """Parameters every model of ``model`` holds at least: token embedding and output head,
    per layer q, k, v, the output projection and the MLP, and the learned table if ``table``."""
    d = model.d_model
    return 2 * model.vocab_size * d + model.num_layers * (4 + 2 * model.mlp_ratio) * d * d \
        + (model.max_positions * d if table else 0)


def estimate_bytes(work: Workload) -> int:
    """The floor of the memory ``work`` needs, in bytes (the module's formula)."""
    m = work.model
    tokens = work.batch * work.length
    weights = parameter_floor(m, work.table) * FLOAT_BYTES * (4 if work.training else 1)
    scores = work.batch * m.num_heads * work.length * work.length * FLOAT_BYTES
    logits = tokens * m.vocab_size * FLOAT_BYTES * (2 if work.training else 1)
    layers = m.num_layers if work.training else 1
    activations = tokens * m.d_model * (10 + 2 * m.mlp_ratio) * layers * FLOAT_BYTES
    cache = 2 * tokens * m.d_model * m.num_layers * FLOAT_BYTES if work.kv_cache else 0
    return weights + scores + logits + activations + cache + work.extra_bytes


def available_bytes(device: str) -> int | None:
    """Memory free now for a run on ``device``: on CUDA the device's free memory, else the
    host's ``MemAvailable`` (Linux); None where it cannot be read (the check is skipped)."""
    if device.startswith("cuda"):
        try:
            import torch

            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n < 2**40 * 10 else f"{n / 2**40:.3g} TiB"


def check_memory(workloads: Iterable[Workload], device: str, concurrent: int = 1, hint: str = "") -> None:
    """Refuse, before any allocation, a sweep whose largest run (``concurrent`` of them at
    once) would not fit in the memory free on ``device``.

    Raises:
        InvalidArgument: one line with the estimate, what it is for, what is free, and ``hint``
            (the options to lower).
    """
    free = available_bytes(device)
    if free is None:
        return
    largest = max(workloads, key=estimate_bytes, default=None)
    if largest is None:
        return
    need = estimate_bytes(largest) * concurrent
    if need > free:
        at_once = f" x {concurrent} runs at once" if concurrent > 1 else ""
        where = "on the device" if device.startswith("cuda") else "(MemAvailable)"
        params = f" with {parameter_floor(largest.model, largest.table):,} parameters"
        raise InvalidArgument(f"{largest.what}{params}{at_once} needs at least {gib(need)} of memory, {gib(free)} is free "
                              f"{where}; lower {hint or 'the sizes'}")


def checkpoint_bytes(model: LMConfig, table: bool) -> int:
    """A training checkpoint's size: weights and AdamW's two moments, float32."""
    return parameter_floor(model, table) * FLOAT_BYTES * 3


def check_out_folder(out: Path, needed: int = 0, option: str = "--out") -> None:
    """Refuse an output folder that cannot take a sweep's files, before any training: a
    regular file, a folder (or the nearest existing parent of one to be created) that this
    process cannot write, or a file system with less than :data:`MIN_FREE_BYTES` + ``needed``
    bytes free.

    Raises:
        InvalidArgument: the message names ``option`` and the problem.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{option}: {out} exists and is not a folder; give a folder (created if missing)")
    existing = out
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidArgument(f"{option}: {out} cannot be created: {existing} is a file")
    try:  # os.access misses read-only mounts and ACLs: write a probe file
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise InvalidArgument(f"{option}: {out} is not writable (cannot create a file in {existing}: "
                              f"{err.strerror or type(err).__name__})") from None
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES + needed:
        raise InvalidArgument(f"{option}: {out} has {free / 2**20:.0f} MiB free on its file system; the run needs at "
                              f"least {(MIN_FREE_BYTES + needed) / 2**20:.0f} MiB (checkpoints, records, figures)")
