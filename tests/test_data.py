import pytest
import torch

from posenc.lab.data import CorpusError, is_validation, load_corpus, random_windows


@pytest.fixture(scope="module")
def stdlib():
    return load_corpus()


def test_default_corpus_is_the_stdlib_source(stdlib):
    info = stdlib.info
    assert info["files"] > 300 and info["bytes"] > 3_000_000
    assert info["train_files"] + info["val_files"] == info["files"]
    assert stdlib.train.dtype == torch.uint8 and stdlib.train.numel() == info["train_bytes"]
    assert 0.03 < info["val_bytes"] / info["bytes"] < 0.3
    assert b"def " in bytes(stdlib.val[:200000].tolist())


def test_split_is_stable_and_by_file():
    assert is_validation("json/decoder.py", 0.1) == is_validation("json/decoder.py", 0.1)
    shares = [is_validation(f"pkg/file{i}.py", 0.1) for i in range(4000)]
    assert 0.08 < sum(shares) / len(shares) < 0.12


def test_folder_corpus(tmp_path):
    for i in range(30):
        (tmp_path / f"doc{i}.txt").write_text(f"document {i} " * 50)
    (tmp_path / "image.bin").write_bytes(b"\x00\x01\x02" * 100)
    corpus = load_corpus(tmp_path)
    assert corpus.info["files"] == 30
    assert corpus.train.numel() + corpus.val.numel() == sum(len(f"document {i} " * 50) for i in range(30))


def test_file_corpus_splits_by_bytes(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("abcdefghij" * 100)
    corpus = load_corpus(path)
    assert corpus.train.numel() == 900 and corpus.val.numel() == 100


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("setup, match", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: _write(p / "empty.txt", b""), "holds no text"),
    (lambda p: _write(p / "blob", b"\x00" * 64), "holds no text"),
    (lambda p: (p / "dir").mkdir() or p / "dir", "no text files"),
    (lambda p: (p / "bin").mkdir() or _write(p / "bin" / "x.bin", b"\x00\x01") and p / "bin", "no text files"),
])
def test_bad_corpus_paths(tmp_path, setup, match):
    with pytest.raises(CorpusError, match=match):
        load_corpus(setup(tmp_path))


def test_random_windows_are_shifted_targets():
    data = torch.arange(100, dtype=torch.uint8)
    x, y = random_windows(data, 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and x.dtype == torch.long
    torch.testing.assert_close(y[:, :-1], x[:, 1:])
    torch.testing.assert_close(y[:, 0], x[:, 0] + 1)
    with pytest.raises(ValueError, match="shorter than one window"):
        random_windows(data[:5], 1, 10, torch.Generator())


def test_corpus_names_hold_no_absolute_path(tmp_path):
    """Results and figures name the corpus; they must not show the machine's install path."""
    folder = tmp_path / "my_texts"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world, " * 200)
    (folder / "b.txt").write_text("another text. " * 200)
    assert load_corpus(folder).info["name"] == "my_texts"
    assert load_corpus(folder / "a.txt").info["name"] == "a.txt"
    default = load_corpus().info["name"]
    assert default.startswith("python-stdlib-") and "/" not in default and "\\" not in default
