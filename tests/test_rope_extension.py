"""RoPE context extension in the benchmark: extension_scaling's dicts give each method's
published frequencies; a tiny end-to-end sweep adds well-formed rope+<method> and
rope+<method>+ft rows; bad arguments are clear errors."""

from __future__ import annotations

import csv
import json
import math
import random

import pytest
import torch

import posenc
from posenc.lab import cli
from posenc.lab.checkpoint import CheckpointMismatch
from posenc.lab.data import load_corpus
from posenc.lab.evaluate import evaluate_length
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, fingerprint, load_trained_base, preset_config, run_extrapolation
from posenc.lab.experiments.runs import RunStore
from posenc.rope import EXTENSION_METHODS, RoPE, extension_scaling, rope_frequencies


def theta(d, base=10000.0):
    return [base ** (-2 * i / d) for i in range(d // 2)]


# -- the scaling dicts ---------------------------------------------------------------------
@pytest.mark.parametrize("method", EXTENSION_METHODS)
def test_factor_one_is_plain_rope(method):
    assert extension_scaling(method, 1, 64) is None
    assert extension_scaling(method, 1.0, 64) is None


@pytest.mark.parametrize("d, s, l0", [(16, 4.0, 64), (64, 8.0, 2048), (128, 2.0, 4096)])
def test_extension_frequencies_match_each_papers_formula(d, s, l0):
    """Each method at factor s, evaluated at length s * L0, against its formula in float64."""
    ref = theta(d)

    def inv(method):
        inv_freq, factor = rope_frequencies(d, scaling=extension_scaling(method, s, l0), seq_len=int(s * l0))
        return inv_freq.double().tolist(), factor

    close = dict(rel_tol=1e-6, abs_tol=0)
    linear, af = inv("linear")  # PI: theta_i / s
    assert af == 1.0 and all(math.isclose(a, t / s, **close) for a, t in zip(linear, ref))
    ntk, af = inv("ntk")  # base * s^(d/(d-2)); lowest frequency becomes exactly theta_last / s
    assert af == 1.0 and all(math.isclose(a, t, **close) for a, t in zip(ntk, theta(d, 1e4 * s ** (d / (d - 2)))))
    assert math.isclose(ntk[-1], ref[-1] / s, **close) and ntk[0] == 1.0
    dynamic, af = inv("dynamic")  # HF dynamic at L = s * L0: base * (s^2 - s + 1)^(d/(d-2))
    assert af == 1.0
    assert all(math.isclose(a, t, **close) for a, t in zip(dynamic, theta(d, 1e4 * (s * s - s + 1) ** (d / (d - 2)))))
    yarn, af = inv("yarn")  # highest pair extrapolated, lowest interpolated, temperature 0.1 ln s + 1
    assert math.isclose(af, 0.1 * math.log(s) + 1, rel_tol=1e-12)
    assert yarn[0] == 1.0 and math.isclose(yarn[-1], ref[-1] / s, **close)
    llama3, af = inv("llama3")  # wavelengths < L0/4 kept, > L0 divided by s
    assert af == 1.0
    for a, t in zip(llama3, ref):
        wavelength = 2 * math.pi / t
        if wavelength < l0 / 4:
            assert math.isclose(a, t, **close)
        elif wavelength > l0:
            assert math.isclose(a, t / s, **close)


def test_extension_scaling_bad_input():
    with pytest.raises(ValueError, match=r"method must be one of \['linear', 'ntk', 'dynamic', 'yarn', 'dynamic_yarn', 'llama3', 'yarn_log', 'theta_scale', 'telechat3_yarn'\]"):
        extension_scaling("longrope", 2, 64)
    with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
        extension_scaling("yarn", 0.5, 64)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        extension_scaling("yarn", 2, 0)


# -- a tiny sweep --------------------------------------------------------------------------------
WORDS = "the of and to in is was for on that with as by at from it an be this which or are have".split()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = random.Random(0)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(800))
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(text)
    return path


def tiny_config(**changes):
    values = dict(
        encodings=("rope", "alibi"), train_len=8, eval_factors=(1, 2), steps=6, batch_size=4, lr=3e-3,
        d_model=16, num_layers=1, num_heads=2, eval_tokens=256,
        extension_methods=("linear", "ntk", "dynamic", "yarn"), finetune_steps=3, finetune_factor=2,
    )
    values.update(changes)
    return ExtrapolationConfig.from_options(**values)


@pytest.fixture(scope="module")
def sweep(corpus_file, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sweep")
    config = tiny_config()
    corpus = load_corpus(corpus_file)
    return config, corpus, out, run_extrapolation(config, corpus, out)


def test_sweep_has_every_extension_row_well_formed(sweep):
    config, _, out, summary = sweep
    rows = ["rope+linear", "rope+ntk", "rope+dynamic", "rope+yarn",
            "rope+ft", "rope+linear+ft", "rope+ntk+ft", "rope+dynamic+ft", "rope+yarn+ft"]
    assert list(summary["results"]) == ["rope", "alibi", *rows]
    for row in rows:
        res = summary["results"][row]
        assert res["train_len"] == 8 and set(res["eval"]) == {"8", "16"}
        for cell in res["eval"].values():
            assert math.isfinite(cell["loss"]) and 0 < cell["loss"] < 10
            assert cell["ppl"] == pytest.approx(math.exp(cell["loss"]))
            assert cell["bits_per_byte"] == pytest.approx(cell["loss"] / math.log(2))
        assert (res["extension"]["finetune"] is not None) == row.endswith("+ft")
    on_disk = json.loads((out / "results.json").read_text())
    assert list(on_disk["results"]) == list(summary["results"])
    assert on_disk["config"]["extension_methods"] == list(config.extension_methods)
    with (out / "results.csv").open() as handle:
        csv_rows = {(r["encoding"], r["eval_len"]) for r in csv.DictReader(handle)}
    assert {(row, n) for row in rows for n in ("8", "16")} <= csv_rows
    assert (out / "runs" / "rope+yarn-seed0.json").exists() and (out / "checkpoints" / "rope+yarn+ft-seed0.pt").exists()


def test_at_train_len_every_inference_row_is_plain_rope(sweep):
    _, _, _, summary = sweep
    plain = summary["results"]["rope"]["eval"]["8"]["loss"]
    for method in ("linear", "ntk", "dynamic", "yarn"):
        assert summary["results"][f"rope+{method}"]["eval"]["8"]["loss"] == plain
        # past L the scaling changes the model's predictions
        assert summary["results"][f"rope+{method}"]["eval"]["16"]["loss"] != summary["results"]["rope"]["eval"]["16"]["loss"]
    # the fine-tunes trained the weights: they differ from the trained model even at L
    for row in ("rope+ft", "rope+yarn+ft"):
        assert summary["results"][row]["eval"]["8"]["loss"] != plain


def test_inference_row_uses_factor_length_over_L(sweep):
    """The 2L cell of rope+yarn is the trained model with YaRN at s = 2, L0 = 8, written out by hand."""
    config, corpus, out, summary = sweep
    model = load_trained_base(config, corpus, RunStore(out), "rope", 0)
    model.encoding = RoPE(8, scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8})
    result = evaluate_length(model, corpus.val, 16, 8, max_tokens=config.eval_tokens)
    assert result.loss == pytest.approx(summary["results"]["rope+yarn"]["eval"]["16"]["loss"], rel=1e-9)


def test_rerun_reuses_rows_and_refuses_other_arguments(sweep):
    config, corpus, out, summary = sweep
    again = run_extrapolation(config, corpus, out)
    assert again["results"] == summary["results"]
    with pytest.raises(CheckpointMismatch, match=r"rope\+ft-seed0.json"):
        run_extrapolation(tiny_config(finetune_steps=4), corpus, out)


def test_cli_rows_in_table(corpus_file, tmp_path, capsys):
    torch.set_num_threads(1)
    code = cli.main([
        "extrapolate", "--encodings", "rope", "--corpus", str(corpus_file), "--train-len", "8", "--steps", "4",
        "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-factors", "1,2",
        "--eval-tokens", "128", "--rope-scaling", "ntk,yarn", "--finetune-steps", "2", "--finetune-factor", "2",
        "--out", str(tmp_path),
    ])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for row in ("rope+ntk", "rope+yarn", "rope+ft", "rope+ntk+ft", "rope+yarn+ft"):
        assert f"│ {row} " in captured.out
    assert (tmp_path / "extrapolation.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--encodings", "alibi", "--rope-scaling", "yarn"], "add rope to encodings"),
        (["--encodings", "rope", "--rope-scaling", "yarn,su"], "unknown method(s) ['su']"),
        (["--encodings", "rope", "--rope-scaling", "yarn,yarn"], "each method once"),
        (["--encodings", "rope", "--finetune-steps", "-1"], "finetune_steps must be an integer >= 0"),
        (["--encodings", "rope", "--rope-scaling", "yarn", "--finetune-steps", "2", "--finetune-factor", "1"], "finetune_factor"),
    ],
)
def test_cli_bad_extension_arguments_exit_2(args, message, capsys, tmp_path):
    code = cli.main(["extrapolate", *args, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_randomized_positions_add_trained_rows(corpus_file, tmp_path):
    """--randomized-positions N: a `<encoding>+rand` row per encoding, trained with positions
    sampled from [0, N) and evaluated at ordinary positions; the plain rows are unchanged."""
    corpus = load_corpus(corpus_file)
    common = dict(encodings=("rope", "learned"), train_len=16, steps=4, batch_size=4, d_model=16, num_layers=1,
                  num_heads=2, eval_factors=(1, 2), eval_tokens=64)
    plain = run_extrapolation(ExtrapolationConfig.from_options(**common), corpus, tmp_path / "plain")
    both = run_extrapolation(ExtrapolationConfig.from_options(**common, randomized_positions=32), corpus, tmp_path / "rand")
    assert list(both["results"]) == ["rope", "learned", "rope+rand", "learned+rand"]
    assert both["results"]["rope"]["eval"] == plain["results"]["rope"]["eval"]
    assert both["results"]["rope+rand"]["eval"] != plain["results"]["rope"]["eval"]
    with pytest.raises(ValueError, match="past the learned table"):
        ExtrapolationConfig.from_options(**common, randomized_positions=64)
    with pytest.raises(ValueError, match="must be >= train_len=16"):
        ExtrapolationConfig.from_options(**{**common, "encodings": ("rope",)}, randomized_positions=8)


def test_named_randomized_rows_are_the_only_randomized_ones(corpus_file, tmp_path):
    """``encodings=("alibi", "rope+rand")``: exactly those rows; N defaults to the longest
    evaluation length; ``rope+rand`` trains as with --randomized-positions (same fingerprint)."""
    corpus = load_corpus(corpus_file)
    common = dict(train_len=16, steps=4, batch_size=4, d_model=16, num_layers=1, num_heads=2, eval_factors=(1, 2),
                  eval_tokens=64)
    named = ExtrapolationConfig.from_options(**common, encodings=("alibi", "rope+rand"))
    assert named.rows == ["alibi", "rope+rand"] and named.randomized_positions == 32
    flag = ExtrapolationConfig.from_options(**common, encodings=("rope",), randomized_positions=32)
    assert fingerprint(named, corpus, "rope+rand", 0) == fingerprint(flag, corpus, "rope+rand", 0)
    summary = run_extrapolation(named, corpus, tmp_path / "named")
    assert list(summary["results"]) == ["alibi", "rope+rand"]
    with pytest.raises(ValueError, match="unknown encoding 'nothing'"):
        ExtrapolationConfig.from_options(**common, encodings=("nothing+rand",))


def test_full_preset_has_every_encoding_the_hybrid_plans_and_a_randomized_row():
    config = preset_config("full")
    multi_axis = {"mrope", "axial_rope", "videorope", "mhrope"}  # on 1-D text, RoPE in another frequency order
    plans = ["rope/nope:4", "rope@sliding/nope:4"]  # SmolLM3's and Cohere2's (issue 21, item 6)
    assert config.rows == [*(n for n in posenc.available() if n not in multi_axis), *plans, "rope+rand"]
    assert config.randomized_positions == max(config.eval_lengths)
