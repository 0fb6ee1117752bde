"""`posenc inspect CONFIG.json`: the table, the attention factor and the PNG, on the published
config fixtures; every bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import posenc.rope
from posenc.lab import cli

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys, *args):
    code = cli.main(["inspect", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_inspect_yarn_config_table_attention_factor_and_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "qwen.png"
    code, stdout, stderr = run(capsys, FIXTURES / "qwen2_5_7b_instruct_yarn.json", "--out", out)
    assert code == 0, stderr
    # Qwen2.5-7B: head_dim 3584 / 28 = 128, theta 1e6, YaRN s = 4 over L0 = 32768.
    critical = 128 * math.log(32768 / (2 * math.pi)) / (2 * math.log(1e6))  # YaRN eq. 17, r = 1
    full_pairs = sum(2 * math.pi * 1e6 ** (2 * i / 128) <= 32768 for i in range(64))
    assert full_pairs == 40
    assert f"Critical dimension (YaRN eq. 17, r = 1): {critical:.2f}" in stdout
    assert f"{full_pairs} of 64 pairs turn fully within" in stdout
    assert f"attention factor {0.1 * math.log(4) + 1:.6g}" in stdout  # YaRN's default sqrt(1/t)
    assert "L0 = 32768" in stdout and "extended L = 131072" in stdout
    rows = re.findall(r"│\s*(\d+) │.*│\s*(yes|no)\s*│", stdout)
    assert [int(i) for i, _ in rows] == list(range(64))
    assert [flag for _, flag in rows] == ["yes"] * full_pairs + ["no"] * (64 - full_pairs)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert not stderr


def test_inspect_plain_config_default_png_name(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run(capsys, FIXTURES / "llama2_7b.json")
    assert code == 0, stderr
    assert "rope_type default" in stdout and "attention factor 1 " in stdout
    assert "46 of 64 pairs turn fully within" in stdout  # 2 pi 10000^(i/64) <= 4096 for i <= 45
    assert (tmp_path / "llama2_7b.rope.png").read_bytes()[:8] == PNG_MAGIC


def test_inspect_context_overrides(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, stdout, stderr = run(
        capsys, FIXTURES / "llama2_7b.json", "--original-context", "2048", "--extended-context", "8192",
        "--out", tmp_path / "l.png",
    )
    assert code == 0, stderr
    full_pairs = sum(2 * math.pi * 1e4 ** (2 * i / 128) <= 2048 for i in range(64))
    assert f"{full_pairs} of 64 pairs turn fully within L0 = 2048" in " ".join(stdout.split())
    assert "extended L = 8192" in stdout


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"rope_theta": 10000.0}', "head_dim"),
        ('{"head_dim": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}', "max_position_embeddings"),
        ('{"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "su", "factor": 4.0}}', "unknown rope_type"),
        ('{"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear"}}', "factor"),
    ],
)
def test_inspect_bad_config_one_line_exit_2(capsys, tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code, stdout, stderr = run(capsys, path, "--out", tmp_path / "x.png")
    assert code == 2
    assert stderr.startswith("posenc: error: ") and stderr.count("\n") == 1 and message in stderr
    assert not (tmp_path / "x.png").exists()


def test_inspect_bad_arguments_exit_2(capsys, tmp_path):
    code, _, stderr = run(capsys, FIXTURES / "llama2_7b.json", "--original-context", "0")
    assert code == 2 and "--original-context" in stderr and stderr.count("\n") == 1
    code, _, stderr = run(capsys, tmp_path)  # a folder, not a file
    assert code == 2 and "is not a file" in stderr
    code, _, stderr = run(capsys)  # CONFIG missing
    assert code == 2 and stderr.startswith("posenc: error: ")


@pytest.mark.parametrize("config, found", [
    ({"model_type": "bert", "hidden_size": 768, "num_attention_heads": 12, "max_position_embeddings": 512,
      "position_embedding_type": "absolute"}, "position_embedding_type='absolute'"),
    ({"model_type": "gpt2", "n_embd": 768, "hidden_size": 768, "num_attention_heads": 12}, "model_type='gpt2'"),
    ({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "alibi": True}, "alibi=true"),
])
def test_inspect_refuses_a_config_without_rope(config, found, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = cli.main(["inspect", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "has no RoPE" in err and found in err, err


def test_a_config_without_rope_fields_but_no_sign_against_reads_as_theta_10000():
    """Old Llama configs carry no rope_theta: the default stands."""
    rope = posenc.rope.from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    assert rope.base == 10000.0


def test_inspect_prints_the_per_layer_plan(capsys, tmp_path):
    """The plan of position_plan, layers grouped: Cohere2's interleaved RoPE on the sliding
    layers and NoPE on every 4th; a family posenc does not read gets one line saying why."""
    pytest.importorskip("matplotlib")
    config = tmp_path / "cohere2.json"
    config.write_text(json.dumps({
        "model_type": "cohere2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8,
        "rope_theta": 50000.0, "sliding_window": 4096, "sliding_window_pattern": 4, "max_position_embeddings": 8192,
    }))
    code, stdout, stderr = run(capsys, config, "--out", tmp_path / "c.png")
    assert code == 0, stderr
    assert "rope_type default" in stdout  # the existing table is still there
    lines = [line.strip() for line in stdout.splitlines()]
    assert "per-layer plan (8 layers, cohere2):" in lines
    assert "0-2, 4-6: rope theta 50000, rotary 16/16, interleaved; sliding 4096" in lines
    assert "3, 7: NoPE; full" in lines
    unknown = tmp_path / "other.json"
    unknown.write_text(json.dumps({"model_type": "nonesuch", "hidden_size": 64, "num_attention_heads": 4,
                                   "max_position_embeddings": 512}))
    code, stdout, stderr = run(capsys, unknown, "--out", tmp_path / "o.png")
    assert code == 0, stderr
    assert "per-layer plan: not read (config['model_type'] = 'nonesuch'" in stdout


def test_inspect_a_config_with_a_rope_per_layer_type_prints_each(capsys, tmp_path):
    """Gemma 3 (issue 34): its sliding layers rotate with theta 10^4, its full layers with 10^6;
    inspect prints one table and one figure per layer type (it asked for layer_type= before),
    at full width when written to a file (the capture is not a terminal)."""
    pytest.importorskip("matplotlib")
    config = Path(__file__).parent / "data" / "configs" / "gemma-3-1b-it.json"
    code, stdout, stderr = run(capsys, config, "--out", tmp_path)
    assert code == 0, stderr
    assert "gemma3_text (sliding_attention layers): RoPE θ = 10000," in stdout
    assert "gemma3_text (full_attention layers): RoPE θ = 1e+06," in stdout
    for kind in ("sliding_attention", "full_attention"):
        assert (tmp_path / f"gemma-3-1b-it.{kind}.rope.png").read_bytes().startswith(PNG_MAGIC)
    assert "per-layer plan (26 layers, gemma3_text)" in stdout
    assert max(len(line) for line in stdout.splitlines()) > 80  # not wrapped at rich's 80 columns
    code, stdout, _ = run(capsys, config, "--out", tmp_path, "--layer-type", "full_attention")
    assert code == 0 and "RoPE θ = 1e+06" in stdout and "θ = 10000," not in stdout
