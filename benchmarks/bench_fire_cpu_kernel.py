"""FIRE's attention forward on the CPU against bias-free causal SDPA: the fused CPU kernel
(``posenc.kernels.build_cpu_fire()``) and the blocked backend's tiles (the kernel switched off),
in the same process, interleaved call by call, medians of the measuring thread's CPU time and of
wall-clock time (docs/results.md, "CPU attention hot paths (issue 24)").

Run from the repository root: ``python benchmarks/bench_fire_cpu_kernel.py`` (H = 8, D = 64,
float32, batch 1, one torch thread, FIRE at its default initialisation, forward under
``torch.no_grad()``; ``--lengths 2048,4096,8192 --repeats 7,5,3`` by default).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import posenc
from posenc import kernels
from posenc.lab.bench.timing import cpu_and_wall_medians, with_cpu_kernels


def _tiles(fn):
    """fn with the fused kernel switched off: the blocked backend's tiles."""
    return with_cpu_kernels(fn, False)


def measure(length: int, repeats: int, heads: int = 8, head_dim: int = 64) -> dict:
    torch.manual_seed(0)
    fire = posenc.create("fire", num_heads=heads)
    q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))

    def fused():
        return posenc.attention(q, k, v, encoding=fire, causal=True, backend="blocked")

    calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), "fused": fused,
             "tiles": _tiles(fused)}
    with torch.no_grad():
        outputs = {name: fn() for name, fn in calls.items()}  # the outputs compared
        timed = cpu_and_wall_medians(calls, repeats)
    row = {"T": length, "diff fused-tiles": float((outputs["fused"] - outputs["tiles"]).abs().max())}
    for name in calls:
        row[f"{name} cpu s"], row[f"{name} wall s"] = timed[name]
    for name in ("fused", "tiles"):
        row[f"{name}/sdpa cpu"] = row[f"{name} cpu s"] / row["sdpa cpu s"]
        row[f"{name}/sdpa wall"] = row[f"{name} wall s"] / row["sdpa wall s"]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--repeats", default="7,5,3", help="one count, or one per length")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not kernels.build_cpu_fire():
        raise SystemExit("the fused CPU kernel does not build here")
    lengths = [int(t) for t in args.lengths.split(",")]
    repeats = [int(r) for r in args.repeats.split(",")]
    repeats = repeats * len(lengths) if len(repeats) == 1 else repeats
    print("| T | SDPA cpu s | fused / SDPA cpu | wall | tiles / SDPA cpu | wall | max |fused - tiles| |")
    print("|---|---|---|---|---|---|---|")
    for length, count in zip(lengths, repeats):
        r = measure(length, count)
        print(f"| {length} | {r['sdpa cpu s']:.3f} | **{r['fused/sdpa cpu']:.2f}** | {r['fused/sdpa wall']:.2f} | "
              f"{r['tiles/sdpa cpu']:.2f} | {r['tiles/sdpa wall']:.2f} | {r['diff fused-tiles']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
