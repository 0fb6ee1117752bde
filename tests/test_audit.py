"""``posenc audit CONFIG``: the plan posenc reads against the model transformers builds.

Configs shaped like released config.json files (small head widths and windows to stay fast),
written to tmp; the CLI's exit codes: 0 every layer matches, 1 a mismatch (a wrong plan is
caught), 2 a config or family it cannot read or build; a model id is looked up in the local
Hugging Face cache only, never on the network.
"""

from __future__ import annotations

import json
import socket

import pytest

pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.hf_config.plan import LayerPlan, PositionPlan  # noqa: E402
from posenc.integrations import audit as audit_module  # noqa: E402
from posenc.lab.cli import main  # noqa: E402

CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=256, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=16,
                  intermediate_size=512, vocab_size=32000, max_position_embeddings=8192, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64},
                  bos_token_id=128000, eos_token_id=[128001, 128008], torch_dtype="bfloat16"),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        num_hidden_layers=26, intermediate_size=512, vocab_size=262144, sliding_window=8,
                        sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        query_pre_attn_scalar=16, max_position_embeddings=32768,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}),
    "cohere2": dict(model_type="cohere2", hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                    num_hidden_layers=8, intermediate_size=512, vocab_size=256000, sliding_window=8,
                    layer_types=["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
                    rope_theta=50000.0, max_position_embeddings=8192, logit_scale=0.25),
    "bloom": dict(model_type="bloom", hidden_size=128, n_head=8, n_layer=24, vocab_size=250880),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_head=4, n_layer=12, n_positions=1024, vocab_size=50257),
}


def run(capsys, *argv):
    code = main(["audit", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_read_plan_matches_the_model(tmp_path, capsys, family):
    code, out, err = run(capsys, write(tmp_path, CONFIGS[family]))
    assert code == 0, out + err
    assert "MISMATCH" not in out and out.count(" ok ") >= 1


def test_the_layers_cover_the_pattern_and_span():
    report = audit_module.audit(CONFIGS["gemma3_text"])
    assert (report.num_layers, report.audit_layers, report.length) == (26, 6, 16)  # window 8 + 8
    assert [row.layers for row in report.rows] == [(0, 1, 2, 3, 4), (5,)]
    assert "theta 10000" in report.rows[0].plan and "sliding 8" in report.rows[0].plan
    assert "theta 1e+06" in report.rows[1].plan and "linear x8" in report.rows[1].plan
    assert all(row.max_diff <= 1e-5 for row in report.rows)
    shrunk = audit_module.shrink_config(CONFIGS["cohere2"], 4)
    assert shrunk["layer_types"] == CONFIGS["cohere2"]["layer_types"][:4] and shrunk["num_hidden_layers"] == 4
    assert (shrunk["num_attention_heads"], shrunk["num_key_value_heads"], shrunk["hidden_size"]) == (2, 1, 32)



@pytest.mark.parametrize("model_type", ["diffllama", "bailing_hybrid"])
def test_the_shrunk_config_builds_where_the_class_constrains_heads_and_expert_groups(model_type):
    """transformers' own class is the judge: DiffLlama refuses an odd key/value head count, and
    the Bailing hybrid's router views its experts in n_group groups (its default 8, with 2
    experts left); the class's defaults, shrunk, build and run (Bailing's 6 layers: its MoE
    layers follow 2 dense ones, its attention layer is the 6th of a group)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(model_type).to_dict()
    shrunk = audit_module.shrink_config(config, 6 if model_type == "bailing_hybrid" else 2)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**shrunk))
    assert model(torch.tensor([[3, 4, 5, 6]])).logits.shape == (1, 4, 128)


def _wrong_base(plan):
    def changed(encoding):
        if not isinstance(encoding, posenc.RoPE):
            return encoding
        return posenc.RoPE(encoding.head_dim, rotary_dim=encoding.rotary_dim, base=encoding.base / 100,
                           scaling=encoding.scaling, interleaved=encoding.interleaved)
    return PositionPlan(tuple(LayerPlan(changed(layer.encoding), layer.span, layer.window, layer.layer_type, layer.sinks)
                              for layer in plan), model_type=plan.model_type)


@pytest.mark.parametrize("family", ["llama", "cohere2"])
def test_a_wrong_plan_is_caught_with_the_table_printed(tmp_path, capsys, monkeypatch, family):
    from posenc.hf_config import position_plan

    monkeypatch.setattr("posenc.hf_config.position_plan", lambda config: _wrong_base(position_plan(config)))
    code, out, err = run(capsys, write(tmp_path, CONFIGS[family]))
    assert code == 1 and "MISMATCH" in out and not err


def test_a_wrong_alibi_is_caught(tmp_path, capsys, monkeypatch):
    from posenc.hf_config import position_plan

    def wrong(config):
        plan = position_plan(config)
        alibi = posenc.ALiBi(plan[0].encoding.num_heads, slopes=plan[0].encoding.slope_formula, scale=0.5)
        return PositionPlan(tuple(LayerPlan(alibi) for _ in plan), model_type=plan.model_type)

    monkeypatch.setattr("posenc.hf_config.position_plan", wrong)
    code, out, err = run(capsys, write(tmp_path, CONFIGS["bloom"]))
    assert code == 1 and "MISMATCH" in out and not err


def test_unknown_family_missing_file_and_bad_json_exit_2(tmp_path, capsys):
    code, out, err = run(capsys, write(tmp_path, {"model_type": "not_a_family", "num_hidden_layers": 2}))
    assert code == 2 and err.startswith("posenc: error:") and "not_a_family" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, tmp_path / "missing.json")
    assert code == 2 and "posenc: error:" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, write(tmp_path, [1, 2], "list.json"))
    assert code == 2 and "JSON object" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, empty)
    assert code == 2 and "no config.json" in err


def test_a_folder_holding_config_json_is_read(tmp_path, capsys):
    write(tmp_path, CONFIGS["gpt2"])
    code, out, _ = run(capsys, tmp_path)
    assert code == 0 and "gpt2" in out


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("posenc audit opened a network connection")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_a_model_id_is_read_from_the_cache_only(tmp_path, capsys, monkeypatch):
    """A model id not in the cache is refused (exit 2) without any network access; one in the
    cache (the hub's layout: refs/main -> snapshots/<commit>/config.json) is audited."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    _no_network(monkeypatch)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "some-org/not-cached-model")
    assert code == 2 and "not-cached-model" in err and "cache" in err
    commit = "0" * 40
    snapshot = cache / "models--some-org--tiny-llama" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (cache / "models--some-org--tiny-llama" / "refs").mkdir()
    (cache / "models--some-org--tiny-llama" / "refs" / "main").write_text(commit)
    write(snapshot, CONFIGS["llama"])
    code, out, err = run(capsys, "some-org/tiny-llama")
    assert code == 0, out + err
    assert "llama" in out
