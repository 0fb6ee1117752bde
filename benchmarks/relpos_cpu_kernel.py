"""Shaw and Transformer-XL on the CPU with and without the fused kernel (posenc.kernels.relpos_cpu),
in one process, interleaved call by call: LM training throughput against NoPE at `posenc bench
throughput`'s default size, and one attention call forward+backward against SDPA.

    PYTHONPATH=src python benchmarks/relpos_cpu_kernel.py [--repeats 9] [--calls 31]

Medians of the measuring thread's CPU time (the machine may be shared) and of wall time. The
numbers go in docs/results.md, "CPU attention hot paths (issue 24)".
"""

from __future__ import annotations

import argparse

import torch

import posenc
from posenc import kernels
from posenc.lab.bench.timing import cpu_and_wall_medians, with_cpu_kernels
from posenc.lab.model import LMConfig, TransformerLM

medians = cpu_and_wall_medians


def switched(fn, on: bool):
    return with_cpu_kernels(fn, on)


def training(repeats: int, steps: int = 5, batch: int = 32, length: int = 64) -> None:
    config = LMConfig(d_model=64, num_layers=4, num_heads=4, max_positions=1024)
    tokens = torch.randint(0, config.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(0))
    fns = {}
    for name, variants in (("nope", (None,)), ("shaw", (False, True)), ("transformer_xl", (False, True))):
        for on in variants:
            torch.manual_seed(0)
            model = TransformerLM(config, name)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def train(model=model, optimizer=optimizer):
                for _ in range(steps):
                    logits = model(tokens[:, :-1])
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()

            label = name if on is None else f"{name}, kernel {'on' if on else 'off'}"
            fns[label] = switched(train, bool(on))
    times = medians(fns, repeats)
    base_cpu, base_wall = times["nope"]
    print(f"| model | tokens/s (CPU time) | x nope | wall x nope |  (medians of {repeats}, {steps} steps each)")
    for label, (c, w) in times.items():
        print(f"| {label} | {batch * length * steps / c:.0f} | {base_cpu / c:.2f} | {base_wall / w:.2f} |")


def one_call(calls: int, batch: int = 32, heads: int = 4, length: int = 64, dim: int = 16) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, 3 * heads * dim, generator=g)
    grad = torch.randn(batch, heads, length, dim, generator=g)
    shaw = posenc.create("shaw", head_dim=dim)
    txl = posenc.create("transformer_xl", d_model=heads * dim, num_heads=heads, head_dim=dim)

    def call(encoding, backend):
        def run():
            leaf = x.clone().requires_grad_()
            q, k, v = (t.view(batch, length, heads, dim).transpose(1, 2) for t in leaf.split(heads * dim, -1))
            if backend == "sdpa":
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = posenc.attention(q, k, v, encoding, backend=backend)
            out.backward(grad)
        return run

    fns = {"sdpa": call(None, "sdpa"), "posenc.attention, no encoding (sdpa)": call(None, "auto"),
           "eager, no term": call(None, "eager")}
    for label, enc in (("shaw", shaw), ("transformer_xl", txl)):
        fns[f"{label}, kernel off"] = switched(call(enc, "eager"), False)
        fns[f"{label}, kernel on"] = switched(call(enc, "eager"), True)
    times = medians(fns, calls)
    print(f"| call (B={batch}, H={heads}, T={length}, D={dim}) | fwd+bwd ms (CPU) | wall ms |  (medians of {calls})")
    for label, (c, w) in times.items():
        print(f"| {label} | {c * 1e3:.2f} | {w * 1e3:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=31)
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not kernels.build_cpu_relpos():
        raise SystemExit("the kernel does not build here")
    one_call(args.calls)
    if not args.skip_training:
        training(args.repeats)


if __name__ == "__main__":
    main()
