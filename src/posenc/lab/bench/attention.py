"""Causal attention per score-bias encoding and backend against bias-free SDPA: on the CPU, each
configuration in a fresh process (:func:`attention_benchmark`), and on a device, forward and
backward in this process (:func:`device_attention_benchmark`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posenc.encodings import REGISTRY, Hook, create_for_model
from posenc.lab.bench.timing import _Device, _measure, _reset_peak_rss, _rss_kib

def _attention_worker(config: dict) -> dict:
    """Run one configuration in this (fresh) process: time, and the peak memory of its first
    full-length call (after a 128-token warm-up call)."""
    import resource

    torch.set_num_threads(config["threads"])
    if "cpu_kernel" in config:  # an encoding with a fused CPU attention (FIRE, T5, ...): its row with it and without
        from posenc import kernels

        kernels.CPU_KERNEL_ENABLED = bool(config["cpu_kernel"])
        if config["cpu_kernel"] and not (kernels.build_cpu_fire() and kernels.build_cpu_relpos()):
            raise RuntimeError("the fused CPU kernel does not build here (no C++ compiler or ninja)")
    heads, length, head_dim = config["heads"], config["length"], config["head_dim"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=g) for _ in range(3))
    encoding = None
    if config["encoding"] != "none":
        encoding = create_for_model(config["encoding"], d_model=heads * head_dim, num_heads=heads,
                                    head_dim=head_dim, max_positions=length, causal=True)
    from posenc.attention import attention

    def run(q=q, k=k, v=v):
        with torch.no_grad():
            if encoding is None:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return attention(q, k, v, encoding, causal=True, backend=config["backend"])

    # One call on 128 tokens first: lazy imports and one-time set-up are not the call's cost.
    warm = min(128, length)
    run(q[:, :, :warm], k[:, :, :warm], v[:, :, :warm])

    peak_reset = _reset_peak_rss()
    before = _rss_kib("VmRSS") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    after = _rss_kib("VmHWM") if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra_mb = (after - before) / 1024  # Linux: KiB
    times = [first] if config["backend"] != "flex" else []  # flex's first call compiles
    for _ in range(config["repeats"]):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "extra_mb": extra_mb}


def _run_worker(config: dict) -> dict:
    code = ("import json,sys; from posenc.lab.bench.attention import _attention_worker; "
            "print(json.dumps(_attention_worker(json.loads(sys.argv[1]))))")
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])  # the folder that holds this posenc package
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def attention_benchmark(
    lengths: tuple[int, ...] = (1024, 2048, 4096, 8192),
    encodings: tuple[str, ...] | None = None,
    backends: tuple[str, ...] = ("blocked", "sdpa"),
    heads: int = 8,
    head_dim: int = 64,
    repeats: int = 2,
    threads: int = 1,
) -> tuple[list[dict], list[str]]:
    """Causal attention per score-bias encoding and backend vs bias-free causal SDPA, fp32.

    ``encodings`` default: every registered encoding with the ``score_bias`` hook.
    Returns rows ``{"length", "encoding", "backend", "seconds", "extra_mb", "time_ratio",
    "memory_ratio"}`` (ratios to the baseline at the same length) and notes.
    """
    if encodings is None:
        encodings = tuple(name for name, cls in REGISTRY.items() if Hook.SCORE_BIAS in cls.hooks)
    notes = ["'sdpa' materializes the (H, T, T) bias; 'blocked' and 'flex' do not"]
    rows = []
    for length in lengths:
        base = dict(heads=heads, head_dim=head_dim, length=length, repeats=repeats, threads=threads)
        baseline = _run_worker({**base, "encoding": "none", "backend": "sdpa"})
        rows.append({"length": length, "encoding": "none (bias-free SDPA)", "backend": "sdpa", **baseline,
                     "time_ratio": 1.0, "memory_ratio": 1.0})
        for name in encodings:
            fused = hasattr(REGISTRY.get(name), "fused_attention")  # an unknown name: its worker says so
            for backend in backends:
                kernel_rows = (False, True) if fused and backend == "blocked" else (None,)
                for kernel in kernel_rows:
                    config = {**base, "encoding": name, "backend": backend}
                    if kernel is not None:
                        config["cpu_kernel"] = kernel
                    result = _run_worker(config)
                    if "error" not in result and "error" not in baseline:
                        result["time_ratio"] = result["seconds"] / baseline["seconds"]
                        result["memory_ratio"] = result["extra_mb"] / max(baseline["extra_mb"], 1e-9)
                    label = backend + (" + fused CPU kernel" if kernel else "")
                    rows.append({"length": length, "encoding": name, "backend": label, **result})
    if any(hasattr(REGISTRY.get(name), "fused_attention") for name in encodings):
        notes.append("'blocked + fused CPU kernel': the encoding's bias computed inside the attention "
                     "(FIRE: posenc.kernels.fire_cpu; T5, ALiBi, Kerple, FoX: posenc.kernels.relpos_cpu); "
                     "plain 'blocked' rows have the kernels switched off")
    return rows, notes



# --- attention on a device: time and peak memory, forward and backward, in one process ------

#: Shapes of ``posenc bench attention --device cuda`` (FlexAttention's published setting: 16
#: heads of 64, bf16, causal), with the batch shrinking as T grows so that every length
#: attends the same number of query tokens.
DEVICE_ATTENTION = dict(lengths=(2048, 8192, 32768), heads=16, head_dim=64, tokens=65536, dtype="bfloat16")


def _fa2_alibi(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """FlashAttention-2's own ALiBi on the same tensors ((B, T, H, D) views), or None without flash-attn."""
    from posenc.attention import flash_attention_2

    func = flash_attention_2.flash_attn_func()
    if func is None:
        return None
    kwargs = flash_attention_2.flash_attn_arguments(q, k, v, slopes=slopes, causal=True, scale=q.shape[-1] ** -0.5)
    return lambda: func(**kwargs)


def flex_reference_alibi(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> Callable[[], torch.Tensor]:
    """FlexAttention's own causal ALiBi, as its examples write it (a score_mod on the indices,
    ``score - slopes[h] * (q_idx - kv_idx)``), compiled for static shapes with a causal block
    mask made once: the floor a FlexAttention score bias can reach on this device, against
    which posenc's flex row (positions looked up in tensors, one dynamic-shape kernel for every
    length) is read. q, k, v (B, H, T, D); slopes (H,)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    length = q.shape[-2]
    block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, length, length, device=q.device)
    compiled = torch.compile(flex_attention, dynamic=False)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)


def device_attention_benchmark(
    device: str = "cuda",
    lengths: tuple[int, ...] = DEVICE_ATTENTION["lengths"],
    encodings: tuple[str, ...] | None = None,
    backends: tuple[str, ...] = ("flex", "auto"),
    heads: int = DEVICE_ATTENTION["heads"],
    head_dim: int = DEVICE_ATTENTION["head_dim"],
    tokens: int = DEVICE_ATTENTION["tokens"],
    dtype: str = DEVICE_ATTENTION["dtype"],
    repeats: int = 10,
    backward: bool = True,
    progress: Callable[[list[dict]], None] | None = None,
) -> tuple[list[dict], list[str]]:
    """Causal attention per score-bias encoding and backend against bias-free SDPA (torch's
    flash kernel on CUDA) and FlashAttention-2's own ALiBi, on one device, in this process:
    forward and forward+backward time, peak memory of one forward+backward, and each as a
    ratio to bias-free SDPA at the same length.

    Batch B = max(1, tokens // T); inputs (B, H, T, D) in ``dtype`` requiring grad (and the
    encoding's parameters). ``encodings`` default: every registered ``score_bias`` encoding.

    Returns rows ``{"length", "batch", "encoding", "backend", "fwd_ms", "fwd_bwd_ms",
    "peak_mb", "fwd_ratio", "fwd_bwd_ratio", "memory_ratio"}`` (and ``error`` / ``bwd_error``
    where a configuration cannot run: out of memory, a backend without a backward here) and notes.
    ``progress``, if given, is called with every row measured so far after each row (ratios
    filled in once a length's baseline is known), so that a run cut short keeps its rows.
    """
    from posenc.attention import attention

    if encodings is None:
        encodings = tuple(name for name, cls in REGISTRY.items() if Hook.SCORE_BIAS in cls.hooks)
    dev = _Device(device)
    torch_dtype = getattr(torch, dtype)
    notes = [f"causal, {dtype}, H={heads}, D={head_dim}, B = max(1, {tokens} // T); medians of {repeats}; "
             "peak_mb = peak allocated during one forward+backward above what was allocated before"
             + ("" if dev.cuda else " (CPU: peak RSS, coarse)")]
    rows = []
    for length in lengths:
        batch = max(1, tokens // length)
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g).to(dev.device, torch_dtype).requires_grad_()
                   for _ in range(3))

        def base_row(encoding: str, backend: str, forward, leaves) -> dict:
            row = {"length": length, "batch": batch, "encoding": encoding, "backend": backend,
                   **_measure(forward, leaves, dev, repeats, backward)}
            if progress is not None:
                _add_ratios([row], baseline if length_rows else row)
                progress(rows + length_rows + [row])
            return row

        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        length_rows: list[dict] = []
        baseline = base_row("none (bias-free SDPA)", "sdpa", sdpa, [q, k, v])
        length_rows.append(baseline)
        alibi = create_for_model("alibi", d_model=heads * head_dim, num_heads=heads, head_dim=head_dim,
                                 max_positions=length).to(dev.device)
        fa2 = _fa2_alibi(q, k, v, alibi.slopes)
        if fa2 is None:
            if length == lengths[0]:
                notes.append("flash-attn not installed: FlashAttention-2's ALiBi row skipped (pip install flash-attn)")
        else:
            length_rows.append(base_row("alibi (FlashAttention-2 native)", "flash_attn", fa2, [q, k, v]))
        if dev.cuda:  # torch's CPU FlexAttention has no backward: the reference row is for GPUs
            reference = flex_reference_alibi(q, k, v, alibi.slopes)
            length_rows.append(base_row("alibi (FlexAttention's own score_mod, static shapes)", "flex reference",
                                        reference, [q, k, v]))
        for name in encodings:
            encoding = create_for_model(name, d_model=heads * head_dim, num_heads=heads, head_dim=head_dim,
                                        max_positions=length, causal=True).to(dev.device)
            for backend in backends:
                forward = (lambda enc=encoding, b=backend: attention(q, k, v, enc, causal=True, backend=b))
                length_rows.append(base_row(name, backend, forward, [q, k, v, *encoding.parameters()]))
        _add_ratios(length_rows, baseline)
        rows += length_rows
        del q, k, v
        dev.empty()
    return rows, notes


def _add_ratios(rows: list[dict], baseline: dict) -> None:
    """Each row's time and memory as a ratio to the baseline row's (bias-free SDPA), in place."""
    for row in rows:
        for key, ratio in (("fwd_ms", "fwd_ratio"), ("fwd_bwd_ms", "fwd_bwd_ratio"), ("peak_mb", "memory_ratio")):
            if key in row and baseline.get(key):
                row[ratio] = row[key] / baseline[key]


DEVICE_ATTENTION_COLUMNS = [
    ("length", "T", "d"), ("batch", "B", "d"), ("encoding", "encoding", ""), ("backend", "backend", ""),
    ("fwd_ms", "fwd ms", ".2f"), ("fwd_bwd_ms", "fwd+bwd ms", ".2f"), ("peak_mb", "peak MB", ".0f"),
    ("fwd_ratio", "fwd / SDPA", ".2f"), ("fwd_bwd_ratio", "fwd+bwd / SDPA", ".2f"), ("memory_ratio", "memory / SDPA", ".2f"),
]

ATTENTION_COLUMNS = [("length", "T", "d"), ("encoding", "encoding", ""), ("backend", "backend", ""),
                     ("seconds", "s", ".3f"), ("extra_mb", "extra MB", ".0f"), ("time_ratio", "time / SDPA", ".2f"),
                     ("memory_ratio", "memory / SDPA", ".2f")]

