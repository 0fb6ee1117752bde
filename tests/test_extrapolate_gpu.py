"""`posenc extrapolate` at the papers' scale, as far as the CPU can check it: the gpu preset's
config and cost estimate, bf16 autocast and compile as options that stay out of earlier runs'
fingerprints, sliding-window evaluation against a window-by-window reference, and Hugging Face
datasets as corpora (skipped without the datasets package)."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from posenc.lab.cli import main
from posenc.lab.data import CorpusError, load_corpus
from posenc.lab.evaluate import evaluate_length, sliding_windows
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, fingerprint, preset_config
from posenc.lab.experiments.extrapolation_config import paper_hours, train_flops
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import TrainConfig

TINY = ["--train-len", "8", "--steps", "4", "--batch-size", "4", "--d-model", "16", "--layers", "1",
        "--heads", "2", "--eval-factors", "1,2", "--eval-tokens", "96", "--seeds", "0"]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("".join(f"line {i}: the value of x{i % 13} is {i * 7 % 101}\n" for i in range(200)))
    return path


# -- the gpu preset ----------------------------------------------------------------------------

def test_gpu_preset_is_the_papers_setting():
    config = preset_config("gpu")
    assert config.train_len == 512 and config.eval_factors == (1, 2, 4, 8, 16)
    assert config.eval_lengths == [512, 1024, 2048, 4096, 8192] and config.eval_stride == 512
    assert config.eval_tokens >= 1 << 20 and config.model.max_positions == 8192
    assert (config.model.d_model, config.model.num_layers, config.model.num_heads) == (512, 8, 8)
    assert config.device == "cpu" and config.train.autocast is None  # the device (--device cuda) decides those
    for name in ("rope", "alibi", "learned"):
        parameters = TransformerLM(config.model_config(), name).num_parameters()
        assert 10_000_000 <= parameters < 100_000_000, (name, parameters)


def test_gpu_preset_cost_estimate():
    """(6 N + 6 n_layers L d) FLOPs per training token: about 10 minutes per encoding at 15% of an
    H100's 989 dense bf16 TFLOPS (docs/results.md has the estimate)."""
    config = preset_config("gpu")
    parameters = TransformerLM(config.model_config(), "rope").num_parameters()
    tokens = config.train.steps * config.train.batch_size * config.train_len
    assert train_flops(config, parameters) == (6 * parameters + 6 * 8 * 512 * 512) * tokens
    minutes = train_flops(config, parameters) / (0.15 * 989e12) / 60
    assert 5 < minutes < 10, minutes


# -- autocast and compile: options outside earlier runs' fingerprints ---------------------------

def test_new_options_leave_earlier_fingerprints_alone(corpus_file):
    corpus = load_corpus(corpus_file)
    plain = ExtrapolationConfig.from_options(train_len=8, steps=4, eval_factors=(1, 2), eval_tokens=96)
    record = fingerprint(plain, corpus, "rope", 0)
    assert set(record) == {"posenc_version", "encoding", "seed", "model", "train", "eval_lengths", "eval_tokens", "corpus"}
    assert set(record["train"]) == {"steps", "batch_size", "seq_len", "lr", "weight_decay", "warmup_frac", "min_lr_frac",
                                    "grad_clip", "seed"}
    assert set(plain.to_dict()) == {"encodings", "model", "train", "eval_factors", "seeds", "eval_tokens",
                                    "learned_positions", "device", "extension_methods", "finetune_steps",
                                    "finetune_factor", "finetune_lr", "randomized_positions", "train_len", "eval_lengths"}
    mixed = ExtrapolationConfig.from_options(train_len=8, steps=4, eval_factors=(1, 2), eval_tokens=96,
                                             autocast="bfloat16", compile=True, eval_stride=4)
    record = fingerprint(mixed, corpus, "rope", 0)
    assert record["train"]["autocast"] == "bfloat16" and record["train"]["compile"] is True and record["eval_stride"] == 4


@pytest.mark.parametrize("bad, match", [
    (dict(autocast="float16"), r"autocast must be None \(float32\) or one of \('bfloat16',\)"),
    (dict(eval_stride=9), "eval_stride=9 must be <= train_len=8"),
    (dict(eval_stride=0), "eval_stride must be an integer >= 1"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        ExtrapolationConfig.from_options(train_len=8, eval_factors=(1, 2), eval_tokens=96, **bad)
    with pytest.raises(TypeError, match="compile must be a bool"):
        TrainConfig(compile="yes")


def test_bf16_autocast_trains_and_evaluates_on_the_cpu(tmp_path, corpus_file, capsys):
    out = tmp_path / "out"
    assert main(["extrapolate", "--encodings", "alibi", *TINY, "--corpus", str(corpus_file), "--out", str(out), "--bf16"]) == 0
    assert "bf16 autocast" in capsys.readouterr().out
    record = json.loads((out / "runs" / "alibi-seed0.json").read_text())
    assert record["fingerprint"]["train"]["autocast"] == "bfloat16" and "compile" not in record["fingerprint"]["train"]
    assert all(math.isfinite(cell["loss"]) for cell in record["eval"].values())


# -- sliding windows -------------------------------------------------------------------------------

def reference_sliding_loss(model, data, length, stride, max_tokens):
    """Window by window, one at a time: the first scores all its tokens, each later one its last
    ``stride`` (Hugging Face's "Perplexity of fixed-length models" loop), float64 sums."""
    usable = min(max_tokens, data.numel() - 1)
    total, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, usable - length + 1, stride):
            window = data[begin : begin + length + 1].long()
            nll = F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="none").double()
            scored = nll if begin == 0 else nll[-stride:]
            total += scored.sum().item()
            count += scored.numel()
    return total / count, count


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_sliding_windows_match_a_window_by_window_reference(corpus_file, stride):
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=64), "alibi").eval()
    data = load_corpus(corpus_file).val
    result = evaluate_length(model, data, 8, 4, max_tokens=60, stride=stride, tokens_per_batch=24)
    loss, count = reference_sliding_loss(model, data, 8, stride, 60)
    assert result.tokens == count and result.loss == pytest.approx(loss, rel=1e-6)
    windows, first = sliding_windows(data, 8, stride, 60)
    assert result.windows == windows.shape[0] and first.tolist() == [0] + [8 - stride] * (windows.shape[0] - 1)
    if stride == 8:  # stride = length: the non-overlapping windows exactly
        plain = evaluate_length(model, data, 8, 4, max_tokens=60)
        assert (plain.tokens, plain.windows) == (result.tokens, result.windows)
        assert plain.loss == pytest.approx(result.loss, rel=1e-9)


def test_sliding_stride_must_fit_the_window(corpus_file):
    with pytest.raises(ValueError, match=r"stride must be an integer in \[1, length=8\], got 9"):
        sliding_windows(load_corpus(corpus_file).val, 8, 9, 60)


def test_extrapolate_reports_both_evaluations(tmp_path, corpus_file, capsys):
    out = tmp_path / "out"
    assert main(["extrapolate", "--encodings", "nope,alibi", *TINY, "--corpus", str(corpus_file), "--out", str(out),
                 "--eval-stride", "4"]) == 0
    assert "sliding windows (stride 4)" in capsys.readouterr().out
    summary = json.loads((out / "results.json").read_text())
    assert summary["config"]["eval_stride"] == 4
    for res in summary["results"].values():
        assert set(res["eval"]) == set(res["eval_sliding"]) == {"8", "16"}
        assert res["eval_sliding"]["8"]["loss"] != res["eval"]["8"]["loss"]  # more context per scored token
    rows = list(csv.DictReader((out / "results-sliding.csv").open()))
    assert len(rows) == 4 and {r["encoding"] for r in rows} == {"nope", "alibi"}


# -- Hugging Face datasets as corpora -----------------------------------------------------------------

def test_a_dataset_name_without_the_datasets_package_says_what_to_install(monkeypatch):
    import importlib

    real = importlib.import_module

    def without_datasets(name, *args):
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_datasets)
    with pytest.raises(CorpusError, match=r"wikitext does not exist; as a Hugging Face dataset name: .*pip install 'posenc\[data\]'"):
        load_corpus("wikitext")


@pytest.fixture(scope="module")
def saved_dataset(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("datasets")
    lines = [f" = Section {i} = \n" if i % 10 == 0 else f"The value of item {i} is {i * 3 % 17}.\n" for i in range(300)]
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": lines[:240]}),
        "validation": datasets.Dataset.from_dict({"text": lines[240:]}),
        "test": datasets.Dataset.from_dict({"text": ["unused\n"]}),
    }).save_to_disk(str(root / "wikitext-like"))
    datasets.Dataset.from_dict({"body": [f"document {i} has no newline" for i in range(50)], "n": list(range(50))}) \
        .save_to_disk(str(root / "one-split"))
    datasets.Dataset.from_dict({"a": ["x"] * 4, "b": ["y"] * 4}).save_to_disk(str(root / "two-columns"))
    return root, lines


def test_a_saved_dataset_folder_is_a_corpus(saved_dataset):
    root, lines = saved_dataset
    corpus = load_corpus(root / "wikitext-like")
    assert bytes(corpus.train.tolist()) == "".join(lines[:240]).encode()
    assert bytes(corpus.val.tolist()) == "".join(lines[240:]).encode()  # validation, not test
    assert corpus.info["name"] == "wikitext-like" and corpus.info["train_files"] == 240 and corpus.info["unit"] == "rows"
    assert "240 rows" in corpus.describe()
    single = load_corpus(root / "one-split")  # the only string column; split by bytes
    text = "".join(f"document {i} has no newline\n" for i in range(50)).encode()
    assert bytes(single.train.tolist()) + bytes(single.val.tolist()) == text
    assert single.val.numel() == len(text) - int(len(text) * 0.9)
    with pytest.raises(CorpusError, match=r"no 'text' column and not exactly one string column \(columns: \['a', 'b'\]\)"):
        load_corpus(root / "two-columns")


def test_extrapolate_on_a_saved_dataset(tmp_path, saved_dataset, capsys):
    root, _ = saved_dataset
    out = tmp_path / "out"
    assert main(["extrapolate", "--encodings", "nope", *TINY, "--corpus", str(root / "wikitext-like"), "--out", str(out)]) == 0
    assert "wikitext-like: 300 rows" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["corpus"]["name"] == "wikitext-like"


@pytest.mark.slow
def test_compiled_training_and_evaluation_on_the_cpu(tmp_path, corpus_file):
    """--compile (torch.compile of the LM for training, dynamic=True for evaluation): the code path
    the GPU preset takes, end to end on the CPU, close to the uncompiled run."""
    losses = {}
    for flag in ("--no-compile", "--compile"):
        out = tmp_path / flag
        assert main(["extrapolate", "--encodings", "alibi", *TINY, "--corpus", str(corpus_file), "--out", str(out), flag]) == 0
        record = json.loads((out / "runs" / "alibi-seed0.json").read_text())
        assert record["fingerprint"]["train"].get("compile", False) == (flag == "--compile")
        losses[flag] = [cell["loss"] for cell in record["eval"].values()]
    assert losses["--compile"] == pytest.approx(losses["--no-compile"], rel=1e-3)


# -- the paper preset ----------------------------------------------------------------------------

def test_paper_preset_is_press_et_al_table_2():
    """16 layers, d 1024, 8 heads, FFN 4096 (Baevski & Auli's model, Press et al. 2022 section
    4), trained at L = 512, the rows of Table 2, evaluated at its lengths' ratios to L."""
    config = preset_config("paper")
    assert (config.model.d_model, config.model.num_layers, config.model.num_heads, config.model.mlp_ratio) == (1024, 16, 8, 4)
    assert config.train_len == 512 and config.encodings == ("sinusoidal", "rope", "t5", "alibi")
    paper = (512, 1012, 1512, 2512, 3512, 15512)  # Table 2's evaluation lengths
    assert [round(length / 512) for length in paper] == list(config.eval_factors)


def test_paper_preset_hours_follow_the_flops():
    config = preset_config("paper")
    parameters = 200_000_000
    tokens = config.train.steps * config.train.batch_size * 512
    by_hand = 4 * (6 * parameters + 6 * 16 * 512 * 1024) * tokens / (0.15 * 989e12) / 3600
    assert paper_hours(config, parameters, 1) == pytest.approx(by_hand)
    assert paper_hours(config, parameters, 8) == pytest.approx(by_hand / 8)


def test_paper_preset_is_refused_on_a_cpu_with_its_estimate(tmp_path, capsys):
    assert main(["extrapolate", "--preset", "paper", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "days on a CPU" in err and "h on one H100" in err and "--device cuda" in err
    assert not (tmp_path / "out" / "runs").exists()  # refused before anything was written
