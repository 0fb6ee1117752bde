"""The C++ kernels' build, load and registration, written once for ``rotary_cpu``, ``fire_cpu``
and ``relpos_cpu``.

Build: a ``.cpp`` shipped beside this file (package data) is compiled by
``torch.utils.cpp_extension.load`` (g++ and ninja; the sources include no torch header, so a
build takes seconds) into a folder of torch's extension cache (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``), ``posenc_cpu/<name>``, whose name is a digest of the source, the
flags, the torch version and install folder, and the CPU's model and instruction-set flags: a
binary built for one CPU or source is never loaded for another, a cached one is loaded without
compiling, and each Python environment keeps its own build.
Processes building at once (pytest workers, torchrun ranks) queue on an ``fcntl`` lock of
``<name>.lock`` beside the folder; the operating system releases it when its holder dies, so a
build killed midway blocks nobody (torch's own ``lock`` file, which a killed build leaves
behind, is removed by the next holder: under the lock nobody else can be building).

Load: ``ctypes.CDLL``, whose calls release the GIL (the kernels' thread pool, :func:`thread_pool`,
runs parts of a call at once). A failed build or load is one ``RuntimeWarning`` naming the kernel,
the error and the path every call keeps (:func:`load_or_warn`), never an exception.

Registration: :func:`define_op` makes a ``posenc::`` operator of the dispatcher with a CPU
implementation (the ctypes call) and a fake one (shapes only), so that ``torch.compile``
traces it and the profiler names it. It uses ``torch.library.Library.define`` and ``impl``
rather than ``torch.library.custom_op``: the same operator, ``register_fake`` and
``register_autograd`` as custom_op's, but about 3 us per call instead of 15 to 35 us (measured
on torch 2.13 CPU), which matters for RoPE's small calls (one per layer and token when decoding).

Layer: kernels (imports torch only).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

#: The dispatcher library of posenc's operators (``torch.ops.posenc.*``).
_LIBRARY = torch.library.Library("posenc", "FRAGMENT")

_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] = (0, 0)


def source(stem: str) -> Path:
    """The C++ source ``<stem>.cpp`` shipped beside this module."""
    return Path(__file__).with_name(f"{stem}.cpp")


def cpu_fingerprint() -> str:
    """The CPU's model and instruction-set flags (what ``-march=native`` compiled for)."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    text += line
                if line.strip() == "":
                    break  # the first processor describes them all
    except OSError:
        pass
    return text


def extension_name(stem: str, cflags: Sequence[str]) -> str:
    """``posenc_<stem>_<digest>``: the source, the flags, torch's version and install folder and the
    CPU in one digest. The install folder: torch's build file names the environment's include
    paths, so two environments sharing one folder would each compile again over the other's
    build (about 13 s for the relative-position kernel) on every switch between them."""
    digest = hashlib.sha256()
    for part in (source(stem).read_bytes(), " ".join(cflags).encode(), torch.__version__.encode(),
                 str(Path(torch.__file__).resolve().parent).encode(), cpu_fingerprint().encode()):
        digest.update(part)
        digest.update(b"\0")
    return f"posenc_{stem}_{digest.hexdigest()[:16]}"


def cache_root() -> Path:
    """The folder holding the builds: ``posenc_cpu`` in torch's extension cache."""
    from torch.utils import cpp_extension

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()) / "posenc_cpu"


def _put_pip_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the PyPI package ``ninja`` (in the ``test`` extra) puts it
    in the environment's bin folder, which is on PATH only in an activated environment."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``path`` across processes (none where fcntl is missing:
    torch's own lock file still serializes the build there)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def compile_and_load(stem: str, cflags: Sequence[str], *, verbose: bool = False) -> ctypes.CDLL:
    """``<stem>.cpp`` compiled with ``cflags`` (once per :func:`extension_name`; later calls and
    processes load the cached library) and loaded with ctypes. Raises whatever the compiler,
    ninja, the cache folder or ``dlopen`` raise."""
    from torch.utils import cpp_extension

    _put_pip_ninja_on_path()
    name = extension_name(stem, cflags)
    folder = cache_root() / name
    folder.mkdir(parents=True, exist_ok=True)
    with _file_lock(folder.with_name(f"{name}.lock")):
        (folder / "lock").unlink(missing_ok=True)  # torch's baton, left by a build killed midway
        path = cpp_extension.load(name=name, sources=[str(source(stem))], extra_cflags=list(cflags),
                                  build_directory=str(folder), is_python_module=False, verbose=verbose)
    return ctypes.CDLL(str(path))


def load_or_warn(stem: str, cflags: Sequence[str], declare: Callable[[ctypes.CDLL], None], *, what: str,
                 fallback: str, verbose: bool = False) -> ctypes.CDLL | None:
    """:func:`compile_and_load`, then ``declare(lib)`` (the entry points' ctypes signatures); on
    any failure one ``RuntimeWarning`` ("posenc: the fused CPU <what> kernel could not be built
    (<error>); <fallback>") and None: the caller keeps its torch path."""
    try:
        lib = compile_and_load(stem, cflags, verbose=verbose)
        declare(lib)
    except Exception as err:  # noqa: BLE001 - any build or load failure (compiler, ninja, cache, dlopen) keeps the torch path
        warnings.warn(f"posenc: the fused CPU {what} kernel could not be built ({type(err).__name__}: "
                      f"{str(err).strip()[-300:]}); {fallback}", RuntimeWarning, stacklevel=4)
        return None
    return lib


class KernelUnavailable(RuntimeError):
    """A ``posenc::`` operator was called where its C++ kernel is not built and cannot be."""


def define_op(schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> str:
    """Define ``posenc::<schema>`` with ``impl`` on CPU tensors and ``fake`` (shapes, strides and
    dtypes of the outputs, no data) for tracing; returns the qualified name. Defined once per
    process (a reloaded module keeps the first definition's ``impl``)."""
    name = schema.split("(", 1)[0]
    qualname = f"posenc::{name}"
    if hasattr(torch.ops.posenc, name):
        return qualname
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, impl, "CPU")
    torch.library.register_fake(qualname, fake, lib=_LIBRARY)
    return qualname


def register_autograd(qualname: str, backward: Callable[..., Any], setup_context: Callable[..., Any]) -> None:
    """``torch.library.register_autograd`` for an operator of :func:`define_op`."""
    torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=_LIBRARY)


def thread_pool(n: int) -> ThreadPoolExecutor:
    """The kernels' one pool of n - 1 worker threads, made again when n changes or in a forked
    child (whose copy of the parent's pool has no threads behind it)."""
    global _pool, _pool_key
    key = (n, os.getpid())
    if _pool is None or _pool_key != key:
        if _pool is not None and _pool_key[1] == key[1]:
            _pool.shutdown(wait=False)
        _pool, _pool_key = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="posenc-cpu-kernel"), key
    return _pool
