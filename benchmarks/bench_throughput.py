"""LM training tokens/s per encoding, as a ratio to NoPE.

Run from the repository root: ``python benchmarks/bench_throughput.py`` (``--help`` for options). The same
tables come from ``posenc bench``; this script exposes every knob.
"""

from __future__ import annotations

import argparse

from posenc.bench import THROUGHPUT_COLUMNS, print_table, throughput_benchmark


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="LM training tokens/s per encoding vs NoPE")
    parser.add_argument("--encodings", default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rows, notes = throughput_benchmark(tuple(args.encodings.split(",")) if args.encodings else None,
                                       steps=args.steps, repeats=args.repeats)
    print_table("LM training throughput", rows, THROUGHPUT_COLUMNS, notes)


if __name__ == "__main__":
    main()
