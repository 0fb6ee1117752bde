"""How often FlexAttention compiles when only the sequence length changes: static shapes,
``dynamic=True`` (what posenc's flex backend does), and static shapes with every length padded
up to a bucket (the next power of two; padded keys masked, padded queries dropped).

Counts torch.compile's graphs (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``) over
a sweep of lengths, with the time of each call (a compile shows as seconds). ALiBi's score_mod,
causal block masks (made uncompiled, the same in every mode: only the attention kernel is
compared), B=1, H=4, D=16, fp32, on whatever device is asked.

Run from the repository root: ``python benchmarks/flex_recompiles.py [--device cuda] [--lengths ...]``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import posenc


def bucket(length: int) -> int:
    return max(256, 1 << (length - 1).bit_length())


def sweep(mode: str, lengths: list[int], device: str) -> list[dict]:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(flex_attention, dynamic=(mode == "dynamic"))
    alibi = posenc.create("alibi", num_heads=4).to(device)
    rows = []
    for length in lengths:
        size = bucket(length) if mode == "buckets" else length
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(1, 4, length, 16, generator=g).to(device) for _ in range(3))
        positions = torch.arange(size, device=device)
        real = torch.tensor(length, device=device)  # a tensor: the compiled kernel must not specialize on it
        if size != length:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, size - length)) for t in (q, k, v))

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (kv_idx < real)

        block_mask = create_block_mask(mask_mod, None, None, size, size, device=device)
        start = time.perf_counter()
        out = compiled(q, k, v, score_mod=alibi.score_mod(positions, positions), block_mask=block_mask)[:, :, :length]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        expected = posenc.attention(q[:, :, :length], k[:, :, :length], v[:, :, :length], alibi, backend="blocked")
        rows.append({"mode": mode, "length": length, "padded_to": size, "seconds": round(seconds, 3),
                     "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
                     "max_abs_error": float((out - expected).abs().max())})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FlexAttention recompiles per length: static, dynamic=True, buckets")
    parser.add_argument("--lengths", default="200,300,333,500,777,1000,1500")
    parser.add_argument("--modes", default="static,dynamic,buckets")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch._dynamo.config.cache_size_limit = 64
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = [row for mode in args.modes.split(",") for row in sweep(mode, lengths, args.device)]
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
