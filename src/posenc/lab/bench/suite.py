"""The bench suite, one for every device: ``posenc bench [rope|attention|throughput|all]``.

Each benchmark of :data:`BENCHMARKS` is measured one way on the CPU default (``device``
None: the comparisons built for a small machine, each attention row in a fresh process so that
its memory is its own) and another on a named device (in this process, forward and backward,
peak memory, bf16 on CUDA, at the published shapes of the field's kernels); :data:`SIZES`
holds both ways' sizes, full and ``quick`` (a smoke run). :func:`run_suite` yields one
:class:`~posenc.lab.bench.tables.BenchTable` per benchmark asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from posenc.lab.bench.attention import (
    ATTENTION_COLUMNS, DEVICE_ATTENTION, DEVICE_ATTENTION_COLUMNS, attention_benchmark, device_attention_benchmark,
)
from posenc.lab.bench.rope import ROPE_COLUMNS, ROPE_DEVICE_COLUMNS, rope_benchmark, rope_device_benchmark
from posenc.lab.bench.tables import BenchTable
from posenc.lab.bench.throughput import DEVICE_THROUGHPUT, THROUGHPUT_COLUMNS, throughput_benchmark

#: Each benchmark's arguments: SIZES[benchmark][on a device?][quick?].
SIZES: dict[str, dict[bool, dict[bool, dict]]] = {
    "rope": {
        False: {False: dict(shape=(1, 32, 2048, 128), repeats=7), True: dict(shape=(1, 4, 256, 64), repeats=3, compile_peers=False)},
        True: {False: {}, True: dict(lengths=(16,), q_heads=2, kv_heads=1, head_dim=8, repeats=1, compile_peers=False)},
    },
    "attention": {
        False: {False: dict(lengths=(1024, 2048, 4096, 8192), repeats=2), True: dict(lengths=(256, 512), repeats=1)},
        True: {False: dict(lengths=DEVICE_ATTENTION["lengths"]),
               True: dict(lengths=(32, 64), heads=2, head_dim=16, tokens=128, repeats=1)},
    },
    "throughput": {
        False: {False: dict(steps=5, repeats=3), True: dict(steps=1, repeats=1)},
        True: {False: dict(DEVICE_THROUGHPUT),
               True: dict(d_model=16, num_layers=1, num_heads=2, seq_len=16, batch_size=2, steps=1, repeats=1)},
    },
}


@dataclass(frozen=True)
class Settings:
    """One run of the suite: ``device`` None is the CPU default; ``dtype`` the attention dtype
    on a device (None: bfloat16 on CUDA, float32 elsewhere); ``lengths`` / ``backends`` the
    device attention's; ``compile``: torch.compile the throughput models on a device; ``out``
    (with ``meta``): where a device table is rewritten after each row it measures, so that a
    run cut short keeps its rows (the caller writes the whole table there at the end)."""

    device: str | None = None
    quick: bool = False
    threads: int = 1
    compile: bool = False
    lengths: tuple[int, ...] | None = None
    backends: tuple[str, ...] = ("flex", "auto")
    dtype: str | None = None
    out: str | None = None
    meta: dict | None = None

    @property
    def cuda(self) -> bool:
        return self.device is not None and torch.device(self.device).type == "cuda"

    @property
    def attention_dtype(self) -> str:
        return self.dtype or ("bfloat16" if self.cuda else "float32")

    def sizes(self, benchmark: str) -> dict:
        return dict(SIZES[benchmark][self.device is not None][self.quick])

    def table_name(self, benchmark: str) -> str:
        """The file stem of a device table: ``<benchmark>-<device type>``."""
        return f"{benchmark}-{torch.device(self.device).type}"

    def partial_writer(self, title: str, name: str, columns, notes: list[str]) -> Callable[[list[dict]], None] | None:
        """A ``progress`` callback writing the rows so far as the table ``name`` under ``out``
        (None without ``out``), marked partial until the whole table replaces it."""
        if self.out is None:
            return None

        def write(rows: list[dict]) -> None:
            partial = [*notes, f"partial: {len(rows)} rows so far (the run had not finished when this was written)"]
            BenchTable(title, name, rows, columns, partial).write(self.out, self.meta)

        return write


def _rope(s: Settings) -> BenchTable:
    sizes = s.sizes("rope")
    if s.device is None:
        rows, notes = rope_benchmark(threads=s.threads, **sizes)
        return BenchTable(f"RoPE on q and k {sizes['shape']}", "rope", rows, ROPE_COLUMNS, notes)
    rows, notes = rope_device_benchmark(s.device, dtype="bfloat16" if s.cuda else s.attention_dtype, **sizes)
    return BenchTable(f"RoPE apply on q and k, {s.device}", s.table_name("rope"), rows, ROPE_DEVICE_COLUMNS, notes)


def _attention(s: Settings) -> BenchTable:
    sizes = s.sizes("attention")
    if s.device is None:
        rows, notes = attention_benchmark(threads=s.threads, **sizes)
        return BenchTable("causal attention, H=8, D=64, fp32", "attention", rows, ATTENTION_COLUMNS, notes)
    if s.lengths:
        sizes["lengths"] = s.lengths
    title = f"causal attention on {s.device}, {s.attention_dtype}"
    progress = s.partial_writer(title, s.table_name("attention"), DEVICE_ATTENTION_COLUMNS, [])
    rows, notes = device_attention_benchmark(s.device, backends=s.backends, dtype=s.attention_dtype,
                                             progress=progress, **sizes)
    return BenchTable(title, s.table_name("attention"), rows, DEVICE_ATTENTION_COLUMNS, notes)


def _throughput(s: Settings) -> BenchTable:
    sizes = s.sizes("throughput")
    if s.device is None:
        rows, notes = throughput_benchmark(threads=s.threads, **sizes)
        return BenchTable("LM training throughput", "throughput", rows, THROUGHPUT_COLUMNS, notes)
    rows, notes = throughput_benchmark(device=s.device, autocast="bfloat16" if s.cuda else None, compile=s.compile,
                                       **sizes)
    return BenchTable(f"LM training throughput on {s.device}", s.table_name("throughput"), rows, THROUGHPUT_COLUMNS,
                      notes)


#: The suite, in the order it runs.
BENCHMARKS: dict[str, Callable[[Settings], BenchTable]] = {"rope": _rope, "attention": _attention, "throughput": _throughput}


def run_suite(what: str, settings: Settings) -> Iterator[BenchTable]:
    """The table of each benchmark ``what`` names (one of :data:`BENCHMARKS`, or ``all``), in
    suite order, each yielded as soon as it is measured."""
    for name, benchmark in BENCHMARKS.items():
        if what in (name, "all"):
            yield benchmark(settings)
