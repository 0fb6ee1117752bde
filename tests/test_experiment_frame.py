"""The experiment frame keeps every stored run valid: the fingerprints and results.json configs
of both experiments are pinned here (digests computed before the frame was written, from the
configs as they were), and checked against the records stored under docs/results/."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from posenc.lab.data import Corpus
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, fingerprint as extrapolation_fingerprint
from posenc.lab.experiments.extrapolation import preset_config as extrapolation_preset
from posenc.lab.experiments.lengthgen import LengthgenConfig, fingerprint as lengthgen_fingerprint
from posenc.lab.experiments.lengthgen import preset_config as lengthgen_preset

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"

CORPUS = Corpus(torch.zeros(0), torch.zeros(0),
                {"name": "pinned", "bytes": 1000, "train_bytes": 900, "val_bytes": 100, "files": 3})

#: sha256 (first 16 hex digits) of json.dumps of each value, key order included (results.json
#: and run records are written in that order), posenc_version replaced by "VERSION".
PINNED = {
    "extrapolate default config": "afc6d93e0dfba838",
    "extrapolate default fingerprints": "2513d06f63b776c2",
    "extrapolate quick config": "a880af22d4cde67f",
    "extrapolate quick fingerprints": "3fc09903523f2132",
    "extrapolate gpu config": "e141f94a66acf6a6",
    "extrapolate gpu fingerprints": "42a760951d485efd",
    "extrapolate named+rand config": "2093231f671477dd",
    "extrapolate named+rand fingerprints": "f206042b22db670e",
    "extrapolate randomized config": "799fcb4e5ea5ede3",
    "extrapolate randomized fingerprints": "010c40d41711517f",
    "extrapolate ext config": "62c71ee2007e2f7a",
    "extrapolate ext fingerprints": "9edb0b069bec7876",
    "lengthgen default config": "1a1c363b9066a7e9",
    "lengthgen default fingerprints": "8170bb24adba090e",
    "lengthgen quick config": "72e57977f2524f2b",
    "lengthgen quick fingerprints": "cf9688c7b7ad1cd0",
    "lengthgen randomized config": "a6a3a5bfe4c62087",
    # was 244812a91f96180d: its +rand rows now also sample their positions at test (Ruoss et al.
    # 2023; issue 23) and say so ("positions"), so that their old runs, evaluated at 0, 1, 2, ...,
    # are not reused; every other field of every fingerprint is as before
    "lengthgen randomized fingerprints": "7df4167a49a3fdbd",
    "lengthgen sized config": "66b97f84a8e4e5da",
    "lengthgen sized fingerprints": "3b8c7dbc8eeadad3",
}


def _scrub(value):
    if isinstance(value, dict):
        return {k: ("VERSION" if k == "posenc_version" else _scrub(v)) for k, v in value.items()}
    return [_scrub(v) for v in value] if isinstance(value, list) else value


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(_scrub(json.loads(json.dumps(value)))).encode()).hexdigest()[:16]


def _extrapolation_configs() -> dict:
    return {
        "default": ExtrapolationConfig(),
        "quick": extrapolation_preset("quick"),
        "gpu": extrapolation_preset("gpu", autocast="bfloat16", compile=True),
        "named+rand": ExtrapolationConfig(encodings=("rope", "rope+rand", "irope", "learned+rand")),
        "randomized": ExtrapolationConfig.from_options(randomized_positions=2048, encodings=("nope", "rope"), seeds=(0, 3)),
        "ext": extrapolation_preset("quick", extension_methods=("yarn",), finetune_steps=5, eval_stride=64, lr=1e-3),
    }


def _lengthgen_configs() -> dict:
    return {
        "default": LengthgenConfig(),
        "quick": lengthgen_preset("quick"),
        "randomized": lengthgen_preset("default", randomized_positions=200, seeds=(0, 2), steps=50, d_model=32),
        "sized": lengthgen_preset("default", train_size=5, tasks=("copy", "addition", "sort"), batch_size=8,
                                  eval_factors=(1.0, 2.5)),
    }


@pytest.mark.parametrize("name", list(_extrapolation_configs()))
def test_extrapolation_fingerprints_and_config_are_pinned(name):
    config = _extrapolation_configs()[name]
    assert _digest(config.to_dict()) == PINNED[f"extrapolate {name} config"]
    fingerprints = [extrapolation_fingerprint(config, CORPUS, row, seed) for row in config.rows for seed in config.seeds]
    assert _digest(fingerprints) == PINNED[f"extrapolate {name} fingerprints"]


@pytest.mark.parametrize("name", list(_lengthgen_configs()))
def test_lengthgen_fingerprints_and_config_are_pinned(name):
    config = _lengthgen_configs()[name]
    assert _digest(config.to_dict()) == PINNED[f"lengthgen {name} config"]
    fingerprints = [lengthgen_fingerprint(config, task, row, seed)
                    for task in config.tasks for row in config.rows for seed in config.seeds]
    assert _digest(fingerprints) == PINNED[f"lengthgen {name} fingerprints"]


def test_default_extrapolation_fingerprint_in_full():
    fields = extrapolation_fingerprint(ExtrapolationConfig(), CORPUS, "rope", 0)
    assert list(fields) == ["posenc_version", "encoding", "seed", "model", "train", "eval_lengths", "eval_tokens", "corpus"]
    assert fields["model"] == {"vocab_size": 256, "d_model": 64, "num_layers": 4, "num_heads": 4, "mlp_ratio": 4,
                               "max_positions": 1024, "backend": "auto"}
    assert fields["train"] == {"steps": 1500, "batch_size": 32, "seq_len": 64, "lr": 0.003, "weight_decay": 0.1,
                               "warmup_frac": 0.05, "min_lr_frac": 0.1, "grad_clip": 1.0, "seed": 0}
    assert fields["eval_lengths"] == [64, 128, 256, 512, 1024] and fields["eval_tokens"] == 65536


def test_stored_lengthgen_runs_still_match():
    """The default run stored in docs/results/lengthgen resumes: every record's fingerprint is
    the one today's default config computes (posenc_version aside), and results.json's config
    reads the same, key order included."""
    config = LengthgenConfig()
    records = sorted((RESULTS / "lengthgen" / "runs").glob("*-seed0.json"))
    assert len(records) == len(config.tasks) * len(config.rows)
    for path in records:
        stored = json.loads(path.read_text())["fingerprint"]
        computed = lengthgen_fingerprint(config, stored["task"], stored["row"], stored["seed"])
        assert json.dumps(_scrub(computed)) == json.dumps(_scrub(stored)), path.name
    written = json.loads((RESULTS / "lengthgen" / "results.json").read_text())["config"]
    assert json.dumps(_scrub({**config.to_dict(), "posenc_version": ""})) == json.dumps(_scrub(written))


def test_a_row_is_parsed_once_by_row():
    from posenc.lab.experiments.frame import Row

    assert Row.parse("rope+rand") == Row("rope", randomized=True) and Row.parse("rope+rand").name == "rope+rand"
    assert Row.parse("t5") == Row("t5") and not Row.parse("t5").randomized
    assert ExtrapolationConfig(encodings=("alibi", "rope+rand")).row_run("rope+rand", 3)[1].randomized_positions == 1024
    assert LengthgenConfig(randomized_positions=100).row_run("copy", "nope+rand", 0)[0] == "nope"


def test_only_when_set_drops_defaulted_fields_at_any_depth():
    from posenc.lab.fields import only_when_set

    fields = {"a": 1, "b": None, "train": {"compile": False, "lr": 0.1}, "options": {}}
    kept = only_when_set(fields, {"b": None, "train.compile": False, "options": {}, "absent": 0, "gone.x": 1})
    assert kept == {"a": 1, "train": {"lr": 0.1}}
    assert fields["train"] == {"compile": False, "lr": 0.1}  # the input is left as it was
    assert only_when_set({"b": 2, "train": {"compile": True}}, {"b": None, "train.compile": False}) == \
        {"b": 2, "train": {"compile": True}}


@pytest.mark.parametrize("config", [ExtrapolationConfig, LengthgenConfig])
def test_results_json_order_names_every_field_once(config):
    import dataclasses

    assert sorted(config.FIELD_ORDER) == sorted(f.name for f in dataclasses.fields(config))
