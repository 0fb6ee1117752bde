"""LM training tokens/s per encoding, as a ratio to NoPE.

Run from the repository root: ``python benchmarks/bench_throughput.py`` (``--help`` for options). The same
tables come from ``posenc bench``; this script exposes every knob. ``--device cuda`` trains at the
GPU size (``posenc.lab.bench.DEVICE_THROUGHPUT``, bf16 autocast) and writes the table to ``--out``.
"""

from __future__ import annotations

import argparse

from posenc.lab.bench import DEVICE_THROUGHPUT, THROUGHPUT_COLUMNS, environment, print_table, throughput_benchmark, write_tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="LM training tokens/s per encoding vs NoPE")
    parser.add_argument("--encodings", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="e.g. cuda: the GPU size, bf16 autocast, tables to --out")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model")
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args(argv)
    encodings = tuple(args.encodings.split(",")) if args.encodings else None
    if args.device is None:
        rows, notes = throughput_benchmark(encodings, steps=args.steps or 5, repeats=args.repeats)
        print_table("LM training throughput", rows, THROUGHPUT_COLUMNS, notes)
        return
    import torch

    cuda = torch.device(args.device).type == "cuda"
    sizes = {**DEVICE_THROUGHPUT, "repeats": args.repeats, **({"steps": args.steps} if args.steps else {})}
    rows, notes = throughput_benchmark(encodings, device=args.device, autocast="bfloat16" if cuda else None,
                                       compile=args.compile, **sizes)
    print_table(f"LM training throughput on {args.device}", rows, THROUGHPUT_COLUMNS, notes)
    paths = write_tables(args.out, f"throughput-{torch.device(args.device).type}", rows, THROUGHPUT_COLUMNS, notes,
                         {**environment(), "device": args.device})
    print("wrote", ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
