"""posenc.hf_config: Hugging Face config knowledge as plain dicts, without transformers.

The extension fields are checked against Hugging Face's own spelling of each rope_type
(transformers' ``rope_parameters`` keys, typed in here), not against posenc's writer.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import posenc
from posenc.hf_config import extension_config, from_hf_config, head_dim_of, rope_parameters_of

#: A v4-style config (top-level rope_theta, no rope dict), d = 8, L0 = 32.
PLAIN = {"head_dim": 8, "rope_theta": 10000.0, "max_position_embeddings": 32}


def test_imports_without_transformers_the_lab_or_matplotlib():
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of transformers now fails
        "import posenc.hf_config\n"
        "assert not [m for m in sys.modules if m.startswith(('posenc.lab', 'matplotlib', 'posenc.integrations'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("method, expected", [
    ("linear", {"max_position_embeddings": 128,
                "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    # transformers' dynamic NTK reads L0 from max_position_embeddings: it stays 32
    ("dynamic", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}}),
    ("yarn", {"max_position_embeddings": 128,
              "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32}}),
    ("llama3", {"max_position_embeddings": 128,
                "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0}}),
])
def test_extension_config_spells_each_method_as_hugging_face(method, expected):
    assert extension_config(PLAIN, method, 4.0) == expected


def test_extension_config_of_ntk_is_a_plain_rope_with_a_larger_theta():
    fields = extension_config(PLAIN, "ntk", 4.0)
    assert fields.keys() == {"rope_parameters"}
    assert fields["rope_parameters"]["rope_type"] == "default"
    assert fields["rope_parameters"]["rope_theta"] == pytest.approx(10000.0 * 4.0 ** (8 / 6), rel=1e-12)


def test_extension_config_writes_over_the_configs_rope_parameters():
    v5 = {**PLAIN, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    fields = extension_config(v5, "yarn", 2.0, beta_fast=16)
    assert fields["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 5e5, "factor": 2.0,
                                         "original_max_position_embeddings": 32, "beta_fast": 16}
    assert from_hf_config({**v5, **fields}).scaling["beta_fast"] == 16
    assert extension_config(v5, "yarn", 1.0) == {}  # s = 1: the model stays as trained


def test_extension_config_refuses_before_writing():
    with pytest.raises(posenc.errors.InvalidArgument, match="already scaled"):
        extension_config({**PLAIN, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "yarn", 2.0)
    with pytest.raises(posenc.errors.InvalidArgument, match="beta_fast"):
        extension_config(PLAIN, "yarn", 4.0, beta_fast=-1)
    with pytest.raises(posenc.errors.MissingKey, match="max_position_embeddings"):
        extension_config({"head_dim": 8}, "linear", 2.0)
    with pytest.raises(posenc.errors.InvalidArgument, match="method must be one of"):
        extension_config(PLAIN, "longrope", 2.0)


def test_head_dim_and_rope_parameters_of_a_config():
    assert head_dim_of({"hidden_size": 4096, "num_attention_heads": 32}) == 128
    assert head_dim_of({"head_dim": 256, "hidden_size": 4096, "num_attention_heads": 32}) == 256
    with pytest.raises(posenc.errors.MissingKey, match="head_dim"):
        head_dim_of({"hidden_size": 4096})
    assert rope_parameters_of({"rope_theta": 5e5}) == {"rope_type": "default", "rope_theta": 5e5}
    assert rope_parameters_of({}) == {"rope_type": "default", "rope_theta": 10000.0}
    params = {"rope_type": "default", "rope_theta": 1e6}
    copy = rope_parameters_of({"rope_parameters": params})
    assert copy == params and copy is not params


def _imported_modules(path, *, top_level_only):
    """The modules a source file imports (absolute imports; posenc's are all absolute)."""
    import ast

    tree = ast.parse(path.read_text("utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_layering_of_the_config_module():
    """DESIGN.md: hf_config imports encodings, never transformers nor the lab (anywhere in a
    file); encodings never import hf_config at module level (they load without it)."""
    from pathlib import Path

    root = Path(posenc.__file__).parent
    for path in sorted((root / "hf_config").glob("*.py")):
        bad = [m for m in _imported_modules(path, top_level_only=False)
               if m.split(".")[0] == "transformers" or m.startswith(("posenc.lab", "posenc.integrations"))]
        assert not bad, f"{path.name} imports {bad}"
    for path in sorted((root / "encodings").rglob("*.py")):
        bad = [m for m in _imported_modules(path, top_level_only=True) if m.startswith("posenc.hf_config")]
        assert not bad, f"{path.relative_to(root)} imports {bad} at module level"


def test_from_hf_config_reads_a_reader_familys_config_plainly():
    """The families with a whole-plan reader of their own (GPT-2, Falcon, ...) are records of the
    one family table too; from_hf_config reads their config plainly, as before they were: a
    GPT-2 config has no RoPE to read (not 'no RoPE on any layer' of its plan)."""
    from posenc.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="this model has no RoPE"):
        from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "hidden_size": 64,
                        "num_attention_heads": 4})
