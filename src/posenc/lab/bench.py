"""Speed and memory benchmarks: posenc side by side with its baselines, in one process, as ratios.

``rope_benchmark`` times RoPE apply on q and k against a plain copy, Hugging Face's
``apply_rotary_pos_emb`` (imported when transformers is installed, and always an inline
"HF-style eager formula" written from its definition) and rotary-embedding-torch.
``attention_benchmark`` times causal attention per score-bias encoding and backend against
bias-free causal SDPA, each configuration in a fresh subprocess so that its peak memory
(peak RSS during the first call minus RSS before it; ``ru_maxrss`` where the peak cannot be
reset) is its own. Peers that are not installed
are skipped with a note (``pip install posenc[bench]``).

Timings are medians of interleaved repeats; only the ratios within one run mean anything.
rich is imported when a table is printed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.encodings import REGISTRY, Hook, apply_rotary, create_for_model, encoding_class


def _median_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per function, the functions interleaved in every repeat (same conditions)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_candidates(q, k, cos, sin, notes: list[str]) -> dict[str, Callable[[], object]]:
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    cos_x, sin_x = cos.to(q.dtype), sin.to(q.dtype)  # Hugging Face casts the tables to x's dtype
    fns: dict[str, Callable[[], object]] = {
        "copy (clone: new tensors)": lambda: (q.clone(), k.clone()),
        "copy_ (into preallocated)": lambda: (out_q.copy_(q), out_k.copy_(k)),
        "posenc apply_rotary": lambda: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)),
        "posenc apply_rotary(out=)": lambda: (apply_rotary(q, cos, sin, out=out_q), apply_rotary(k, cos, sin, out=out_k)),
        "HF-style eager formula (inline)": lambda: (q * cos_x + _rotate_half(q) * sin_x, k * cos_x + _rotate_half(k) * sin_x),
    }
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        notes.append("transformers not installed: Hugging Face apply_rotary_pos_emb skipped (pip install posenc[bench])")
    else:
        fns["transformers apply_rotary_pos_emb"] = lambda: apply_rotary_pos_emb(q, k, cos_x[None], sin_x[None])  # (B, T, D), unsqueeze_dim=1
    try:
        from rotary_embedding_torch import RotaryEmbedding
    except ImportError:
        notes.append("rotary-embedding-torch not installed: skipped (pip install posenc[bench])")
    else:
        rot = RotaryEmbedding(dim=q.shape[-1])
        fns["rotary-embedding-torch"] = lambda: (rot.rotate_queries_or_keys(q), rot.rotate_queries_or_keys(k))
    return fns


def rope_benchmark(
    shape: tuple[int, int, int, int] = (1, 32, 2048, 128),
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    repeats: int = 7,
    threads: int | None = 1,
) -> tuple[list[dict], list[str]]:
    """Time RoPE on q and k of ``shape`` (B, H, T, D) per dtype.

    Returns rows ``{"dtype", "method", "ms", "vs_clone", "vs_copy_", "hf_over_this"}`` and notes.
    cos/sin come from ``posenc.create("rope")`` once (float32, as RoPE passes them).
    """
    from posenc.encodings import RoPE

    if threads:
        torch.set_num_threads(threads)
    notes: list[str] = []
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
        cos, sin = RoPE(shape[-1]).cos_sin(torch.arange(shape[2]), torch.float32)
        fns = _rope_candidates(q, k, cos, sin, notes if dtype_name == dtypes[0] else [])
        times = _median_times(fns, repeats)
        clone, copy_ = times["copy (clone: new tensors)"], times["copy_ (into preallocated)"]
        hf = times["HF-style eager formula (inline)"]
        for name, seconds in times.items():
            rows.append({
                "dtype": dtype_name, "method": name, "ms": seconds * 1e3,
                "vs_clone": seconds / clone, "vs_copy_": seconds / copy_, "hf_over_this": hf / seconds,
            })
    return rows, notes


# --- RoPE on an accelerator: the fused kernel against the field's kernels -------------------

#: Bytes zeroed between timed calls on CUDA so that q and k are not served from L2 (H100: 50 MB).
_L2_FLUSH_BYTES = 256 * 1024 * 1024

COPY_FLOOR = "copy q, k (bandwidth floor)"
HF_EAGER = "HF apply_rotary_pos_emb (eager)"


def _device_time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of fn. CUDA: CUDA events around each call, L2 flushed before it; CPU:
    perf_counter. One warm-up call first (compilation, autotuning, allocator)."""
    fn()
    if device.type != "cuda":
        return _median_times({"fn": fn}, repeats)["fn"]
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _peak_mb(fn: Callable[[], object], device: torch.device) -> float | None:
    """Extra CUDA memory at the peak of one call (MB); None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def _hf_tables(rope, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin (1, T, D) in the activation dtype, as Hugging Face's rotary module hands them over."""
    cos, sin = rope.cos_sin(positions, torch.float32)
    return cos.to(dtype)[None], sin.to(dtype)[None]


def _rope_device_candidates(q, k, q_bthd, k_bthd, positions, rope, compile_peers: bool, notes: list[str]):
    """name -> (forward fn returning outputs, the inputs to differentiate). q, k: (B, H, T, D)
    views of the (B, T, H, D) tensors q_bthd, k_bthd (Liger's benchmark layout)."""
    from posenc import kernels

    cos, sin = _hf_tables(rope, positions, q.dtype)
    fns: dict[str, tuple[Callable[[], tuple], tuple]] = {COPY_FLOOR: (lambda: (q.clone(), k.clone()), (q, k))}
    rotary = kernels.rotary_kernels() if kernels.use_triton(q, k) else None
    if rotary is not None:
        inv_freq = rope._inv_freq_f64.to(q.device)
        fns["posenc fused_rope (Triton, one launch)"] = (
            lambda: rotary.fused_rope(q, k, positions, positions, inv_freq), (q, k))
    else:
        notes.append(f"posenc's Triton kernel not used on {q.device.type} (CUDA with triton only: pip install posenc[gpu])")
    fns["posenc RoPE.rotate"] = (lambda: rope.rotate(q, k, positions, positions), (q, k))

    def torch_path():
        enabled, kernels.TRITON_ENABLED = kernels.TRITON_ENABLED, False
        try:
            return rope.rotate(q, k, positions, positions)
        finally:
            kernels.TRITON_ENABLED = enabled

    if rotary is not None:
        fns["posenc RoPE.rotate, torch path"] = (torch_path, (q, k))
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        notes.append("transformers not installed: Hugging Face apply_rotary_pos_emb skipped (pip install posenc[bench])")
    else:
        fns[HF_EAGER] = (lambda: apply_rotary_pos_emb(q, k, cos, sin), (q, k))
        if compile_peers:
            compiled = torch.compile(apply_rotary_pos_emb, dynamic=False)
            fns["torch.compile(HF apply_rotary_pos_emb)"] = (lambda: compiled(q, k, cos, sin), (q, k))
    if q.device.type == "cuda":
        try:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb
        except ImportError:
            notes.append("liger-kernel not installed: liger_rotary_pos_emb skipped")
        else:
            fns["Liger liger_rotary_pos_emb"] = (lambda: liger_rotary_pos_emb(q, k, cos, sin), (q, k))
        try:
            from flash_attn.layers.rotary import apply_rotary_emb
        except ImportError:
            notes.append("flash-attn not installed: apply_rotary_emb skipped")
        else:
            half = q.shape[-1] // 2
            cos_h, sin_h = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()  # (T, D/2), x's dtype
            fns["flash-attn apply_rotary_emb"] = (
                lambda: (apply_rotary_emb(q_bthd, cos_h, sin_h), apply_rotary_emb(k_bthd, cos_h, sin_h)), (q_bthd, k_bthd))
    else:
        notes.append("Liger and flash-attn run on CUDA only: skipped")
    return fns


def _max_error(outputs: tuple, expected: tuple[Tensor, Tensor], bthd: bool) -> float:
    """Largest |output - float64 formula| over q and k (outputs in (B, T, H, D) when bthd)."""
    worst = 0.0
    for out, ref in zip(outputs, expected):
        out = out.transpose(1, 2) if bthd else out
        worst = max(worst, float((out.double() - ref).abs().max()))
    return worst


def rope_device_benchmark(
    device: str = "cuda",
    lengths: tuple[int, ...] = (2048, 16384),
    batch: int = 1,
    q_heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    repeats: int = 50,
    compile_peers: bool = True,
) -> tuple[list[dict], list[str]]:
    """RoPE apply on q and k, forward and forward+backward, at Liger-Kernel's published shape.

    Liger's benchmark (benchmark/scripts/benchmark_rope.py): bf16, 32 query / 8 key-value
    heads, q and k made as (B, T, H, D) and transposed to (B, H, T, D), cos/sin precomputed
    by the rotary module (outside the timing). The peers get exactly that; posenc's fused
    kernel computes its angles, cos and sin inside the launch (included in its time), and
    ``RoPE.rotate`` is the user-level call (argument checks included). The floor is a copy of
    q and k (forward) and two copies (forward+backward: the backward reads and writes the
    gradients once more).

    Returns rows ``{"T", "mode", "method", "ms", "vs_copy", "copy_fraction", "hf_over_this",
    "peak_mb", "max_err"}``: time / the copy's, the copy's time / this (the fraction of the copy
    bandwidth reached), Hugging Face eager's time / this, the extra memory at the peak of one
    call (CUDA), and the forward's largest deviation from the float64 formula.

    Runs on any device; on the CPU the CUDA-only peers are skipped with a note (a smoke run
    at small sizes tests the harness).
    """
    from posenc.encodings import RoPE

    dev = torch.device(device)
    dt = getattr(torch, dtype)
    notes = [f"B={batch}, {q_heads} q heads / {kv_heads} kv heads, head_dim {head_dim}, {dtype}, on {device}; "
             f"median of {repeats}" + (", L2 flushed before each call" if dev.type == "cuda" else "")]
    rows = []
    rope = RoPE(head_dim)
    for length in lengths:
        g = torch.Generator(device=dev).manual_seed(0)
        q_bthd = torch.randn(batch, length, q_heads, head_dim, generator=g, device=dev, dtype=dt).requires_grad_(True)
        k_bthd = torch.randn(batch, length, kv_heads, head_dim, generator=g, device=dev, dtype=dt).requires_grad_(True)
        q, k = q_bthd.transpose(1, 2), k_bthd.transpose(1, 2)
        dq, dk = torch.randn_like(q), torch.randn_like(k)
        positions = torch.arange(length, device=dev)
        with torch.no_grad():
            angle = positions.double()[:, None] * rope._inv_freq_f64.to(dev)
            cos64, sin64 = (torch.cat((f(angle),) * 2, -1) for f in (torch.cos, torch.sin))
            expected = tuple(
                x.double() * cos64 + torch.cat((-x.double()[..., head_dim // 2:], x.double()[..., : head_dim // 2]), -1) * sin64
                for x in (q, k))
        fns = _rope_device_candidates(q, k, q_bthd, k_bthd, positions, rope, compile_peers, notes if length == lengths[0] else [])
        for mode in ("forward", "forward+backward"):
            results = {}
            for name, (fn, inputs) in fns.items():
                if mode == "forward":
                    def run(fn=fn):
                        with torch.no_grad():
                            return fn()
                elif name == COPY_FLOOR:
                    def run():
                        return q.clone(), k.clone(), dq.clone(), dk.clone()
                else:
                    grads = tuple(d.transpose(1, 2) if inp is not q and inp is not k else d for inp, d in zip(inputs, (dq, dk)))

                    def run(fn=fn, inputs=inputs, grads=grads):
                        return torch.autograd.grad(fn(), inputs, grads)
                try:
                    err = _max_error(run(), expected, inputs[0] is q_bthd) if mode == "forward" and name != COPY_FLOOR else None
                    results[name] = (_device_time(run, dev, repeats), _peak_mb(run, dev), err)
                except Exception as exc:  # a peer that fails here is reported, not fatal
                    notes.append(f"{name} ({mode}, T={length}) failed: {type(exc).__name__}: {exc}"[:300])
            copy = results.get(COPY_FLOOR, (None,))[0]
            hf = results.get(HF_EAGER, (None,))[0]
            for name, (seconds, peak, err) in results.items():
                rows.append({
                    "T": length, "mode": mode, "method": name, "ms": seconds * 1e3,
                    "vs_copy": seconds / copy if copy else None, "copy_fraction": copy / seconds if copy else None,
                    "hf_over_this": hf / seconds if hf else None, "peak_mb": peak, "max_err": err,
                })
        del q_bthd, k_bthd, q, k, dq, dk, expected, fns
    return rows, notes


ROPE_DEVICE_COLUMNS = [("T", "T", "d"), ("mode", "mode", ""), ("method", "method", ""), ("ms", "ms", ".3f"),
                       ("vs_copy", "x copy", ".2f"), ("copy_fraction", "copy / this", ".2f"),
                       ("hf_over_this", "HF eager / this", ".2f"), ("peak_mb", "peak MB", ".1f"),
                       ("max_err", "max err vs fp64", ".2e")]


def write_table(path, title: str, rows: list[dict], columns: list[tuple[str, str, str]], notes: list[str] = ()) -> None:
    """Write rows as a Markdown table (``path``) and as JSON next to it (same name, ``.json``)."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"## {title}", "", "| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = ["" if row.get(key) is None else format(row[key], fmt) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"- {note}" for note in notes]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps({"title": title, "rows": rows, "notes": list(notes)}, indent=1), encoding="utf-8")


# --- attention --------------------------------------------------------------------------

def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux: clear_refs 5), so the peak of one call can be
    read as VmHWM - VmRSS before it. Without it, ru_maxrss keeps the peak of the imports and
    setup, and a call that stays below that peak reads as using no memory at all."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return _rss_kib("VmHWM") is not None
    except OSError:
        return False


def _rss_kib(field: str) -> int | None:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _attention_worker(config: dict) -> dict:
    """Run one configuration in this (fresh) process: time, and the peak memory of its first
    full-length call (after a 128-token warm-up call)."""
    import resource

    torch.set_num_threads(config["threads"])
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
    code = "import json,sys; from posenc.lab.bench import _attention_worker; print(json.dumps(_attention_worker(json.loads(sys.argv[1]))))"
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
            for backend in backends:
                result = _run_worker({**base, "encoding": name, "backend": backend})
                if "error" not in result and "error" not in baseline:
                    result["time_ratio"] = result["seconds"] / baseline["seconds"]
                    result["memory_ratio"] = result["extra_mb"] / max(baseline["extra_mb"], 1e-9)
                rows.append({"length": length, "encoding": name, "backend": backend, **result})
    return rows, notes


# --- attention on a device: time and peak memory, forward and backward, in one process ------

#: Shapes of ``posenc bench attention --device cuda`` (FlexAttention's published setting: 16
#: heads of 64, bf16, causal), with the batch shrinking as T grows so that every length
#: attends the same number of query tokens.
DEVICE_ATTENTION = dict(lengths=(2048, 8192, 32768), heads=16, head_dim=64, tokens=65536, dtype="bfloat16")


class _Device:
    """Synchronize and read peak memory the same way on CUDA and on the CPU (the CPU only so
    that the code path runs in the tests: its memory column is the process's peak RSS)."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def start_peak(self) -> int:
        self.sync()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        return (_rss_kib("VmRSS") or 0) * 1024 if _reset_peak_rss() else 0

    def peak_since(self, start: int) -> float:
        """MB allocated at the peak since :meth:`start_peak`, above what was allocated then."""
        self.sync()
        if self.cuda:
            return (torch.cuda.max_memory_allocated(self.device) - start) / 2**20
        return max(0, (_rss_kib("VmHWM") or 0) * 1024 - start) / 2**20

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()


def _timed(fn: Callable[[], object], device: _Device, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call (compiles happen there), synchronized."""
    fn()
    device.sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        device.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _measure(forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor], device: _Device, repeats: int,
             backward: bool) -> dict:
    """Forward ms, forward+backward ms and the peak extra MB of one forward+backward (of one
    forward when ``backward`` is False); an error (out of memory, a backend that cannot) is
    recorded per column, never raised."""
    result: dict = {}

    def with_grad():
        out = forward()
        out.backward(torch.ones_like(out))
        for leaf in leaves:
            leaf.grad = None

    try:
        with torch.no_grad():
            result["fwd_ms"] = _timed(forward, device, repeats) * 1e3
    except Exception as err:  # noqa: BLE001 - a row's failure is its result (OOM at 32k, a backend that cannot)
        result["error"] = _one_line(err)
        device.empty()
        return result
    if backward:
        try:
            result["fwd_bwd_ms"] = _timed(with_grad, device, repeats) * 1e3
        except Exception as err:  # noqa: BLE001
            result["bwd_error"] = _one_line(err)
            device.empty()
    try:
        start = device.start_peak()
        if backward and "bwd_error" not in result:
            with_grad()
        else:
            with torch.no_grad():
                forward()
        result["peak_mb"] = device.peak_since(start)
    except Exception as err:  # noqa: BLE001
        result["error"] = _one_line(err)
    device.empty()
    return result


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:160]}"


def _fa2_alibi(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """FlashAttention-2's own ALiBi on the same tensors ((B, T, H, D) views), or None without flash-attn."""
    from posenc.attention import flash_attention_2

    func = flash_attention_2.flash_attn_func()
    if func is None:
        return None
    kwargs = flash_attention_2.flash_attn_arguments(q, k, v, slopes=slopes, causal=True, scale=q.shape[-1] ** -0.5)
    return lambda: func(**kwargs)


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
            return {"length": length, "batch": batch, "encoding": encoding, "backend": backend,
                    **_measure(forward, leaves, dev, repeats, backward)}

        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        baseline = base_row("none (bias-free SDPA)", "sdpa", sdpa, [q, k, v])
        length_rows = [baseline]
        alibi = create_for_model("alibi", d_model=heads * head_dim, num_heads=heads, head_dim=head_dim,
                                 max_positions=length).to(dev.device)
        fa2 = _fa2_alibi(q, k, v, alibi.slopes)
        if fa2 is None:
            if length == lengths[0]:
                notes.append("flash-attn not installed: FlashAttention-2's ALiBi row skipped (pip install flash-attn)")
        else:
            length_rows.append(base_row("alibi (FlashAttention-2 native)", "flash_attn", fa2, [q, k, v]))
        for name in encodings:
            encoding = create_for_model(name, d_model=heads * head_dim, num_heads=heads, head_dim=head_dim,
                                        max_positions=length, causal=True).to(dev.device)
            for backend in backends:
                forward = (lambda enc=encoding, b=backend: attention(q, k, v, enc, causal=True, backend=b))
                length_rows.append(base_row(name, backend, forward, [q, k, v, *encoding.parameters()]))
        for row in length_rows:
            for key, ratio in (("fwd_ms", "fwd_ratio"), ("fwd_bwd_ms", "fwd_bwd_ratio"), ("peak_mb", "memory_ratio")):
                if key in row and baseline.get(key):
                    row[ratio] = row[key] / baseline[key]
        rows += length_rows
        del q, k, v
        dev.empty()
    return rows, notes


DEVICE_ATTENTION_COLUMNS = [
    ("length", "T", "d"), ("batch", "B", "d"), ("encoding", "encoding", ""), ("backend", "backend", ""),
    ("fwd_ms", "fwd ms", ".2f"), ("fwd_bwd_ms", "fwd+bwd ms", ".2f"), ("peak_mb", "peak MB", ".0f"),
    ("fwd_ratio", "fwd / SDPA", ".2f"), ("fwd_bwd_ratio", "fwd+bwd / SDPA", ".2f"), ("memory_ratio", "memory / SDPA", ".2f"),
]


# --- tables to files ----------------------------------------------------------------------

def write_tables(out, name: str, rows: list[dict], columns: list[tuple[str, str, str]], notes: list[str] = (),
                 meta: dict | None = None) -> list:
    """Write ``rows`` as ``out/name.json`` (rows, notes, meta: device, torch version, ...),
    ``out/name.csv`` and ``out/name.md`` (a Markdown table with the notes under it). Returns the paths."""
    import csv
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.csv", out / f"{name}.md"]
    paths[0].write_text(json.dumps({"meta": meta or {}, "notes": list(notes), "rows": rows}, indent=1) + "\n")
    keys = [key for key, _, _ in columns] + sorted({k for row in rows for k in row} - {key for key, _, _ in columns})
    with paths[1].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " | notes |",
             "|" + "---|" * (len(columns) + 1)]
    for row in rows:
        cells = ["" if row.get(key) is None else format(row[key], fmt) for key, _, fmt in columns]
        problems = "; ".join(row[k] for k in ("error", "bwd_error") if k in row)
        lines.append("| " + " | ".join(cells) + f" | {problems} |")
    paths[2].write_text("\n".join(lines + [""] + [f"- {note}" for note in notes]) + "\n")
    return paths


def environment() -> dict:
    """What the numbers were measured on: device names, torch and library versions."""
    import platform

    meta = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    from posenc.attention import flash_attention_2

    meta["flash_attn"] = getattr(__import__("flash_attn"), "__version__", "?") if flash_attention_2.flash_attn_func() else None
    return meta


# --- printing ---------------------------------------------------------------------------

def print_table(title: str, rows: list[dict], columns: list[tuple[str, str, str]], notes: list[str] = ()) -> None:
    """Print rows as a rich table; ``columns`` are (key, header, format)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for _, header, _ in columns:
        table.add_column(header, justify="right" if header not in ("method", "encoding", "backend", "dtype") else "left")
    for row in rows:
        cells = []
        for key, _, fmt in columns:
            value = row.get(key)
            cells.append(row.get("error", "") if value is None and key == columns[-1][0] else
                         ("" if value is None else format(value, fmt)))
        table.add_row(*cells)
    console = Console()
    console.print(table)
    for note in notes:
        console.print(f"note: {note}", markup=False)  # notes name extras like posenc[bench]


ROPE_COLUMNS = [("dtype", "dtype", ""), ("method", "method", ""), ("ms", "ms", ".2f"),
                ("vs_clone", "x clone", ".2f"), ("vs_copy_", "x copy_", ".2f"), ("hf_over_this", "HF-style / this", ".2f")]
ATTENTION_COLUMNS = [("length", "T", "d"), ("encoding", "encoding", ""), ("backend", "backend", ""),
                     ("seconds", "s", ".3f"), ("extra_mb", "extra MB", ".0f"), ("time_ratio", "time / SDPA", ".2f"),
                     ("memory_ratio", "memory / SDPA", ".2f")]


# --- LM training throughput ---------------------------------------------------------------

#: The GPU size of ``posenc bench throughput --device cuda``: a GPT-2-small-shaped byte model.
DEVICE_THROUGHPUT = dict(d_model=768, num_layers=12, num_heads=12, seq_len=2048, batch_size=8, steps=10, repeats=3)


def throughput_benchmark(
    encodings: tuple[str, ...] | None = None,
    d_model: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    seq_len: int = 64,
    batch_size: int = 32,
    steps: int = 5,
    repeats: int = 3,
    threads: int | None = None,
    device: str = "cpu",
    autocast: str | None = None,
    compile: bool = False,
) -> tuple[list[dict], list[str]]:
    """Training tokens per second of :class:`~posenc.lab.model.TransformerLM` per encoding (AdamW
    steps on random bytes), interleaved across encodings, as a ratio to NoPE.

    ``device``: where the models train (one model per encoding, all on it at once);
    ``autocast``: None (float32) or a dtype name ("bfloat16") for ``torch.autocast``;
    ``compile``: ``torch.compile`` each model (its first step, the compile, is the untimed
    warm-up). An encoding that cannot train there (out of memory, a backend refusing) gets an
    ``error`` row.

    Returns rows ``{"encoding", "tokens_per_s", "vs_nope"}`` and notes.
    """
    import contextlib

    from posenc.lab.model import LMConfig, TransformerLM

    if threads:
        torch.set_num_threads(threads)
    if encodings is None:
        encodings = tuple(REGISTRY)
    dev = _Device(device)
    config = LMConfig(d_model=d_model, num_layers=num_layers, num_heads=num_heads, max_positions=max(seq_len, 1024))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=g).to(dev.device)
    precision = (lambda: torch.autocast(dev.device.type, dtype=getattr(torch, autocast))) if autocast \
        else contextlib.nullcontext
    runs, errors = {}, {}
    for name in encodings:
        torch.manual_seed(0)
        # built as posenc extrapolate builds it at L = seq_len (iRoPE's chunk scales with L)
        options = encoding_class(name).options_for_train_len(seq_len)
        model = TransformerLM(config, create_for_model(name, **config.encoding_sizes(), **options) if options else name)
        model = model.to(dev.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        forward = torch.compile(model) if compile else model

        def train(model=model, forward=forward, optimizer=optimizer):
            for _ in range(steps):
                with precision():
                    logits = forward(tokens[:, :-1])
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            dev.sync()

        try:
            train()  # warm-up (and compile) before the interleaved timings; a failure is the row's result
        except Exception as err:  # noqa: BLE001
            errors[name] = _one_line(err)
            dev.empty()
            continue
        runs[name] = train
    times = _median_times(runs, repeats)
    per_second = {name: batch_size * seq_len * steps / seconds for name, seconds in times.items()}
    base = per_second.get("nope")
    rows = [{"encoding": name, "tokens_per_s": per_second[name], "vs_nope": per_second[name] / base if base else None}
            if name in per_second else {"encoding": name, "error": errors[name]} for name in encodings]
    notes = [f"d_model {d_model}, {num_layers} layers, {num_heads} heads, seq len {seq_len}, batch {batch_size}, "
             f"{steps} steps per timing, median of {repeats}; device {device}"
             + (f", autocast {autocast}" if autocast else "") + (", compiled" if compile else "")]
    return rows, notes


THROUGHPUT_COLUMNS = [("encoding", "encoding", ""), ("tokens_per_s", "tokens/s", ".0f"), ("vs_nope", "x nope", ".2f")]
