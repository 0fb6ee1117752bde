"""Speed and memory benchmarks: posenc side by side with its baselines, in one process, as ratios.

One suite (:mod:`posenc.lab.bench.suite`, ``posenc bench``) for every device: RoPE apply on q and k
against a plain copy, Hugging Face's ``apply_rotary_pos_emb``, rotary-embedding-torch and, on
CUDA, Liger's and flash-attn's kernels (:mod:`~posenc.lab.bench.rope`); causal attention per
score-bias encoding and backend against bias-free SDPA and FlashAttention-2's own ALiBi
(:mod:`~posenc.lab.bench.attention`); LM training throughput per encoding
(:mod:`~posenc.lab.bench.throughput`). Every table goes through one writer
(:class:`~posenc.lab.bench.tables.BenchTable`). Peers that are not installed are skipped with a
note (``pip install posenc[bench]``).

Timings are medians of repeats; only the ratios within one run mean anything. rich is
imported when a table is printed.
"""

from __future__ import annotations

from posenc.lab.bench.attention import (
    ATTENTION_COLUMNS, DEVICE_ATTENTION, DEVICE_ATTENTION_COLUMNS, attention_benchmark, device_attention_benchmark,
)
from posenc.lab.bench.rope import (
    COPY_FLOOR, HF_EAGER, ROPE_COLUMNS, ROPE_DEVICE_COLUMNS, rope_benchmark, rope_device_benchmark,
)
from posenc.lab.bench.suite import BENCHMARKS, SIZES, Settings, run_suite
from posenc.lab.bench.tables import BenchTable, print_table, write_table, write_tables
from posenc.lab.bench.throughput import DEVICE_THROUGHPUT, THROUGHPUT_COLUMNS, throughput_benchmark
from posenc.lab.bench.timing import environment

__all__ = [
    "ATTENTION_COLUMNS", "BENCHMARKS", "COPY_FLOOR", "DEVICE_ATTENTION", "DEVICE_ATTENTION_COLUMNS", "DEVICE_THROUGHPUT",
    "HF_EAGER", "ROPE_COLUMNS", "ROPE_DEVICE_COLUMNS", "SIZES", "THROUGHPUT_COLUMNS", "BenchTable", "Settings",
    "attention_benchmark", "device_attention_benchmark", "environment", "print_table", "rope_benchmark",
    "rope_device_benchmark", "run_suite", "throughput_benchmark", "write_table", "write_tables",
]
