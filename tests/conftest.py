import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

# Without a GPU, Triton's kernels run only under its interpreter. Its standard library
# (tl.zeros, tl.sum, ...) is decorated when triton is first imported, interpreted or not, so
# the switch is set before any test imports triton (a fixture setting it later can re-decorate
# posenc's kernels, not Triton's own functions).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests' tensors are tiny: one thread is as fast, and cannot be starved by a busy machine
# (two spinning OpenMP threads on a loaded 2-core box ran 10x slower).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_encoding(name: str, *, d_model: int = 32, num_heads: int = 4, max_positions: int = 256, causal: bool = True):
    """Every registered encoding sized for a small transformer, via the model's own factory."""
    import posenc

    enc = posenc.create_for_model(
        name, d_model=d_model, num_heads=num_heads, head_dim=d_model // num_heads, max_positions=max_positions, causal=causal
    )
    # Learned tables start near zero; randomize them so tests see a real positional signal.
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    return enc.double()


def interpreted_module(name: str):
    """A generator for a module-scoped fixture: the Triton kernel module ``name`` decorated for
    Triton's interpreter (re-imported if it was imported without it), and the environment
    variable TRITON_INTERPRET restored afterwards."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module(name)
    if not module._interpreted():  # imported earlier without the interpreter: decorate again
        module = importlib.reload(module)
    assert module._interpreted()
    yield module
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before


def skip_if_causal_only(name: str, causal: bool) -> None:
    """Skip a bidirectional case of an encoding defined for causal attention only (PaTH: its
    refusal of ``causal=False`` is tested in its own file)."""
    import posenc

    if not causal and posenc.REGISTRY[name].causal_only:
        pytest.skip(f"{name} is causal only: causal=False is refused")


def attention_extras(enc, batch: int, heads: int, num_keys: int, *, dtype=torch.float64, generator=None) -> dict:
    """The keyword arguments ``posenc.attention`` needs beyond q, k and v for ``enc``: for an
    encoding with the ``gate`` hook (FoX), ``gates=`` of every key, here random log forget
    gates in (-inf, 0) (mostly near log sigmoid(2) ~ -0.13, so that several keys matter); for
    one whose gates carry features (PaTH: w then beta), random unit w and beta in (0, 2)."""
    if enc is None or "gate" not in enc.hooks:
        return {}
    if enc.gate_features is not None:
        w = torch.randn(batch, heads, num_keys, enc.gate_features - 1, dtype=dtype, generator=generator)
        beta = 2 * torch.rand(batch, heads, num_keys, 1, dtype=dtype, generator=generator)
        return {"gates": torch.cat((w / w.norm(dim=-1, keepdim=True), beta), dim=-1)}
    logits = torch.randn(batch, heads, num_keys, dtype=dtype, generator=generator) + 2.0
    return {"gates": torch.nn.functional.logsigmoid(logits)}


#: One registered encoding per kind of hook (rotate, score bias, a learned bias network, content,
#: gate, mask): the encodings a test runs by default where its every-encoding cases are slow.
HOOK_REPRESENTATIVES = ("rope", "alibi", "fire", "shaw", "fox", "irope")


def slow_unless(keep: bool, *values, id=None):
    """One pytest parameter of ``values``, marked ``slow`` unless ``keep`` (the default suite's
    time budget: ``pytest -m slow`` runs the others)."""
    return pytest.param(*values, marks=() if keep else (pytest.mark.slow,), id=id)


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/<name>.py`` as a module (registered in sys.modules first: its
    dataclasses resolve their module's annotations there)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def relpos_built():
    """The fused CPU relative-position kernel built for one module only (the modules after it keep
    the state they would have had); the module skips where no compiler builds it."""
    import warnings

    from posenc import kernels
    from posenc.kernels import relpos_cpu

    before = relpos_cpu._lib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not kernels.build_cpu_relpos():
            pytest.skip("the fused CPU kernel does not build here (no C++ compiler or ninja)")
    yield
    relpos_cpu._lib = before


@pytest.fixture
def relpos_kernel_calls(monkeypatch):
    """The calls that reached ``relpos_cpu.attention``: the names of each one's tensor arguments."""
    from posenc.kernels import relpos_cpu

    calls = []
    original = relpos_cpu.attention

    def counting(*args, **kwargs):
        calls.append(sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor)))
        return original(*args, **kwargs)

    monkeypatch.setattr(relpos_cpu, "attention", counting)
    return calls


def missing_docs_packages() -> list[str]:
    """The docs extra's packages that are not installed (the site's tests skip naming them)."""
    import importlib.util

    wanted = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocstrings_handlers.python": "mkdocstrings-python"}
    missing = []
    for module, package in wanted.items():
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            missing.append(package)
    return missing


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site built strictly (``mkdocs build --strict``), once a session, for
    tests/test_docs_site.py and tests/test_docs_browser.py (defined here, not imported into each
    module: a fixture imported into a module is a fixture of its own there, built again)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    missing = missing_docs_packages()
    if missing:
        pytest.skip(f"the docs extra is not installed (pip install -e '.[docs]'): missing {', '.join(missing)}")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         check=False, cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(root / "src")})
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return out
