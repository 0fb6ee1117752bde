"""Train short, test long: which encodings keep working past their training length.

For each (encoding, seed): train the byte-level LM at length L, then measure validation loss
at L, 2L, 4L, ... (non-overlapping windows; all tokens, and the last L tokens of each window).
Each finished run is written atomically under ``out/runs/`` and training checkpoints under
``out/checkpoints/``, so an interrupted sweep resumes where it stopped and never retrains what
it finished; the same arguments give the same results on CPU.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import __version__
from ..data import Corpus
from ..encodings import REGISTRY, encoding_class
from .._validation import check_positive_int
from ..evaluate import LengthResult, evaluate_length
from ..model import LMConfig, TransformerLM
from ..rope import EXTENSION_METHODS
from ..train import TrainConfig, train_lm
from ..checkpoint import CheckpointMismatch, atomic_write_json, read_json
from . import distributed

#: The six encodings of the default run.
CORE_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")


@dataclass(frozen=True)
class ExtrapolationConfig:
    """Everything that determines the results of ``posenc extrapolate``.

    ``learned_positions`` sizes the learned absolute table (default: the longest evaluation
    length, so rows past L exist but are never trained); lengths past the table are reported
    as not applicable.

    ``rope_scaling`` and ``finetune_*`` add rows for the trained rope model extended with
    RoPE scalings, at inference and after a short fine-tune at ``finetune_factor`` x L
    (:mod:`posenc.experiments.rope_extension`); ``finetune_lr`` None means lr / 10 and the
    fine-tune's batch is batch_size // finetune_factor windows (the same tokens per step).
    """

    encodings: tuple[str, ...] = CORE_ENCODINGS
    train_len: int = 64
    eval_factors: tuple[int, ...] = (1, 2, 4, 8, 16)
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    d_model: int = 64
    num_layers: int = 4
    num_heads: int = 4
    seeds: tuple[int, ...] = (0,)
    eval_tokens: int = 65536
    learned_positions: int | None = None
    device: str = "cpu"
    rope_scaling: tuple[str, ...] = ()
    finetune_steps: int = 0
    finetune_factor: int = 4
    finetune_lr: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.encodings, str) or not isinstance(self.encodings, (tuple, list)):
            raise TypeError(f"encodings must be a sequence of encoding names, e.g. ('rope', 'alibi'), got {self.encodings!r}")
        if not self.encodings:
            raise ValueError("encodings: give at least one encoding")
        for name in self.encodings:
            encoding_class(name)  # unknown names raise, listing the available ones
        if len(set(self.encodings)) != len(self.encodings):
            raise ValueError(f"encodings: each name once, got {list(self.encodings)}")
        for name in ("train_len", "steps", "batch_size", "d_model", "num_layers", "num_heads", "eval_tokens"):
            check_positive_int(getattr(self, name), name)
        if not self.eval_factors or any(not isinstance(f, int) or isinstance(f, bool) or f < 1 for f in self.eval_factors):
            raise ValueError(
                "eval_factors: evaluation lengths are whole multiples >= 1 of train_len (no evaluation shorter than L), "
                f"got {self.eval_factors}"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) \
                or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds: give one or more distinct integers >= 0, got {self.seeds}")
        if self.eval_tokens < max(self.eval_lengths):
            raise ValueError(f"eval_tokens={self.eval_tokens} must be >= the longest eval length {max(self.eval_lengths)}")
        if self.learned_positions is not None:
            check_positive_int(self.learned_positions, "learned_positions")
        LMConfig(d_model=self.d_model, num_layers=self.num_layers, num_heads=self.num_heads)  # validates sizes
        self.train_config(self.seeds[0])  # validates lr
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {self.device!r}") from None
        self._check_rope_extension()

    def _check_rope_extension(self) -> None:
        unknown = [m for m in self.rope_scaling if m not in EXTENSION_METHODS]
        if unknown:
            raise ValueError(f"rope_scaling: unknown method(s) {unknown}; choose from {list(EXTENSION_METHODS)}")
        if len(set(self.rope_scaling)) != len(self.rope_scaling):
            raise ValueError(f"rope_scaling: each method once, got {list(self.rope_scaling)}")
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            raise ValueError(f"finetune_steps must be an integer >= 0, got {self.finetune_steps!r}")
        if (self.rope_scaling or self.finetune_steps) and "rope" not in self.encodings:
            raise ValueError(
                f"rope_scaling / finetune_steps extend the trained rope model: add rope to encodings (got {list(self.encodings)})"
            )
        if isinstance(self.finetune_factor, bool) or not isinstance(self.finetune_factor, int) or self.finetune_factor < 2:
            raise ValueError(f"finetune_factor must be an integer >= 2 (fine-tune at that many times L), got {self.finetune_factor!r}")
        if self.finetune_lr is not None and not (self.finetune_lr > 0 and math.isfinite(self.finetune_lr)):
            raise ValueError(f"finetune_lr must be a finite number > 0, got {self.finetune_lr!r}")

    @property
    def eval_lengths(self) -> list[int]:
        return sorted({self.train_len * f for f in self.eval_factors})

    def model_config(self) -> LMConfig:
        return LMConfig(
            d_model=self.d_model, num_layers=self.num_layers, num_heads=self.num_heads,
            max_positions=self.learned_positions or max(self.eval_lengths),
        )

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, seq_len=self.train_len, lr=self.lr, seed=seed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eval_lengths"] = self.eval_lengths
        return d


#: Named sizes. "default" reproduces the prototype's setting (< 15 min on 2 cores);
#: "quick" is a smoke run (< 3 min); "full" is the default size over every encoding.
PRESETS: dict[str, dict] = {
    "quick": dict(steps=300, num_layers=2, eval_factors=(1, 2, 4, 8), eval_tokens=16384),
    "default": {},
    "full": dict(encodings=None),
}


def preset_config(preset: str = "default", **overrides) -> ExtrapolationConfig:
    """The preset's config with ``overrides`` (None values ignored) applied.

    Raises:
        ValueError: an unknown preset (the message lists them) or an invalid override.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {preset!r}")
    values = dict(PRESETS[preset])
    if "encodings" in values and values["encodings"] is None:
        values["encodings"] = tuple(REGISTRY)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ExtrapolationConfig(**values)


class Reporter:
    """Progress callbacks of a sweep; the default does nothing (the CLI draws rich bars)."""

    def run_started(self, encoding: str, seed: int, steps: int, resumed_step: int) -> None: ...
    def train_step(self, step: int, loss: float) -> None: ...
    def eval_started(self, encoding: str, seed: int, total_windows: int) -> None: ...
    def eval_advanced(self, windows: int) -> None: ...
    def run_finished(self, encoding: str, seed: int, record: dict, skipped: bool) -> None: ...


@dataclass
class RunPaths:
    out: Path
    runs: Path = field(init=False)
    checkpoints: Path = field(init=False)

    def __post_init__(self) -> None:
        self.runs, self.checkpoints = self.out / "runs", self.out / "checkpoints"

    def run(self, encoding: str, seed: int) -> Path:
        return self.runs / f"{encoding}-seed{seed}.json"

    def checkpoint(self, encoding: str, seed: int) -> Path:
        return self.checkpoints / f"{encoding}-seed{seed}.pt"


def fingerprint(config: ExtrapolationConfig, corpus: Corpus, encoding: str, seed: int) -> dict:
    """What a run's result depends on; a stored run is reused only if this matches exactly."""
    return {
        "posenc_version": __version__,
        "encoding": encoding,
        "seed": seed,
        "model": config.model_config().to_dict(),
        "train": config.train_config(seed).to_dict(),
        "eval_lengths": config.eval_lengths,
        "eval_tokens": config.eval_tokens,
        "corpus": {k: corpus.info[k] for k in ("name", "bytes", "train_bytes", "val_bytes")},
    }


#: Steps between training checkpoints. Not a user option (it changes no result); the
#: environment variable ``POSENC_CHECKPOINT_EVERY`` overrides it so that the kill-and-resume
#: test can land a SIGKILL between two checkpoints of a tiny run.
CHECKPOINT_EVERY = 250


def _checkpoint_every() -> int:
    value = os.environ.get("POSENC_CHECKPOINT_EVERY", "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else CHECKPOINT_EVERY


def _windows_at(length: int, config: ExtrapolationConfig, corpus: Corpus) -> int:
    return min(config.eval_tokens, corpus.val.numel() - 1) // length


def stored_run(config: ExtrapolationConfig, corpus: Corpus, encoding: str, seed: int, paths: RunPaths) -> dict | None:
    """The finished record of (encoding, seed) under ``paths``, or None if there is none.

    Raises:
        CheckpointMismatch: the record is corrupt, or was made with other arguments or
            another posenc version.
    """
    run_path = paths.run(encoding, seed)
    if not run_path.exists():
        return None
    record = read_json(run_path)
    if record.get("fingerprint") != fingerprint(config, corpus, encoding, seed):
        raise CheckpointMismatch(
            f"--out: {run_path} holds a run with other arguments or another posenc version; "
            "use another --out folder or delete it"
        )
    return record


def run_one(
    config: ExtrapolationConfig, corpus: Corpus, encoding: str, seed: int, paths: RunPaths, reporter: Reporter
) -> dict:
    """Train and evaluate one (encoding, seed), or load its finished record."""
    expected = fingerprint(config, corpus, encoding, seed)
    run_path = paths.run(encoding, seed)
    record = stored_run(config, corpus, encoding, seed, paths)
    if record is not None:
        reporter.run_finished(encoding, seed, record, skipped=True)
        return record

    torch.manual_seed(seed)
    model = TransformerLM(config.model_config(), encoding).to(config.device)
    train_config = config.train_config(seed)
    started = time.perf_counter()
    losses = train_lm(
        model, corpus.train, train_config,
        on_step=reporter.train_step,
        checkpoint_path=paths.checkpoint(encoding, seed),
        checkpoint_every=_checkpoint_every(),
        fingerprint=expected,
        on_resume=lambda step: reporter.run_started(encoding, seed, train_config.steps, step),
    )
    train_seconds = time.perf_counter() - started

    total_windows = sum(
        _windows_at(n, config, corpus) for n in config.eval_lengths if _applicable(model, n)
    )
    reporter.eval_started(encoding, seed, total_windows)
    evals, not_applicable = {}, {}
    for length in config.eval_lengths:
        if not _applicable(model, length):
            not_applicable[str(length)] = f"the encoding represents at most {model.max_positions} positions"
            continue
        done_before = 0

        def advance(done: int) -> None:
            nonlocal done_before
            reporter.eval_advanced(done - done_before)
            done_before = done

        result = evaluate_length(model, corpus.val, length, config.train_len, max_tokens=config.eval_tokens, on_batch=advance)
        evals[str(length)] = _length_record(result)
    record = {
        "fingerprint": expected,
        "encoding": encoding,
        "seed": seed,
        "train_len": config.train_len,
        "parameters": model.num_parameters(),
        "train_seconds": round(train_seconds, 3),
        "tokens_per_second": round(train_config.steps * train_config.batch_size * train_config.seq_len / max(train_seconds, 1e-9)),
        "final_train_loss": sum(losses[-50:]) / len(losses[-50:]) if losses else None,
        "eval": evals,
        "not_applicable": not_applicable,
    }
    atomic_write_json(run_path, record)
    reporter.run_finished(encoding, seed, record, skipped=False)
    return record


def _applicable(model: TransformerLM, length: int) -> bool:
    return model.max_positions is None or length <= model.max_positions


def _length_record(result: LengthResult) -> dict:
    return {
        "loss": result.loss, "ppl": result.ppl, "loss_last": result.loss_last,
        "bits_per_byte": result.bits_per_byte, "windows": result.windows, "tokens": result.tokens,
    }


def aggregate(config: ExtrapolationConfig, records: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """Per encoding (or per row ``names``, default the config's encodings): mean over seeds of
    every metric, the seeds' spread, and each run.

    Wall-clock figures (train_seconds, tokens_per_second) stay in the run records under
    ``runs/``: results.json holds only what the arguments determine, so the same seed gives
    the same file."""
    results: dict[str, dict] = {}
    for encoding in names if names is not None else config.encodings:
        runs = [r for r in records if r["encoding"] == encoding]
        evals: dict[str, dict] = {}
        for length in map(str, config.eval_lengths):
            cells = [r["eval"][length] for r in runs if length in r["eval"]]
            if not cells:
                continue
            loss = statistics.fmean(c["loss"] for c in cells)
            loss_last = statistics.fmean(c["loss_last"] for c in cells)
            evals[length] = {
                "loss": loss, "ppl": math.exp(loss), "loss_last": loss_last,
                "bits_per_byte": loss / math.log(2), "bits_per_byte_last": loss_last / math.log(2),
                "loss_std": statistics.stdev(c["loss"] for c in cells) if len(cells) > 1 else 0.0,
                "seeds": len(cells),
            }
        not_applicable = {k: v for r in runs for k, v in r["not_applicable"].items()}
        results[encoding] = {
            "train_len": config.train_len,
            "eval": evals,
            "not_applicable": not_applicable,
            "parameters": runs[0]["parameters"],
            "runs": {str(r["seed"]): r["eval"] for r in runs},
        }
        if "extension" in runs[0]:
            results[encoding]["extension"] = runs[0]["extension"]
    return results


def run_extrapolation(config: ExtrapolationConfig, corpus: Corpus, out: Path, reporter: Reporter | None = None) -> dict | None:
    """Run (or resume) the sweep; write results.json, results.csv; return the results dict
    ``{"config": ..., "corpus": ..., "results": {encoding: {"train_len", "eval": {length: {"loss", "ppl", ...}}}}}``
    with losses in nats per token.

    In a torch.distributed group (torchrun, see :mod:`posenc.experiments.distributed`) each
    rank does its share of the (encoding, seed) runs; rank 0 merges them after a barrier and
    returns the dict, the other ranks return None."""
    reporter = reporter or Reporter()
    paths = RunPaths(Path(out))
    min_val = max(config.eval_lengths) + 1
    if corpus.val.numel() < min_val:
        raise ValueError(f"corpus: the validation split ({corpus.val.numel()} bytes) is shorter than the longest eval length + 1 ({min_val})")
    if corpus.train.numel() < config.train_len + 1:
        raise ValueError(f"corpus: the training split ({corpus.train.numel()} bytes) is shorter than train_len + 1")
    pairs = [(encoding, seed) for encoding in config.encodings for seed in config.seeds]
    shard = distributed.current()  # rank 0 of 1 unless under torchrun
    mine = {pair: run_one(config, corpus, *pair, paths, reporter) for pair in shard.take(pairs)}
    distributed.barrier()
    if not shard.is_main:
        return None
    records = [mine[pair] if pair in mine else stored_run(config, corpus, *pair, paths) for pair in pairs]
    missing = [f"{e}-seed{s}" for (e, s), r in zip(pairs, records) if r is None]
    if missing:
        raise RuntimeError(f"runs missing after every rank finished: {missing}")
    names = list(config.encodings)
    if config.rope_scaling or config.finetune_steps:
        # imported here: rope_extension builds on this module's run bookkeeping. Rank 0 runs
        # the extension rows after every rank has finished its share (it needs rope's model).
        from .rope_extension import extension_rows, run_rope_extension

        records += run_rope_extension(config, corpus, paths, reporter)
        names += extension_rows(config)
    summary = {
        "config": {**config.to_dict(), "posenc_version": __version__},
        "corpus": corpus.info,
        "results": aggregate(config, records, names),
    }
    atomic_write_json(paths.out / "results.json", summary)
    write_csv(paths.out / "results.csv", summary)
    return summary


def write_csv(path: Path, summary: dict) -> None:
    """One row per (encoding, length): mean losses (nats), perplexity, bits per byte."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["encoding", "train_len", "eval_len", "loss", "loss_last", "ppl", "bits_per_byte", "loss_std", "seeds"])
        for encoding, res in summary["results"].items():
            for length in summary["config"]["eval_lengths"]:
                cell = res["eval"].get(str(length))
                if cell is None:
                    writer.writerow([encoding, res["train_len"], length, "", "", "", "", "", 0])
                    continue
                writer.writerow([
                    encoding, res["train_len"], length, f"{cell['loss']:.6f}", f"{cell['loss_last']:.6f}",
                    f"{cell['ppl']:.6f}", f"{cell['bits_per_byte']:.6f}", f"{cell['loss_std']:.6f}", cell["seeds"],
                ])
    tmp.replace(path)

