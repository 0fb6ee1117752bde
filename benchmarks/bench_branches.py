"""Branch-merge attention (posenc.attention with a BranchedRoPE) per backend, against plain
RoPE attention on SDPA: forward time, one process, median of ``--repeats`` after one warm-up
call (FlexAttention compiles there).

Run from the repository root: ``python benchmarks/bench_branches.py`` (``--help`` for options;
``--device cuda --out FILE`` is the GPU script's step, writing the table as Markdown).
CPU measurements on a shared machine are noisy: compare the rows of one run only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import posenc
from posenc.encodings import RoPE, branched


def _time(fn, repeats: int, device: torch.device) -> float:
    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="branch-merge attention per backend vs plain RoPE SDPA")
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--method", default="self_extend")
    parser.add_argument("--params", default="group_size=8,neighbor_window=256",
                        help="the method's parameters, name=int pairs")
    parser.add_argument("--backends", default="eager,sdpa,blocked,flex")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default=None, help="also write the table as Markdown to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backends = args.backends.split(",")
    params = {key: int(value) for key, value in (pair.split("=") for pair in args.params.split(",") if pair)}
    rope = RoPE(args.head_dim)
    encoding = branched(rope, args.method, **params)
    title = (f"{args.method} {params}, H={args.heads}, H_kv={args.kv_heads}, D={args.head_dim}, B=1, {device.type}, "
             f"{args.threads} thread(s), median of {args.repeats}; seconds (ratio to plain RoPE on sdpa)")
    print(title)
    print(f"{'T':>6} {'rope/sdpa':>10} " + " ".join(f"{b:>16}" for b in backends))
    rows = []
    for length in (int(t) for t in args.lengths.split(",")):
        q = torch.randn(1, args.heads, length, args.head_dim, device=device)
        k, v = (torch.randn(1, args.kv_heads, length, args.head_dim, device=device) for _ in range(2))
        with torch.no_grad():
            base = _time(lambda q=q, k=k, v=v: posenc.attention(q, k, v, rope, backend="sdpa"), args.repeats, device)
            cells = []
            for backend in backends:
                try:
                    seconds = _time(lambda q=q, k=k, v=v, b=backend: posenc.attention(q, k, v, encoding, backend=b),
                                    args.repeats, device)
                    cells.append(f"{seconds:8.4f} ({seconds / base:4.1f}x)")
                except Exception as error:  # a backend this device lacks: recorded, the others still run
                    cells.append(f"{type(error).__name__}")
        print(f"{length:>6} {base:>10.4f} " + " ".join(f"{c:>16}" for c in cells))
        rows.append(f"| {length} | {base:.4f} | " + " | ".join(cells) + " |")
        if args.out:  # rewritten after every length: a run cut short keeps the lengths it finished
            header = "| T | rope on sdpa (s) | " + " | ".join(backends) + " |"
            rule = "|" + "---|" * (len(backends) + 2)
            Path(args.out).write_text("\n".join([title, "", header, rule, *rows]) + "\n")

if __name__ == "__main__":
    main()
