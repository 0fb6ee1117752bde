"""Every import path the README and docs/ documented before the house moved keeps working.

The lists below are literal: the names as they were documented (README, docs/*.md, the public
``__all__`` of ``posenc``, ``posenc.rope``, ``posenc.masks`` and the transformers integration)
when the lab left the library's root. A move that breaks one of them fails here.
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
    # the lab's modules, documented at the package root before they moved to posenc.lab
    "posenc.model": [
        "LMConfig", "TransformerLM", "document_mask", "key_padding_mask", "positions_from_document_ids",
        "positions_from_padding_mask",
    ],
    "posenc.train": ["TrainConfig"],
    "posenc.data": ["CorpusError"],
    "posenc.checkpoint": ["CheckpointMismatch"],
    "posenc.plots": ["plot_encoding"],
    "posenc.cli": ["main"],
    "posenc.experiments.tasks": ["TASKS"],
}


@pytest.mark.parametrize("module, names", DOCUMENTED.items(), ids=list(DOCUMENTED))
def test_documented_names_import(module, names):
    mod = importlib.import_module(module)
    missing = [name for name in names if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"


def test_fused_rope_kernel_path_is_documented_where_triton_imports():
    pytest.importorskip("triton")
    from posenc.kernels.rotary_triton import fused_rope  # noqa: F401


@pytest.mark.parametrize("old", ["model", "generation", "checkpoint", "data", "train", "evaluate", "experiments",
                                 "bench", "plots", "cli"])
def test_moved_modules_are_the_same_module_not_a_copy(old):
    """posenc.X is posenc.lab.X itself: classes keep one identity (isinstance, pickling)."""
    assert importlib.import_module(f"posenc.{old}") is importlib.import_module(f"posenc.lab.{old}")


def test_a_submodule_of_a_moved_package_loads_once():
    import posenc.experiments.runs as old
    import posenc.lab.experiments.runs as new

    assert old is new and old.RunStore is new.RunStore


def test_python_dash_m_posenc_cli_runs_the_cli():
    """README: torchrun ... -m posenc.cli extrapolate; the old module path runs the CLI."""
    done = subprocess.run([sys.executable, "-m", "posenc.cli", "list"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rope" in done.stdout and "alibi" in done.stdout


def test_import_posenc_does_not_import_the_lab():
    code = "import sys, posenc; bad = [m for m in sys.modules if m.startswith('posenc.lab')]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_an_old_path_leaves_the_module_its_own_spec():
    import importlib.util

    import posenc.cli  # noqa: F401 (the alias)

    spec = importlib.util.find_spec("posenc.lab.cli")
    assert spec.name == "posenc.lab.cli" and spec.origin.endswith("lab/cli.py")
