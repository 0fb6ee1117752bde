"""RoPE apply on q and k: posenc against its peers, on the CPU (:func:`rope_benchmark`: the fused
CPU kernel beside copy, clone, posenc's eager torch path, the compiled formula and Hugging
Face's eager formula) and on an accelerator at Liger-Kernel's shape (:func:`rope_device_benchmark`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc.encodings import apply_rotary
from posenc.lab.bench.timing import _Device, _median_times, with_cpu_kernels

def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _hf_apply_rotary(notes: list[str]) -> Callable | None:
    """Hugging Face's ``apply_rotary_pos_emb`` (Llama's), or None with a note when transformers is not installed."""
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        notes.append("transformers not installed: Hugging Face apply_rotary_pos_emb skipped (pip install posenc[bench])")
        return None
    return apply_rotary_pos_emb


TORCH_PATH_OUT = "posenc apply_rotary(out=), torch path"


def _torch_path(fn: Callable[[], object]) -> Callable[[], object]:
    """fn with posenc's fused CPU kernel switched off during the call: the eager torch path."""
    return with_cpu_kernels(fn, False)


def _rope_candidates(q, k, cos, sin, notes: list[str], peers: bool = True,
                     compile_peers: bool = False) -> dict[str, Callable[[], object]]:
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    cos_x, sin_x = cos.to(q.dtype), sin.to(q.dtype)  # Hugging Face casts the tables to x's dtype
    fns: dict[str, Callable[[], object]] = {
        "copy (clone: new tensors)": lambda: (q.clone(), k.clone()),
        "copy_ (into preallocated)": lambda: (out_q.copy_(q), out_k.copy_(k)),
        "posenc apply_rotary": lambda: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)),
        "posenc apply_rotary(out=)": lambda: (apply_rotary(q, cos, sin, out=out_q), apply_rotary(k, cos, sin, out=out_k)),
        "posenc apply_rotary, torch path": _torch_path(lambda: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin))),
        TORCH_PATH_OUT: _torch_path(
            lambda: (apply_rotary(q, cos, sin, out=out_q), apply_rotary(k, cos, sin, out=out_k))),
        "HF-style eager formula (inline)": lambda: (q * cos_x + _rotate_half(q) * sin_x, k * cos_x + _rotate_half(k) * sin_x),
    }
    if compile_peers:
        compiled = torch.compile(apply_rotary, dynamic=False)
        fns["torch.compile(posenc apply_rotary)"] = lambda: (compiled(q, cos, sin), compiled(k, cos, sin))
    if not peers:
        return fns
    apply_rotary_pos_emb = _hf_apply_rotary(notes)
    if apply_rotary_pos_emb is not None:
        fns["transformers apply_rotary_pos_emb"] = lambda: apply_rotary_pos_emb(q, k, cos_x[None], sin_x[None])  # (B, T, D), unsqueeze_dim=1
    try:
        from rotary_embedding_torch import RotaryEmbedding
    except ImportError:
        notes.append("rotary-embedding-torch not installed: skipped (pip install posenc[bench])")
    else:
        rot = RotaryEmbedding(dim=q.shape[-1])
        fns["rotary-embedding-torch"] = lambda: (rot.rotate_queries_or_keys(q), rot.rotate_queries_or_keys(k))
    return fns


def _cpu_kernel_note(cpu_kernel: bool) -> str:
    """Builds posenc's fused CPU kernel when asked, and says which path the plain rows time."""
    from posenc import kernels

    if cpu_kernel and kernels.build_cpu_rotary():
        return ("posenc apply_rotary = the fused CPU kernel (posenc.kernels.build_cpu_rotary()); "
                "'torch path' = the same call with posenc.kernels.CPU_KERNEL_ENABLED = False")
    return "the fused CPU kernel is not built: every posenc row is the torch path"


def rope_benchmark(
    shape: tuple[int, int, int, int] = (1, 32, 2048, 128),
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
    repeats: int = 7,
    threads: int | None = 1,
    peers: bool = True,
    compile_peers: bool = True,
    cpu_kernel: bool = True,
) -> tuple[list[dict], list[str]]:
    """Time RoPE on q and k of ``shape`` (B, H, T, D) per dtype.

    Rows: the baselines (``clone``, ``copy_`` of q and k), ``posenc.apply_rotary`` allocating
    and with ``out=`` (with ``cpu_kernel``, the fused CPU kernel, built here first when a
    compiler is at hand: ``posenc.kernels.build_cpu_rotary``), the same two calls on the eager
    torch path (the kernel switched off), the Hugging Face formula written inline (eager), and
    with ``compile_peers`` ``torch.compile(apply_rotary)`` (Inductor, ``dynamic=False``; the
    compile itself is outside the timing). ``peers=False`` skips transformers and
    rotary-embedding-torch: they take seconds per call at (8, 32, 4096, 128).

    Returns rows ``{"dtype", "method", "ms", "vs_clone", "vs_copy_", "torch_path_over_this",
    "hf_over_this"}`` (the ratios: this / clone, this / copy_, the torch path's ``out=`` call /
    this, the inline HF formula / this) and notes. cos/sin come from ``RoPE.cos_sin`` once
    (float32, as RoPE passes them).
    """
    from posenc.encodings import RoPE

    if threads:
        torch.set_num_threads(threads)
    notes: list[str] = [_cpu_kernel_note(cpu_kernel)]
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(0)
        q, k = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
        cos, sin = RoPE(shape[-1]).cos_sin(torch.arange(shape[2]), torch.float32)
        fns = _rope_candidates(q, k, cos, sin, notes if dtype_name == dtypes[0] else [], peers, compile_peers)
        times = _median_times(fns, repeats)
        clone, copy_ = times["copy (clone: new tensors)"], times["copy_ (into preallocated)"]
        hf, torch_path = times["HF-style eager formula (inline)"], times[TORCH_PATH_OUT]
        for name, seconds in times.items():
            rows.append({
                "dtype": dtype_name, "method": name, "ms": seconds * 1e3,
                "vs_clone": seconds / clone, "vs_copy_": seconds / copy_,
                "torch_path_over_this": torch_path / seconds, "hf_over_this": hf / seconds,
            })
        del q, k, fns
    return rows, notes



COPY_FLOOR = "copy q, k (bandwidth floor)"
HF_EAGER = "HF apply_rotary_pos_emb (eager)"


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
    apply_rotary_pos_emb = _hf_apply_rotary(notes)
    if apply_rotary_pos_emb is not None:
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

    measure = _Device(device)
    dev = measure.device
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
                    results[name] = (measure.seconds(run, repeats, flush_l2=True), measure.peak_mb(run) if measure.cuda else None, err)
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


ROPE_COLUMNS = [("dtype", "dtype", ""), ("method", "method", ""), ("ms", "ms", ".2f"),
                ("vs_clone", "x clone", ".2f"), ("vs_copy_", "x copy_", ".2f"),
                ("torch_path_over_this", "torch path out= / this", ".2f"), ("hf_over_this", "HF-style / this", ".2f")]
