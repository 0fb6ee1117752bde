"""RoPE apply on q and k against a plain copy and the peers (one process, ratios).

Run from the repository root: ``python benchmarks/bench_rope.py`` (``--help`` for options). The same
tables come from ``posenc bench``; this script exposes every knob.
"""

from __future__ import annotations

import argparse

from posenc.bench import ROPE_COLUMNS, print_table, rope_benchmark


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="RoPE apply vs copy and peers (one process, ratios)")
    parser.add_argument("--shape", default="1,32,2048,128")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    rows, notes = rope_benchmark(shape, tuple(args.dtypes.split(",")), args.repeats, args.threads)
    print_table(f"RoPE on q and k {shape}, {args.threads} thread(s)", rows, ROPE_COLUMNS, notes)


if __name__ == "__main__":
    main()
