"""Train short, test long: which encodings keep working past their training length.

For each (encoding, seed): train the byte-level LM at length L, then measure validation loss
at L, 2L, 4L, ... (non-overlapping windows; all tokens, and the last L tokens of each window).
Every run is a record of a :class:`~posenc.lab.experiments.runs.RunStore` on the ``out`` folder
(training checkpoints beside them), so an interrupted sweep resumes where it stopped and never
retrains what it finished; the same arguments give the same results on CPU. Row providers
(:mod:`posenc.lab.experiments.rows`) add rows built on the trained models, e.g. the RoPE
extensions of :mod:`posenc.lab.experiments.rope_extension`.

The config, presets and options live in :mod:`posenc.lab.experiments.extrapolation_config` and are
re-exported here.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import torch

from posenc._version import __version__
from posenc.lab.checkpoint import atomic_write_bytes
from posenc.lab.data import Corpus
from posenc.lab.model import TransformerLM
from posenc.lab.experiments.extension_report import has_extension_rows
from posenc.lab.experiments.extension_report import summary_markdown as extension_summary
from posenc.lab.experiments.extrapolation_config import CORE_ENCODINGS, OPTIONS, PRESETS, ExtrapolationConfig, preset_config
from posenc.lab.experiments.frame import cells_over_seeds, evals_by_seed, merged_not_applicable, spread
from posenc.lab.experiments.frame import write_csv as write_csv_rows
from posenc.lab.experiments.lm import evaluate_lengths, load_trained, passkey_map, passkey_means, train_run
from posenc.lab.experiments.rope_extension import RopeExtension
from posenc.lab.experiments.rows import BaseRun, RowProvider
from posenc.lab.experiments.runs import Reporter, RunStore, is_diverged
from posenc.errors import InvalidArgument

__all__ = [
    "CORE_ENCODINGS", "OPTIONS", "PRESETS", "ROW_PROVIDERS", "ExtrapolationConfig", "Reporter", "aggregate",
    "fingerprint", "load_trained_base", "preset_config", "run_extrapolation", "train_and_evaluate", "write_csv",
]

#: The sources of extra rows, asked in this order; each is off unless the config asks for its rows.
ROW_PROVIDERS: tuple[RowProvider, ...] = (RopeExtension(),)


def fingerprint(config: ExtrapolationConfig, corpus: Corpus, encoding: str, seed: int) -> dict:
    """What a run's result depends on; a stored run is reused only if this matches exactly.
    ``encoding`` is a trained row (:attr:`ExtrapolationConfig.rows`). The options an encoding
    takes from L (:meth:`ExtrapolationConfig.encoding_options`) are in it as
    ``encoding_options`` when there are any, and the sliding-window stride as ``eval_stride``
    when set, so the other rows' fingerprints are unchanged."""
    row = config.row(encoding)
    _, train = config.row_run(row, seed)
    return config.run_fingerprint({
        "encoding": row,
        "encoding_options": config.encoding_options(row),
        "seed": seed,
        "model": config.model_config().to_dict(),
        "train": train.to_dict(),
        "eval_lengths": config.eval_lengths,
        "eval_tokens": config.eval_tokens,
        "corpus": {k: corpus.info[k] for k in ("name", "bytes", "train_bytes", "val_bytes")},
        "eval_stride": config.eval_stride,
        "passkey_instances": config.passkey_instances,
    })


def train_and_evaluate(
    config: ExtrapolationConfig, corpus: Corpus, encoding: str, seed: int, store: RunStore, reporter: Reporter, expected: dict,
) -> dict:
    """Train and evaluate one (row, seed); the body of its record (``expected`` is its fingerprint).
    ``encoding`` is a trained row: an encoding, or ``<encoding>+rand`` (randomized positions)."""
    torch.manual_seed(seed)
    row = config.row(encoding)
    _, train = config.row_run(row, seed)
    model = TransformerLM(config.model_config(), config.encoding(row)).to(config.device)
    training = train_run(model, corpus.train, train, store, encoding, seed, expected, reporter)
    lengths = [n for n in config.eval_lengths if _applicable(model, n)]
    precision = dict(autocast=train.autocast, compile=train.compile)
    evals = evaluate_lengths(
        model, corpus.val, lengths, train_len=config.train_len, eval_tokens=config.eval_tokens,
        row=encoding, seed=seed, reporter=reporter, **precision,
    )
    extra = {}  # the sliding-window evaluation and the passkey map, when asked
    if config.eval_stride is not None:
        extra["eval_sliding"] = evaluate_lengths(
            model, corpus.val, lengths, train_len=config.train_len, eval_tokens=config.eval_tokens,
            row=f"{encoding} (sliding, stride {config.eval_stride})", seed=seed, reporter=reporter,
            stride=config.eval_stride, **precision,
        )
    if config.passkey_instances:
        extra["passkey"] = passkey_map(model, lengths, config.passkey_instances, seed=seed)
    not_applicable = {
        str(n): f"the encoding represents at most {model.max_positions} positions"
        for n in config.eval_lengths if not _applicable(model, n)
    }
    return {
        "encoding": encoding, "seed": seed, "train_len": config.train_len, "parameters": model.num_parameters(),
        **training, "eval": evals, **extra, "not_applicable": not_applicable,
    }


def _applicable(model: TransformerLM, length: int) -> bool:
    return model.max_positions is None or length <= model.max_positions


def load_trained_base(config: ExtrapolationConfig, corpus: Corpus, store: RunStore, encoding: str, seed: int,
                      needed_for: str = "this run") -> TransformerLM:
    """The model the (encoding, seed) run of the sweep trained, from its final checkpoint in ``store``.

    Raises:
        CheckpointMismatch: the checkpoint is missing, unfinished, corrupt or from other arguments.
    """
    return load_trained(
        store, encoding, seed, fingerprint(config, corpus, encoding, seed), config.model_config(),
        config.train_config(seed), config.encoding(encoding), device=config.device, needed_for=needed_for,
    )


def aggregate(config: ExtrapolationConfig, records: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """Per encoding (or per row ``names``, default the config's encodings): mean over seeds of
    every metric, the seeds' spread, and each run.

    Wall-clock figures (train_seconds, tokens_per_second) stay in the run records under
    ``runs/``: results.json holds only what the arguments determine, so the same seed gives
    the same file."""
    results: dict[str, dict] = {}
    for encoding in names if names is not None else config.rows:
        every = [r for r in records if r["encoding"] == encoding]
        runs = [r for r in every if not is_diverged(r)]
        diverged = {str(r["seed"]): r["diverged"] for r in every if is_diverged(r)}
        if not runs:  # every seed diverged: no scores, the row says so
            results[encoding] = {"train_len": config.train_len, "eval": {}, "not_applicable": {}, "parameters": None,
                                 "runs": {}, "diverged": diverged}
            continue
        results[encoding] = {
            "train_len": config.train_len,
            "eval": _mean_over_seeds(config, [r["eval"] for r in runs]),
            "not_applicable": merged_not_applicable(runs),
            "parameters": runs[0]["parameters"],
            "runs": evals_by_seed(runs),
        }
        if diverged:
            results[encoding]["diverged"] = diverged
        if "extension" in runs[0]:
            results[encoding]["extension"] = runs[0]["extension"]
        if all("eval_sliding" in r for r in runs):
            results[encoding]["eval_sliding"] = _mean_over_seeds(config, [r["eval_sliding"] for r in runs])
        if all("passkey" in r for r in runs):
            results[encoding]["passkey"] = passkey_means([r["passkey"] for r in runs])
    return results


def _mean_over_seeds(config: ExtrapolationConfig, evals: Sequence[dict]) -> dict[str, dict]:
    """Per length: the seeds' mean loss (nats), perplexity, bits per byte, and their spread."""
    means: dict[str, dict] = {}
    for length, cells in cells_over_seeds(evals, config.eval_lengths):
        loss = statistics.fmean(c["loss"] for c in cells)
        loss_last = statistics.fmean(c["loss_last"] for c in cells)
        means[length] = {
            "loss": loss, "ppl": math.exp(loss), "loss_last": loss_last,
            "bits_per_byte": loss / math.log(2), "bits_per_byte_last": loss_last / math.log(2),
            "loss_std": spread([c["loss"] for c in cells]),
            "seeds": len(cells),
        }
    return means


#: The fields every evaluation cell of a run record holds as finite numbers (the merge
#: averages them); a stored record without them is corrupt (:class:`RunStore`).
SCORE_NUMBERS = ("loss", "loss_last")


def run_extrapolation(config: ExtrapolationConfig, corpus: Corpus, out: Path, reporter: Reporter | None = None) -> dict | None:
    """Run (or resume) the sweep; write results.json, results.csv; return the results dict
    ``{"config": ..., "corpus": ..., "results": {encoding: {"train_len", "eval": {length: {"loss", "ppl", ...}}}}}``
    with losses in nats per token.

    In a torch.distributed group (torchrun, see :mod:`posenc.lab.experiments.distributed`) each
    rank does its share of the (encoding, seed) runs; rank 0 merges them after a barrier, adds
    the row providers' rows (they need the trained models), and returns the dict; the other
    ranks return None.

    Raises:
        ValueError: the corpus is too short for the config.
        CheckpointMismatch: ``out`` holds runs made with other arguments, or corrupt ones.
    """
    reporter = reporter or Reporter()
    store = RunStore(out, scores="eval", numbers=SCORE_NUMBERS)
    min_val = max(config.eval_lengths) + 1
    if corpus.val.numel() < min_val:
        raise InvalidArgument(f"corpus: the validation split ({corpus.val.numel()} bytes) is shorter than the longest eval length + 1 ({min_val})")
    if corpus.train.numel() < config.train_len + 1:
        raise InvalidArgument(f"corpus: the training split ({corpus.train.numel()} bytes) is shorter than train_len + 1")
    jobs = [(row, seed) for row in config.rows for seed in config.seeds]
    records = store.sweep(
        jobs,
        fingerprint=lambda encoding, seed: fingerprint(config, corpus, encoding, seed),
        compute=lambda encoding, seed, expected: train_and_evaluate(config, corpus, encoding, seed, store, reporter, expected),
        reporter=reporter,
    )
    if records is None:  # not rank 0
        return None
    names = list(config.rows)
    for provider in ROW_PROVIDERS:
        rows = provider.rows(config)
        if not rows:
            continue
        for seed in config.seeds:
            record = next(r for r in records if r["encoding"] == provider.base and r["seed"] == seed)
            if is_diverged(record):  # no trained model to extend: its rows say why
                records += [{"encoding": row, "seed": seed, "diverged": f"the {provider.base} run it starts from diverged"}
                            for row in rows]
                continue
            base_row = config.trained_row(provider.base)
            base = BaseRun(
                provider.base, seed, fingerprint(config, corpus, base_row, seed),
                record=record,
                # loaded once, and only if some row of this seed is not stored yet
                model=functools.cache(functools.partial(
                    load_trained_base, config, corpus, store, base_row, seed, provider.options)),
            )
            records += provider.run(config, corpus, store, reporter, base)
        names += rows
    summary = {
        "config": {**config.to_dict(), "posenc_version": __version__},
        "corpus": corpus.info,
        "results": aggregate(config, records, names),
    }
    store.write_json("results.json", summary)
    write_csv(store.out / "results.csv", summary)
    if config.eval_stride is not None:
        write_csv(store.out / "results-sliding.csv", summary, key="eval_sliding")
    if has_extension_rows(summary):
        atomic_write_bytes(store.out / "summary.md", extension_summary(summary).encode("utf-8"))
    return summary


#: The columns of results.csv (and results-sliding.csv), one row per (encoding row, length).
CSV_COLUMNS = ("encoding", "train_len", "eval_len", "loss", "loss_last", "ppl", "bits_per_byte", "loss_std", "seeds")


def write_csv(path: Path, summary: dict, key: str = "eval") -> None:
    """One row per (encoding, length): mean losses (nats), perplexity, bits per byte, from each
    result's ``key`` (``eval``: non-overlapping windows; ``eval_sliding``: sliding windows)."""
    write_csv_rows(path, CSV_COLUMNS, (
        _csv_row(encoding, res, length, res.get(key, {}).get(str(length)))
        for encoding, res in summary["results"].items() for length in summary["config"]["eval_lengths"]
    ))


def _csv_row(encoding: str, res: dict, length: int, cell: dict | None) -> list:
    if cell is None:
        return [encoding, res["train_len"], length, "", "", "", "", "", 0]
    return [encoding, res["train_len"], length, f"{cell['loss']:.6f}", f"{cell['loss_last']:.6f}", f"{cell['ppl']:.6f}",
            f"{cell['bits_per_byte']:.6f}", f"{cell['loss_std']:.6f}", cell["seeds"]]
