"""Causal attention per score-bias encoding and backend against bias-free SDPA (a subprocess per configuration).

Run from the repository root: ``python benchmarks/bench_attention.py`` (``--help`` for options). The same
tables come from ``posenc bench``; this script exposes every knob.
"""

from __future__ import annotations

import argparse

from posenc.bench import ATTENTION_COLUMNS, attention_benchmark, print_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="score-bias attention vs bias-free causal SDPA (subprocess per config)")
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--encodings", default=None)
    parser.add_argument("--backends", default="blocked,sdpa")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    rows, notes = attention_benchmark(
        tuple(int(t) for t in args.lengths.split(",")),
        tuple(args.encodings.split(",")) if args.encodings else None,
        tuple(args.backends.split(",")), repeats=args.repeats, threads=args.threads,
    )
    print_table(f"causal attention, H=8, D=64, fp32, {args.threads} thread(s)", rows, ATTENTION_COLUMNS, notes)


if __name__ == "__main__":
    main()
