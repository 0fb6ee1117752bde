"""Issue 22, item 5: what the bad-input table (tests/test_bad_inputs.py, CLI_CASES) cannot say in
one row: the memory estimate against a hand count, free space and writability of --out, the
corpus text rule, figure paths, `posenc` alone, strict JSON results."""

import json
import math

import pytest

from posenc.lab.cli import main
from posenc.lab.data import load_corpus
from posenc.lab.experiments import limits
from posenc.lab.experiments.limits import (
    Workload,
    check_memory,
    check_out_folder,
    estimate_bytes,
)
from posenc.lab.experiments.runs import RunStore
from posenc.lab.model import LMConfig


def test_memory_estimate_matches_a_hand_count():
    # d=8, 1 layer, 2 heads, MLP x4, vocabulary 256; training a batch of 2 x 4 tokens.
    # parameters: embedding + head 2*256*8 = 4096, layer (4 + 2*4) * 8*8 = 768 -> 4864
    # weights, gradients, two AdamW moments: 4864 * 4 bytes * 4 = 77824
    # scores 2*2*4*4 floats = 256 B; logits 8*256 floats twice = 16384 B; activations 8*8*18 floats = 4608 B
    model = LMConfig(d_model=8, num_layers=1, num_heads=2, mlp_ratio=4, max_positions=16)
    assert estimate_bytes(Workload("t", model, 2, 4, training=True)) == 77824 + 256 + 16384 + 4608
    # a learned table adds max_positions x d parameters (16 * 8 = 128, x 16 bytes in training)
    assert estimate_bytes(Workload("t", model, 2, 4, training=True, table=True)) == 77824 + 128 * 16 + 256 + 16384 + 4608


def test_memory_check_refuses_only_past_the_free_memory(monkeypatch):
    model = LMConfig(d_model=8, num_layers=1, num_heads=2)
    work = Workload("training (test)", model, 2, 4, training=True)
    need = estimate_bytes(work)
    monkeypatch.setattr(limits, "available_bytes", lambda device: need)
    check_memory([work], "cpu")  # exactly fits
    with pytest.raises(limits.InvalidArgument, match=r"training \(test\) with 4,864 parameters x 2 runs at once needs"):
        check_memory([work], "cpu", concurrent=2)
    monkeypatch.setattr(limits, "available_bytes", lambda device: None)  # unknown: not checked
    check_memory([work], "cpu", concurrent=10**6)


def test_out_folder_short_of_space_is_refused(tmp_path, monkeypatch):
    class Usage:
        free = limits.MIN_FREE_BYTES - 1

    monkeypatch.setattr(limits.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(limits.InvalidArgument, match=r"--out: .* MiB free on its file system; the run needs at least 64 MiB"):
        check_out_folder(tmp_path / "out")
    assert not (tmp_path / "out").exists()  # checked, not created


def test_out_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(limits.InvalidArgument, match=r"cannot be created: .*f is a file"):
        check_out_folder(tmp_path / "f" / "out")


def test_extrapolate_checks_out_before_reading_the_corpus(tmp_path, monkeypatch, capsys):
    # a full disk was found at the first checkpoint, after training had started
    class Usage:
        free = 0

    monkeypatch.setattr(limits.shutil, "disk_usage", lambda path: Usage)
    monkeypatch.setattr("posenc.lab.data.load_corpus", lambda *a, **k: pytest.fail("corpus read before --out was checked"))
    code = main(["extrapolate", "--preset", "quick", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "MiB free on its file system" in err, err


def test_latin1_text_is_a_corpus_byte_for_byte(tmp_path):
    text = ("Café, naïve, résumé; déjà vu à Zürich. " * 100).encode("latin-1")
    path = tmp_path / "latin1.txt"
    path.write_bytes(text)
    corpus = load_corpus(path)
    assert bytes(corpus.train.tolist()) + bytes(corpus.val.tolist()) == text


def test_binary_files_of_a_folder_are_not_read_whole(tmp_path, monkeypatch):
    from posenc.lab import data

    (tmp_path / "a.txt").write_text("hello world\n" * 200)
    (tmp_path / "b.txt").write_text("other words\n" * 200)
    with open(tmp_path / "big.bin", "wb") as handle:  # sparse: NUL bytes, 1 GiB
        handle.truncate(2**30)
    read = []
    real = data._read
    monkeypatch.setattr(data, "_read", lambda path: read.append(path.name) or real(path))
    corpus = load_corpus(tmp_path)
    assert sorted(read) == ["a.txt", "b.txt"] and corpus.info["files"] == 2


@pytest.mark.parametrize("sample, text", [
    (b"plain ascii\n", True), ("utf-8 \u00e9\u00e8\n".encode(), True), ("latin-1 \u00e9\u00e8\n".encode("latin-1"), True),
    (b"\x00abc", False), (bytes(range(1, 256)) * 4, False), (b"", False),
])
def test_text_rule(sample, text):
    from posenc.lab.data import _looks_like_text

    assert _looks_like_text(sample) is text


def test_plot_out_folder_writes_name_png_in_it(tmp_path, capsys):
    folder = tmp_path / "figs"
    folder.mkdir()
    assert main(["plot", "rope", "--out", str(folder)]) == 0
    assert (folder / "rope.png").stat().st_size > 0 and not (tmp_path / "figs.png").exists()
    assert f"wrote {folder / 'rope.png'}" in capsys.readouterr().out.replace("\n", "")


def test_posenc_alone_prints_help_without_an_error_line(capsys):
    code = main([])
    out, err = capsys.readouterr()
    assert code == 2 and "Usage" in out and err == ""


def test_results_json_is_strict(tmp_path):
    store = RunStore(tmp_path)
    path = store.write_json("results.json", {"a": math.nan, "b": [1.0, math.inf], "c": {"d": -math.inf}})

    def refuse(token):
        raise AssertionError(f"bare {token} in results.json")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"a": None, "b": [1.0, None], "c": {"d": None}}


def test_a_record_with_a_non_finite_number_is_never_stored(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(limits.InvalidArgument, match=r"rope seed 0: .*non-finite number .*nothing of it is stored"):
        store.write("rope", 0, {"fingerprint": {}, "eval": {"64": {"loss": math.nan}}})
    assert not store.record_path("rope", 0).exists()
