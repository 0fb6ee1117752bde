"""Timing and memory, the same way on every device: the clock, the peak, the errors as rows.

:class:`_Device` is what every benchmark of the suite measures through: on CUDA, CUDA events
(optionally with L2 flushed before each call) and the allocator's peak; on the CPU, the wall
clock and the process's peak RSS above its resident memory before the call (glibc's free heap given
back first; coarse: the CPU rows are there so that every code path runs in the tests).
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from collections.abc import Callable

import torch

#: Bytes zeroed between timed calls on CUDA so that the inputs are not served from L2 (H100: 50 MB).
_L2_FLUSH_BYTES = 256 * 1024 * 1024


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


def cpu_and_wall_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(CPU seconds of the measuring thread, wall seconds) medians per function, after one
    warm-up call each, the functions interleaved in every repeat: on a shared machine the
    thread's CPU time is the steadier figure, wall time says whether threads helped."""
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    wall: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            c, w = time.thread_time(), time.perf_counter()
            fn()
            cpu[name].append(time.thread_time() - c)
            wall[name].append(time.perf_counter() - w)
    return {name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in fns}


def with_cpu_kernels(fn: Callable[[], object], enabled: bool) -> Callable[[], object]:
    """fn with posenc's fused CPU kernels switched on or off (``posenc.kernels.CPU_KERNEL_ENABLED``)
    during the call, the switch restored afterwards: a kernel and the path it replaces, timed in
    one process."""
    from posenc import kernels

    def run():
        before, kernels.CPU_KERNEL_ENABLED = kernels.CPU_KERNEL_ENABLED, enabled
        try:
            return fn()
        finally:
            kernels.CPU_KERNEL_ENABLED = before

    return run


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


def _give_back_free_heap() -> None:
    """Collect garbage and hand glibc's free heap back to the OS (``malloc_trim``), so that a
    peak read after it counts every page the next call touches: glibc keeps freed blocks (and,
    after a large free, raises its mmap threshold so the next large tensors land in that heap
    too), and a call that reuses them reads as using almost nothing. A no-op off glibc."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _rss_kib(field: str) -> int | None:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


class _Device:
    """Synchronize, time and read peak memory the same way on CUDA and on the CPU."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, fn: Callable[[], object], repeats: int, flush_l2: bool = False) -> float:
        """Median seconds of ``fn`` after one warm-up call (compilation, autotuning, the
        allocator). CUDA: CUDA events around each call, L2 flushed before it when
        ``flush_l2``; elsewhere the wall clock."""
        fn()
        if not self.cuda:
            return _median_times({"fn": fn}, repeats)["fn"]
        flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device=self.device) if flush_l2 else None
        times = []
        for _ in range(repeats):
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(self.device)
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def start_peak(self) -> int:
        self.sync()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        _give_back_free_heap()
        return (_rss_kib("VmRSS") or 0) * 1024 if _reset_peak_rss() else 0

    def peak_since(self, start: int) -> float:
        """MB allocated at the peak since :meth:`start_peak`, above what was allocated then."""
        self.sync()
        if self.cuda:
            return (torch.cuda.max_memory_allocated(self.device) - start) / 2**20
        return max(0, (_rss_kib("VmHWM") or 0) * 1024 - start) / 2**20

    def peak_mb(self, fn: Callable[[], object]) -> float:
        """Extra MB at the peak of one call of ``fn``."""
        start = self.start_peak()
        fn()
        return self.peak_since(start)

    def empty(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()


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
            result["fwd_ms"] = device.seconds(forward, repeats) * 1e3
    except Exception as err:  # noqa: BLE001 - a row's failure is its result (OOM at 32k, a backend that cannot)
        result["error"] = _one_line(err)
        device.empty()
        return result
    if backward:
        try:
            result["fwd_bwd_ms"] = device.seconds(with_grad, repeats) * 1e3
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



def environment() -> dict:
    """What the numbers were measured on: device names, torch and library versions."""
    import platform

    meta = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    from posenc.attention import flash_attention_2

    meta["flash_attn"] = getattr(__import__("flash_attn"), "__version__", "?") if flash_attention_2.flash_attn_func() else None
    return meta

