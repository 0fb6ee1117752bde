"""Training memory at long lengths (issues 22 and 38): peak memory and time of one causal
attention forward + backward with a trainable bias or relative encoding (T5, Kerple, FIRE, FoX,
Shaw, Transformer-XL) on the backend ``auto`` picks (or ``--backend``), beside SDPA without a
bias (torch's flash kernel), in the same run; the fused CPU kernels on or off
(``--cpu-kernel``, the environment variable ``POSENC_CPU_KERNEL`` of each row's process).

Run from the repository root: ``python benchmarks/bench_training_memory.py`` (``--help``).
Each row runs in a fresh subprocess, so that its peak resident memory (``ru_maxrss``, or
Linux's VmHWM reset before the call) is its own: tracemalloc does not see torch's allocations.
Shapes: B = 1, H = 8, D = 64, float32, q, k, v and the encoding's parameters requiring grad
(FoX: its gates from a hidden state x (1, T, H D) through its gate projection, which is timed
with it). One call of 128 tokens first (lazy imports, one-time set-up), then the timed call.

Columns: ``peak MiB`` the process's peak resident memory (torch and the inputs included),
``growth MiB`` the peak minus the resident memory just before the call (what the call
itself added), ``seconds`` the median of the timed calls, and the three ratios to SDPA at
the same length. Goal (issue 22 item 7): peak within 2x SDPA's, time within 3x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENCODINGS = ("t5", "kerple", "fire", "fox", "shaw", "transformer_xl")


def worker(config: dict) -> dict:
    """One configuration in this (fresh) process: forward + backward, time and memory."""
    import resource

    import torch
    import torch.nn.functional as F

    from posenc import attention, create_for_model
    from posenc.lab.bench.timing import _reset_peak_rss, _rss_kib

    torch.set_num_threads(config["threads"])
    heads, length, head_dim = config["heads"], config["length"], config["head_dim"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=g).requires_grad_() for _ in range(3))
    x = torch.randn(1, length, heads * head_dim, generator=g)
    encoding = None
    if config["encoding"] != "none":
        encoding = create_for_model(config["encoding"], d_model=heads * head_dim, num_heads=heads,
                                    head_dim=head_dim, max_positions=length, causal=True)

    def step(n: int) -> None:
        """Forward and backward on the first n tokens."""
        qn, kn, vn = (t[:, :, :n] for t in (q, k, v))
        if encoding is None:
            out = F.scaled_dot_product_attention(qn, kn, vn, is_causal=True)
        else:
            gates = encoding.gate(x[:, :n]) if "gate" in encoding.hooks else None
            out = attention(qn, kn, vn, encoding, causal=True, backend=config["backend"], gates=gates)
        out.backward(torch.ones_like(out))

    step(min(128, length))
    peak_reset = _reset_peak_rss()
    before = _rss_kib("VmRSS") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(config["repeats"]):
        start = time.perf_counter()
        step(length)
        times.append(time.perf_counter() - start)
    peak = _rss_kib("VmHWM") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": statistics.median(times), "peak_mib": peak / 1024, "growth_mib": (peak - before) / 1024}


def run_worker(config: dict, timeout: float) -> dict:
    env = dict(os.environ)
    if config.get("cpu_kernel") in ("0", "1"):
        env["POSENC_CPU_KERNEL"] = config["cpu_kernel"]
    elif config.get("cpu_kernel") == "default":
        env.pop("POSENC_CPU_KERNEL", None)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)], check=False, capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = ["| T | bias | backend | peak MiB | growth MiB | seconds | peak / SDPA | growth / SDPA | time / SDPA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['length']} | {r['encoding']} | {r['backend']} | {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['length']} | {r['encoding']} | {r['backend']} | {r['peak_mib']:.0f} | {r['growth_mib']:.0f} "
                     f"| {r['seconds']:.2f} | {r.get('peak_ratio', 1):.2f} | {r.get('growth_ratio', 1):.2f} "
                     f"| {r.get('time_ratio', 1):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--cpu-kernel", default="default", choices=("default", "0", "1"),
                        help="POSENC_CPU_KERNEL for the rows' processes: 1 on, 0 off, default: unset")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per row (the median is reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per row before it is reported as such")
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    rows = []
    for length in (int(t) for t in args.lengths.split(",")):
        base = {"heads": args.heads, "head_dim": args.head_dim, "length": length, "repeats": args.repeats,
                "threads": args.threads}
        baseline = {"length": length, "encoding": "none", "backend": "sdpa",
                    **run_worker({**base, "encoding": "none", "backend": "sdpa"}, args.timeout)}
        rows.append(baseline)
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        for name in args.encodings.split(","):
            label = args.backend + {"1": ", kernels on", "0": ", kernels off"}.get(args.cpu_kernel, "")
            result = {"length": length, "encoding": name, "backend": label,
                      **run_worker({**base, "encoding": name, "backend": args.backend,
                                    "cpu_kernel": args.cpu_kernel}, args.timeout)}
            if "error" not in result and "error" not in baseline:
                result["peak_ratio"] = result["peak_mib"] / baseline["peak_mib"]
                result["growth_ratio"] = result["growth_mib"] / max(baseline["growth_mib"], 1e-9)
                result["time_ratio"] = result["seconds"] / baseline["seconds"]
            rows.append(result)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n{platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads}\n")
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
