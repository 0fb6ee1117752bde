"""Every import path the README and docs/ document keeps working, and the lab's old paths stay gone.

The lists below are literal: the names as they were documented (README, docs/*.md, the public
``__all__`` of ``posenc``, ``posenc.rope``, ``posenc.masks`` and the transformers integration)
when the lab left the library's root. A move that breaks one of them fails here. The lab's
modules were aliased at the package root (``posenc.model``, ``posenc.cli``, ...) by an import
hook until issue 33; those paths were never released, and importing one now fails.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: module -> names documented in it.
DOCUMENTED = {
    "posenc": [
        "ALiBi", "AxialRoPE", "BACKENDS", "CoPE", "FIRE", "FoX", "IRoPE", "Kerple", "LearnedAbsolute", "MRoPE",
        "NoPE", "PositionalEncoding", "ProportionalRoPE", "REGISTRY", "RoPE", "ScoreBias", "Shaw", "Sinusoidal",
        "T5RelativeBias", "TransformerXL", "XPos", "__version__", "alibi_slopes", "apply_rotary", "attention",
        "available", "create", "create_for_model", "mrope_position_ids", "rope_frequencies", "sinusoidal_table",
        "t5_relative_position_bucket",
    ],
    "posenc.rope": [
        "EXTENSION_METHODS", "HF_ROPE_FIELDS", "LENGTH_DEPENDENT", "ROPE_INIT_FUNCTIONS", "ROPE_TYPES", "RoPE",
        "RopeInspection", "apply_rotary", "extension_scaling", "from_hf_config", "inspect_config",
        "plot_rope_inspection", "read_hf_config", "rope_frequencies", "to_hf_dict", "write_hf_config",
    ],
    "posenc.masks": [
        "check_padding_mask", "chunked_mask_mod", "document_ids_from_positions", "document_mask",
        "document_mask_mod", "key_padding_mask", "key_padding_mask_mod", "positions_from_document_ids",
        "positions_from_padding_mask", "sliding_window_mask_mod",
    ],
    "posenc.integrations.transformers": ["extend_context", "use_encoding", "posenc_attention_forward"],
    "posenc.attention.masks": ["mask_from_mod"],
    "posenc.attention.tiling": [],
    "posenc.kernels": ["KERNEL_DEVICES", "TRITON_ENABLED", "use_triton"],
    "posenc.errors": ["InvalidArgument"],
    # the lab's modules (documented at the package root before they moved to posenc.lab)
    "posenc.lab.model": [
        "LMConfig", "TransformerLM", "document_mask", "key_padding_mask", "positions_from_document_ids",
        "positions_from_padding_mask",
    ],
    "posenc.lab.train": ["TrainConfig"],
    "posenc.lab.data": ["CorpusError"],
    "posenc.lab.checkpoint": ["CheckpointMismatch"],
    "posenc.lab.plots": ["plot_encoding"],
    "posenc.lab.cli": ["main"],
    "posenc.lab.experiments.tasks": ["TASKS"],
}


@pytest.mark.parametrize("module, names", DOCUMENTED.items(), ids=list(DOCUMENTED))
def test_documented_names_import(module, names):
    mod = importlib.import_module(module)
    missing = [name for name in names if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"


def test_fused_rope_kernel_path_is_documented_where_triton_imports():
    pytest.importorskip("triton")
    from posenc.kernels.rotary_triton import fused_rope  # noqa: F401


#: The lab's module paths at the package root before it moved to posenc.lab (never released).
OLD_LAB_PATHS = ["model", "generation", "checkpoint", "data", "train", "evaluate", "experiments", "bench", "plots",
                 "cli"]


@pytest.mark.parametrize("old", OLD_LAB_PATHS)
def test_the_lab_s_old_paths_do_not_import(old):
    """No alias brings ``posenc.X`` back for ``posenc.lab.X`` (issue 33 removed the import hook):
    the one path of each lab module is the documented one."""
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module(f"posenc.{old}")
    assert caught.value.name == f"posenc.{old}"
    assert importlib.import_module(f"posenc.lab.{old}").__name__ == f"posenc.lab.{old}"


def test_a_submodule_of_an_old_path_does_not_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("posenc.experiments.runs")


def test_python_dash_m_of_an_old_path_fails():
    done = subprocess.run([sys.executable, "-m", "posenc.cli", "list"], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "No module named posenc.cli" in done.stderr, (done.returncode, done.stderr)


def test_python_dash_m_posenc_lab_cli_runs_the_cli():
    """docs/cli.md: torchrun ... -m posenc.lab.cli extrapolate."""
    done = subprocess.run([sys.executable, "-m", "posenc.lab.cli", "list"], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rope" in done.stdout and "alibi" in done.stdout


def test_import_posenc_does_not_import_the_lab():
    code = "import sys, posenc; bad = [m for m in sys.modules if m.startswith('posenc.lab')]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
