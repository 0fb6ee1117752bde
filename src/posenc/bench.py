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

from .encodings import REGISTRY, apply_rotary, create_for_model, encoding_class


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
    from .encodings import RoPE

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
    from .attention import attention

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
    code = "import json,sys; from posenc.bench import _attention_worker; print(json.dumps(_attention_worker(json.loads(sys.argv[1]))))"
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
        encodings = tuple(name for name, cls in REGISTRY.items() if "score_bias" in cls.hooks)
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
) -> tuple[list[dict], list[str]]:
    """Training tokens per second of :class:`~posenc.model.TransformerLM` per encoding (AdamW
    steps on random bytes), interleaved across encodings, as a ratio to NoPE.

    Returns rows ``{"encoding", "tokens_per_s", "vs_nope"}`` and notes.
    """
    from .model import LMConfig, TransformerLM

    if threads:
        torch.set_num_threads(threads)
    if encodings is None:
        encodings = tuple(REGISTRY)
    config = LMConfig(d_model=d_model, num_layers=num_layers, num_heads=num_heads, max_positions=max(seq_len, 1024))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=g)
    runs = {}
    for name in encodings:
        torch.manual_seed(0)
        # built as posenc extrapolate builds it at L = seq_len (iRoPE's chunk scales with L)
        options = encoding_class(name).options_for_train_len(seq_len)
        model = TransformerLM(config, create_for_model(name, **config.encoding_sizes(), **options) if options else name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def train(model=model, optimizer=optimizer):
            for _ in range(steps):
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

        runs[name] = train
    times = _median_times(runs, repeats)
    per_second = {name: batch_size * seq_len * steps / seconds for name, seconds in times.items()}
    base = per_second.get("nope")
    rows = [{"encoding": name, "tokens_per_s": tps, "vs_nope": tps / base if base else None}
            for name, tps in per_second.items()]
    notes = [f"d_model {d_model}, {num_layers} layers, {num_heads} heads, seq len {seq_len}, batch {batch_size}, "
             f"{steps} steps per timing, median of {repeats}"]
    return rows, notes


THROUGHPUT_COLUMNS = [("encoding", "encoding", ""), ("tokens_per_s", "tokens/s", ".0f"), ("vs_nope", "x nope", ".2f")]
