"""Causal attention per score-bias encoding and backend against bias-free SDPA.

Run from the repository root: ``python benchmarks/bench_attention.py`` (``--help`` for options). The same
tables come from ``posenc bench``; this script exposes every knob.

Without ``--device``: the CPU table, fp32, a fresh subprocess per configuration (peak RSS).
With ``--device cuda``: one process, bf16 by default, forward and forward+backward time and peak
memory against bias-free SDPA (torch's flash kernel) and FlashAttention-2's ALiBi, as ratios,
written to ``--out`` (JSON, CSV, Markdown).
"""

from __future__ import annotations

import argparse

from posenc.lab.bench import (ATTENTION_COLUMNS, DEVICE_ATTENTION, DEVICE_ATTENTION_COLUMNS, attention_benchmark,
                          device_attention_benchmark, environment, print_table, write_tables)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="score-bias attention vs bias-free causal SDPA")
    parser.add_argument("--lengths", default=None, help="default 1024,2048,4096,8192 (CPU), 2048,8192,32768 (--device)")
    parser.add_argument("--encodings", default=None)
    parser.add_argument("--backends", default=None, help="default blocked,sdpa (CPU), flex,auto (--device)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="e.g. cuda: the one-process device benchmark")
    parser.add_argument("--dtype", default=None, help="with --device: default bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--heads", type=int, default=DEVICE_ATTENTION["heads"])
    parser.add_argument("--head-dim", type=int, default=DEVICE_ATTENTION["head_dim"])
    parser.add_argument("--tokens", type=int, default=DEVICE_ATTENTION["tokens"], help="with --device: B = tokens // T")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args(argv)
    encodings = tuple(args.encodings.split(",")) if args.encodings else None
    if args.device is None:
        rows, notes = attention_benchmark(
            tuple(int(t) for t in (args.lengths or "1024,2048,4096,8192").split(",")), encodings,
            tuple((args.backends or "blocked,sdpa").split(",")), repeats=args.repeats or 2, threads=args.threads,
        )
        print_table(f"causal attention, H=8, D=64, fp32, {args.threads} thread(s)", rows, ATTENTION_COLUMNS, notes)
        return
    import torch

    dtype = args.dtype or ("bfloat16" if torch.device(args.device).type == "cuda" else "float32")
    rows, notes = device_attention_benchmark(
        args.device, tuple(int(t) for t in args.lengths.split(",")) if args.lengths else DEVICE_ATTENTION["lengths"],
        encodings, tuple((args.backends or "flex,auto").split(",")), heads=args.heads, head_dim=args.head_dim,
        tokens=args.tokens, dtype=dtype, repeats=args.repeats or 10, backward=not args.forward_only,
    )
    print_table(f"causal attention on {args.device}, {dtype}", rows, DEVICE_ATTENTION_COLUMNS, notes)
    paths = write_tables(args.out, f"attention-{torch.device(args.device).type}", rows, DEVICE_ATTENTION_COLUMNS, notes,
                         {**environment(), "device": args.device, "dtype": dtype})
    print("wrote", ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
