"""RoPE apply on q and k against a plain copy and the peers (one process, ratios).

Run from the repository root: ``python benchmarks/bench_rope.py`` (``--help`` for options). The same
CPU tables come from ``posenc bench``; this script exposes every knob.

``--device cuda`` runs the accelerator comparison instead (``posenc.lab.bench.rope_device_benchmark``):
posenc's fused Triton kernel against Hugging Face's ``apply_rotary_pos_emb`` (eager and
``torch.compile``), Liger-Kernel's ``liger_rotary_pos_emb`` and flash-attn's
``apply_rotary_emb`` where they import, and a copy of q and k (the bandwidth floor), forward and
forward+backward, at Liger's published shape (bf16, T = 2048 and 16384, 32 q / 8 kv heads,
head_dim 128). ``--out FILE.md`` writes the table (and FILE.json). On a GPU::

    pip install -e '.[gpu,bench]' liger-kernel flash-attn   # the peers that install
    python benchmarks/bench_rope.py --device cuda --out docs/results/rope_cuda.md

``--shape 1,32,2048,128 8,32,4096,128 --no-peers`` is the CPU hot-path table of issue 24 (ratios to
a clone and to ``copy_`` of the same tensors; the peers take seconds per call at the larger shape):
posenc's ``apply_rotary`` on the fused CPU kernel (built first: ``posenc.kernels.build_cpu_rotary``;
``--no-cpu-kernel`` leaves it unbuilt), the same call on the eager torch path,
``torch.compile(apply_rotary)`` (``--no-compile`` skips it) and Hugging Face's formula inline.

``--device cpu --lengths 64 --heads 4,2 --head-dim 16 --no-compile`` is a smoke run of the same harness.
"""

from __future__ import annotations

import argparse

from posenc.lab.bench import ROPE_COLUMNS, ROPE_DEVICE_COLUMNS, print_table, rope_benchmark, rope_device_benchmark, write_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="RoPE apply vs copy and peers (one process, ratios)")
    parser.add_argument("--shape", nargs="+", default=["1,32,2048,128"], help="CPU table: B,H,T,D (several: one table each)")
    parser.add_argument("--no-peers", action="store_true", help="CPU table: skip transformers and rotary-embedding-torch")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="CPU table: dtypes")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per method (default 7 on CPU, 50 with --device)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="run the accelerator comparison on this device (cuda; cpu for a smoke run)")
    parser.add_argument("--lengths", default="2048,16384", help="--device: sequence lengths T")
    parser.add_argument("--batch", type=int, default=1, help="--device: batch size")
    parser.add_argument("--heads", default="32,8", help="--device: query heads,key-value heads")
    parser.add_argument("--head-dim", type=int, default=128, help="--device: head_dim")
    parser.add_argument("--dtype", default="bfloat16", help="--device: activation dtype")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip torch.compile (of posenc's formula on the CPU table, of Hugging Face's with --device)")
    parser.add_argument("--no-cpu-kernel", action="store_true", help="CPU table: do not build posenc's fused CPU kernel")
    parser.add_argument("--out", default=None, help="--device: write the table to this Markdown file (and .json beside it)")
    args = parser.parse_args(argv)
    if args.device is None:
        for text in args.shape:
            shape = tuple(int(s) for s in text.split(","))
            rows, notes = rope_benchmark(shape, tuple(args.dtypes.split(",")), args.repeats or 7, args.threads,
                                         peers=not args.no_peers, compile_peers=not args.no_compile,
                                         cpu_kernel=not args.no_cpu_kernel)
            print_table(f"RoPE on q and k {shape}, {args.threads} thread(s)", rows, ROPE_COLUMNS, notes)
        return
    import torch

    torch.set_num_threads(args.threads)
    q_heads, kv_heads = (int(s) for s in args.heads.split(","))
    lengths = tuple(int(s) for s in args.lengths.split(","))
    rows, notes = rope_device_benchmark(
        args.device, lengths, args.batch, q_heads, kv_heads, args.head_dim, args.dtype, args.repeats or 50,
        compile_peers=not args.no_compile,
    )
    title = f"RoPE apply on q and k, {args.device}, {args.dtype}, {q_heads}/{kv_heads} heads, head_dim {args.head_dim}"
    print_table(title, rows, ROPE_DEVICE_COLUMNS, notes)
    if args.out:
        write_table(args.out, title, rows, ROPE_DEVICE_COLUMNS, notes)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
