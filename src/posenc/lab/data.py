"""Corpora and byte-level batching.

The embedded default corpus is the Python standard library source of the running
interpreter: real text, megabytes of it, on every machine with no download. Text is a byte
sequence (vocabulary 256); the train/validation split is by file, decided by a stable hash of
each file's relative path, so it does not change between runs or machines.

A Hugging Face ``datasets`` dataset is a corpus too (the optional ``data`` extra,
``pip install 'posenc[data]'``): by name, ``NAME[:CONFIG]`` (e.g.
``Salesforce/wikitext:wikitext-103-raw-v1``, the ALiBi paper's WikiText-103), or a folder
written by ``save_to_disk``. Its "train" split is the training text and its "validation" (else
"test") split the validation text; each row's text column is one line (a newline is added to a
row that lacks one).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from posenc.errors import InvalidArgument, InvalidType

#: Folder names left out of the stdlib corpus: test suites (much generated, repetitive
#: text) and third-party packages.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


class CorpusError(InvalidArgument):
    """A corpus path that does not exist, or holds no text."""


@dataclass
class Corpus:
    """Train and validation bytes (uint8 tensors) and a description of where they came from."""

    train: Tensor
    val: Tensor
    info: dict = field(default_factory=dict)

    def describe(self) -> str:
        i = self.info
        unit = i.get("unit", "files")
        return (
            f"{i['name']}: {i['files']} {unit}, {i['bytes']:,} bytes; split by {i['split']}: "
            f"train {i['train_files']} {unit} / {i['train_bytes']:,} bytes, "
            f"validation {i['val_files']} {unit} / {i['val_bytes']:,} bytes"
        )


def is_validation(relative_path: str, val_fraction: float) -> bool:
    """Stable split: the first 8 bytes of sha256(path) as a fraction of 2^64."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


#: Bytes of a file read to tell text from binary (its head: a folder of large binary files is
#: sorted out without reading them whole).
TEXT_SAMPLE = 8192

#: C0 control bytes that plain text does not hold (tab, newlines, form feed and escape do
#: occur in text); in random binary data about one byte in ten is one of these.
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\v\f\r\x1b") + b"\x7f"


def _looks_like_text(data: bytes) -> bool:
    """Whether ``data`` (a file's head, or all of it) is text: not empty, no NUL byte, and UTF-8
    or, in an 8-bit encoding (latin-1, cp1252: the model reads bytes), under 1% control bytes."""
    sample = data[:TEXT_SAMPLE]
    if not sample or b"\x00" in sample:
        return False
    try:
        sample.decode("utf-8")
        return True
    except UnicodeDecodeError as err:
        if err.start > len(sample) - 4:  # a multi-byte character cut at the sample's end
            return True
    controls = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    return controls < 0.01 * len(sample)


def _read_head(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(TEXT_SAMPLE)
    except OSError as err:
        raise CorpusError(f"corpus: {path} cannot be read ({err.strerror or type(err).__name__})") from err


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in sorted(root.rglob("*.py"))
        if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]) and p.is_file()
    ]
    return root, files


def _split_files(name: str, root: Path, files: list[Path], val_fraction: float) -> Corpus:
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    counts = {False: 0, True: 0}
    for path in files:
        if not _looks_like_text(_read_head(path)):  # binary: skipped unread
            continue
        data = _read(path)
        val = is_validation(path.relative_to(root).as_posix(), val_fraction)
        parts[val].append(data)
        counts[val] += 1
    if counts[False] + counts[True] == 0:
        raise CorpusError(f"corpus: no text files under {root}")
    if counts[False] == 0 or counts[True] == 0:
        # Too few files for a by-file split: fall back to the last fraction of the bytes.
        return _split_bytes(name, b"".join(parts[False] + parts[True]), val_fraction, counts[False] + counts[True])
    train, val = b"".join(parts[False]), b"".join(parts[True])
    info = {
        "name": name, "files": counts[False] + counts[True], "bytes": len(train) + len(val),
        "split": f"file (sha256 of relative path, val_fraction={val_fraction})",
        "train_files": counts[False], "val_files": counts[True], "train_bytes": len(train), "val_bytes": len(val),
    }
    return Corpus(_to_tensor(train), _to_tensor(val), info)


def _split_bytes(name: str, data: bytes, val_fraction: float, files: int = 1) -> Corpus:
    cut = int(len(data) * (1 - val_fraction))
    if cut < 2 or len(data) - cut < 2:
        raise CorpusError(f"corpus: {name} holds too little text to split ({len(data)} bytes)")
    info = {
        "name": name, "files": files, "bytes": len(data),
        "split": f"bytes (last {val_fraction:.0%} is validation)",
        "train_files": files, "val_files": files, "train_bytes": cut, "val_bytes": len(data) - cut,
    }
    return Corpus(_to_tensor(data[:cut]), _to_tensor(data[cut:]), info)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise CorpusError(f"corpus: {path} cannot be read ({err.strerror or type(err).__name__})") from err


def _to_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def load_corpus(path: str | Path | None = None, *, val_fraction: float = 0.1) -> Corpus:
    """Load a corpus of bytes and split it into train and validation.

    Args:
        path: None for the embedded default (the Python standard library's ``.py`` files,
            test folders and site-packages excluded), a text file (split by bytes: the last
            ``val_fraction`` is validation), a folder of text files (split by file; binary
            files skipped, told by their first 8 KiB: no NUL byte, UTF-8 or under 1% control
            bytes, so latin-1 text is text), a folder written by Hugging Face ``datasets``'
            ``save_to_disk``, or, when no such path exists and the name does not look like a
            path (:func:`looks_like_path`), a Hugging Face dataset name ``NAME[:CONFIG]``
            (:func:`load_dataset_corpus`). ``~`` is expanded.
        val_fraction: share of files (or bytes) for validation, in (0, 1); for a dataset
            without a validation or test split, the last share of its bytes.

    Raises:
        CorpusError (a ValueError): the path is empty, does not exist (and is not a dataset
            name), cannot be read, or holds no text; a dataset that cannot be loaded (``datasets`` not
            installed, not found, no text column).
        ValueError: val_fraction not in (0, 1). TypeError: path not a str or path.
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise InvalidArgument(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InvalidType(f"path must be a str or os.PathLike (a file or folder), got {type(path).__name__}")
    if path is None:
        root, files = _stdlib_files()
        # Named by the Python version, not the install path: results and figures travel between machines.
        return _split_files(f"python-stdlib-{sys.version_info.major}.{sys.version_info.minor}", root, files, val_fraction)
    name = str(path)
    if not name.strip():
        raise CorpusError(f"corpus: give a text file, a folder or a dataset name, got {name!r}")
    path = Path(path).expanduser()
    if not path.exists():
        if _DATASET_NAME.fullmatch(name) and not looks_like_path(name):
            try:
                return load_dataset_corpus(name, val_fraction=val_fraction)
            except CorpusError as err:  # a mistyped file name looks like a dataset name too
                raise CorpusError(f"corpus: {path} does not exist; as a Hugging Face dataset name: "
                                  f"{str(err).removeprefix('corpus: ')}") from None
        raise CorpusError(f"corpus: {path} does not exist")
    if path.is_dir() and _saved_dataset(path):
        return load_dataset_corpus(path, val_fraction=val_fraction)
    if path.is_file():
        if not _looks_like_text(_read_head(path)):
            raise CorpusError(f"corpus: {path} holds no text (empty or binary)")
        data = _read(path)
        return _split_bytes(_corpus_name(path), data, val_fraction)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return _split_files(_corpus_name(path), path, files, val_fraction)


#: A Hugging Face dataset name, ``NAME`` or ``OWNER/NAME``, with an optional ``:CONFIG``.
_DATASET_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?")
#: Extensions of files, never of a Hugging Face dataset's name: a missing ``corpus.txt`` is a
#: mistyped file, looked up on the Hub by no one.
_FILE_SUFFIXES = frozenset({".txt", ".text", ".md", ".rst", ".json", ".jsonl", ".csv", ".tsv", ".py", ".c", ".h",
                            ".html", ".xml", ".log", ".gz", ".bz2", ".xz", ".zip", ".tar", ".parquet", ".arrow"})


def looks_like_path(name: str) -> bool:
    """Whether a corpus name that names no existing file is still meant as a path (and so is
    reported missing at once, without asking the Hugging Face Hub): it starts with ``.``,
    ``~`` or ``/``, holds a backslash or two ``/``, ends in a file extension, or its first
    part is an existing folder (``data/wiki.txt`` where ``data/`` exists)."""
    first = name.split("/", 1)[0]
    return (name.startswith((".", "~", "/")) or "\\" in name or name.count("/") > 1
            or Path(name).suffix.lower() in _FILE_SUFFIXES or ("/" in name and Path(first).is_dir()))


#: Preferred validation splits, in order.
_VALIDATION_SPLITS = ("validation", "valid", "val", "test")


def _saved_dataset(folder: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return (folder / "dataset_dict.json").is_file() or ((folder / "state.json").is_file()
                                                         and (folder / "dataset_info.json").is_file())


def _datasets():
    try:
        return importlib.import_module("datasets")
    except ImportError:
        raise CorpusError(
            "corpus: a Hugging Face dataset needs the datasets package: pip install 'posenc[data]'"
        ) from None


def load_dataset_corpus(source: str | Path, *, val_fraction: float = 0.1) -> Corpus:
    """A Hugging Face ``datasets`` dataset as a byte corpus.

    Args:
        source: a folder written by ``save_to_disk`` (a Path, or a str naming an existing
            folder), or a dataset name ``NAME[:CONFIG]`` for ``datasets.load_dataset(NAME,
            CONFIG)`` (downloaded and cached by ``datasets``).
        val_fraction: for a dataset without a validation split: the last share of the
            training text's bytes is validation.

    The "train" split (or the only one) is the training text, the first of "validation",
    "valid", "val", "test" the validation text; the text is the "text" column, or the only
    string column; rows are joined, each ending in a newline.

    Raises:
        CorpusError: ``datasets`` not installed; the dataset cannot be loaded; no text column;
            no training split; too little text.
    """
    datasets = _datasets()
    folder = Path(source)
    try:
        if folder.is_dir():
            loaded, name = datasets.load_from_disk(str(folder)), _corpus_name(folder)
        else:
            dataset, _, config = str(source).partition(":")
            loaded, name = datasets.load_dataset(dataset, config or None), str(source)
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds (not found, offline, bad config)
        detail = " ".join(str(err).split())[:300]
        raise CorpusError(f"corpus: the Hugging Face dataset {source} cannot be loaded ({type(err).__name__}: {detail})") from None
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if "train" not in splits:
        if len(splits) != 1:
            raise CorpusError(f"corpus: the dataset {source} has no 'train' split (splits: {sorted(splits)})")
        splits = {"train": next(iter(splits.values()))}
    val_split = next((s for s in _VALIDATION_SPLITS if s in splits), None)
    train_text = _dataset_text(splits["train"], source)
    if val_split is None:
        corpus = _split_bytes(name, train_text, val_fraction, files=len(splits["train"]))
        corpus.info.update(unit="rows", split=f"bytes of the train split (last {val_fraction:.0%} is validation)")
        return corpus
    val_text = _dataset_text(splits[val_split], source)
    if len(train_text) < 2 or len(val_text) < 2:
        raise CorpusError(f"corpus: the dataset {source} holds too little text")
    info = {
        "name": name, "files": len(splits["train"]) + len(splits[val_split]), "unit": "rows",
        "bytes": len(train_text) + len(val_text), "split": f"dataset splits (train / {val_split})",
        "train_files": len(splits["train"]), "val_files": len(splits[val_split]),
        "train_bytes": len(train_text), "val_bytes": len(val_text),
    }
    return Corpus(_to_tensor(train_text), _to_tensor(val_text), info)


def _dataset_text(split, source) -> bytes:
    """The split's text column as UTF-8 bytes, one row per line."""
    columns = split.column_names
    strings = [c for c in columns if getattr(split.features.get(c), "dtype", None) in ("string", "large_string")]
    column = "text" if "text" in columns else strings[0] if len(strings) == 1 else None
    if column is None:
        raise CorpusError(f"corpus: the dataset {source} has no 'text' column and not exactly one string column "
                          f"(columns: {columns})")
    return "".join(row if row.endswith("\n") else row + "\n" for row in split[column]).encode("utf-8")


def _corpus_name(path: Path) -> str:
    """The file or folder's own name: no absolute path of the machine that ran it."""
    return path.resolve().name or str(path)


def random_windows(data: Tensor, batch_size: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A batch of random windows: inputs and next-byte targets, both int64 (B, length).

    Raises:
        ValueError: the data is shorter than one window of ``length + 1`` bytes.
    """
    if data.numel() < length + 1:
        raise InvalidArgument(f"the training data ({data.numel()} bytes) is shorter than one window of {length + 1}")
    starts = torch.randint(0, data.numel() - length, (batch_size,), generator=generator)
    window = data[starts.unsqueeze(1) + torch.arange(length + 1)].long()
    return window[:, :-1], window[:, 1:]


def encode_text(text: str) -> Tensor:
    """The byte tokenizer: ``text`` as UTF-8 bytes, int64 (T,), values in [0, 256).

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise InvalidType(f"text must be a str, got {type(text).__name__}")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode_bytes(tokens: Tensor) -> str:
    """Byte tokens (T,) back to text; bytes that are not valid UTF-8 (a character cut by the
    end of a generation) become U+FFFD (``errors="replace"``)."""
    return bytes(tokens.tolist()).decode("utf-8", errors="replace")
