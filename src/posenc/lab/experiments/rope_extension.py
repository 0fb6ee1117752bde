"""Extend the trained RoPE model past L with RoPE scalings: at inference, and after a short fine-tune.

A row provider (:mod:`posenc.lab.experiments.rows`) of the extrapolation sweep: for each method m of
``config.extension_methods`` (a :data:`posenc.rope.EXTENSION_METHODS` name; CLI ``--rope-scaling``),
per seed of the trained ``rope`` model:

- ``rope+m``, no training: at each evaluation length n the model's RoPE is replaced by one
  with scaling m at factor s = max(1, n / L) and L0 = L (:func:`posenc.rope.extension_scaling`);
  s = 1 at n <= L, where every method is the plain RoPE. This is how a user stretches a
  trained model to a target length without touching its weights. With ``extension_factor``
  F set, s = F at every length instead: the model as a config fixed for F x L serves every
  text, the shorter ones included (what static YaRN does to short texts, issue 26).
- ``rope+m+ft``: a copy of the model with scaling m at the fixed factor F =
  ``finetune_factor`` is trained ``finetune_steps`` more steps at length F * L, at a lower
  learning rate, with a fresh AdamW (Position Interpolation, Chen et al. 2023, sec. 3;
  YaRN, Peng et al. 2023, sec. 4), then evaluated at every length with that same scaling, as
  a fine-tuned model's config fixes it. ``rope+ft`` is the control: the same fine-tune with
  no scaling, which tells how much of a recovery is just training at F * L.
- ``rope+drope`` (with ``drope_steps`` > 0) and ``rope+drope+qknorm`` (also ``drope_qk_norm``):
  DroPE (:mod:`posenc.lab.experiments.drope`): the rotation dropped (NoPE, optionally with a
  QK-norm), recalibrated ``drope_steps`` steps at L, evaluated as NoPE. Its controls:
  ``nope+long``, NoPE trained from scratch for the rope model's steps + ``drope_steps`` (the
  same total steps), and ``rope+yarn+ft`` with ``finetune_steps`` = ``drope_steps`` (the same
  extra steps; the ``extension`` preset sets both).

Every method reaches the model through
:func:`posenc.lab.experiments.extension_methods._extension_encoding` (rope, method, params):
the RoPE scalings, and the training-free branch-merge maps of :mod:`posenc.attention.branches`
(:data:`~posenc.lab.experiments.extension_methods.BRANCH_METHODS`: ``rope+self_extend``, ...,
the trained RoPE with the map, its windows the reference's scaled to L:
:func:`~posenc.lab.experiments.extension_methods.branch_defaults`; inference rows only, no fine-tune).

The model never learns which encoding it holds: its ``encoding`` module is swapped for a
:class:`~posenc.RoPE` built with ``scaling=`` (RoPE has no parameters, so the weights are
untouched). The trained weights come from the rope run's final training checkpoint. Each row
is one record of the sweep's :class:`~posenc.lab.experiments.runs.RunStore` with a fingerprint (the
base run's plus the extension's settings), and the fine-tunes checkpoint there, so an
interrupted sweep resumes as the base runs do.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
import contextlib
from contextlib import contextmanager

import torch

from posenc.lab.data import Corpus
from posenc.encodings.base import PositionalEncoding
from posenc.lab.model import TransformerLM
from posenc.rope import EXTENSION_METHODS, extension_scaling
from posenc.lab.experiments.extension_methods import _extension_encoding, rope_like
from posenc.lab.train import TrainConfig
from posenc.lab.experiments.drope import drope_encoding, dropped_model
from posenc.lab.experiments.extrapolation_config import ExtrapolationConfig
from posenc.lab.experiments.lm import evaluate_lengths, passkey_map, train_run
from posenc.lab.experiments.rows import BaseRun
from posenc.lab.experiments.runs import Reporter, RunStore

BASE = "rope"
#: The control of the DroPE rows: NoPE trained from scratch for as many steps in all.
NOPE_LONG = "nope+long"



def inference_row(method: str) -> str:
    return f"{BASE}+{method}"


def finetune_row(method: str | None) -> str:
    return f"{BASE}+{method}+ft" if method else f"{BASE}+ft"


def drope_row(qk_norm: bool) -> str:
    return f"{BASE}+drope+qknorm" if qk_norm else f"{BASE}+drope"


def extension_rows(config: ExtrapolationConfig) -> list[str]:
    """Row names in table order: the inference rows, the control and the fine-tunes, then the
    DroPE rows and their NoPE control."""
    rows = [inference_row(m) for m in config.extension_methods]
    if config.finetune_steps:
        rows += [finetune_row(None)] + [finetune_row(m) for m in config.extension_methods if m in EXTENSION_METHODS]
    if config.drope_steps:
        rows += [drope_row(False)] + ([drope_row(True)] if config.drope_qk_norm else []) + [NOPE_LONG]
    return rows


def _inference_factor(config: ExtrapolationConfig, length: int) -> float:
    """s of an inference row at ``length``: ``extension_factor``, else max(1, length / L)."""
    if config.extension_factor is not None:
        return float(config.extension_factor)
    return max(1.0, length / config.train_len)


@contextmanager
def swapped_encoding(model: TransformerLM, encoding: PositionalEncoding) -> Iterator[TransformerLM]:
    """``model`` with ``encoding`` in place of its own for the duration of the block."""
    original = model.encoding
    model.encoding = encoding.to(next(model.parameters()).device)
    try:
        yield model
    finally:
        model.encoding = original


def finetune_config(config: ExtrapolationConfig, seed: int) -> TrainConfig:
    """F * L windows, batch_size // F of them (the pre-training's tokens per step), lr / 10 by default."""
    factor, train = config.finetune_factor, config.train
    return TrainConfig(
        steps=config.finetune_steps, batch_size=max(1, train.batch_size // factor), seq_len=factor * train.seq_len,
        lr=config.finetune_lr if config.finetune_lr is not None else train.lr / 10, seed=seed,
        autocast=train.autocast, compile=train.compile,
    )


def _evaluate_row(
    config: ExtrapolationConfig, corpus: Corpus, model: TransformerLM, row: str, seed: int, reporter: Reporter,
    encoding_at: Callable[[int], PositionalEncoding] | None,
) -> dict[str, dict]:
    """``eval`` (and ``passkey`` with ``config.passkey_instances``) of ``model`` at every length,
    with ``encoding_at(length)`` in place of its own (None: its own)."""
    def setting(length: int):
        return swapped_encoding(model, encoding_at(length)) if encoding_at is not None else contextlib.nullcontext()

    evals = {"eval": evaluate_lengths(
        model, corpus.val, config.eval_lengths, train_len=config.train_len, eval_tokens=config.eval_tokens,
        row=row, seed=seed, reporter=reporter, setting=setting, autocast=config.train.autocast,
    )}
    if config.passkey_instances:
        evals["passkey"] = passkey_map(model, config.eval_lengths, config.passkey_instances, seed=seed, setting=setting)
    return evals


def _record(row: str, seed: int, config: ExtrapolationConfig, model: TransformerLM, training: dict,
            extension: dict, evals: dict) -> dict:
    return {
        "encoding": row, "seed": seed, "train_len": config.train_len, "parameters": model.num_parameters(),
        **training, "extension": extension, **evals, "not_applicable": {},
    }


def run_inference_row(
    config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter, base: BaseRun, method: str,
) -> dict:
    """Row ``rope+method``: the trained model with the scaling at factor length / L, no training."""
    row = inference_row(method)
    factor = "max(1, eval_len / train_len)" if config.extension_factor is None else config.extension_factor
    extension = {"base": BASE, "method": method, "factor": factor,
                 "original_max_position_embeddings": config.train_len, "finetune": None}
    if config.extension_factor is None and min(config.eval_lengths) >= config.train_len:
        extension["factor"] = "eval_len / train_len"  # the fingerprint of the rows stored before L/2

    def compute() -> dict:
        model = base.model()
        rope = model.encoding
        evals = _evaluate_row(
            config, corpus, model, row, base.seed, reporter,
            lambda length: _extension_encoding(rope, method, {
                "factor": _inference_factor(config, length), "original_max_position_embeddings": config.train_len}),
        )
        # no training of its own: the speed and final loss are the base run's
        training = {"train_seconds": 0.0, "tokens_per_second": base.record["tokens_per_second"],
                    "final_train_loss": base.record.get("final_train_loss")}
        return _record(row, base.seed, config, model, training, extension, evals)

    return store.run(row, base.seed, {**base.fingerprint, "extension": extension}, compute, reporter)


def run_finetune_row(
    config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter, base: BaseRun, method: str | None,
) -> dict:
    """Row ``rope+method+ft`` (``rope+ft`` for method None): fine-tune a copy at F * L with the
    scaling at factor F, then evaluate it at every length with that scaling."""
    row = finetune_row(method)
    ft_config = finetune_config(config, base.seed)
    scaling = extension_scaling(method, config.finetune_factor, config.train_len) if method else None
    extension = {"base": BASE, "method": method, "factor": config.finetune_factor,
                 "original_max_position_embeddings": config.train_len, "scaling": scaling, "finetune": ft_config.to_dict()}
    expected = {**base.fingerprint, "extension": extension}

    def compute() -> dict:
        tuned = copy.deepcopy(base.model())
        tuned.encoding = rope_like(tuned.encoding, scaling).to(config.device)
        training = train_run(tuned, corpus.train, ft_config, store, row, base.seed, expected, reporter)
        evals = _evaluate_row(config, corpus, tuned, row, base.seed, reporter, None)
        return _record(row, base.seed, config, tuned, training, extension, evals)

    return store.run(row, base.seed, expected, compute, reporter)


def drope_config(config: ExtrapolationConfig, seed: int) -> TrainConfig:
    """DroPE's recalibration: ``drope_steps`` steps at L with the pretraining's batch, a fresh
    AdamW at ``drope_lr`` (None: ``train.lr / 3``, see :mod:`posenc.lab.experiments.drope`)."""
    train = config.train
    return TrainConfig(
        steps=config.drope_steps, batch_size=train.batch_size, seq_len=train.seq_len,
        lr=config.drope_lr if config.drope_lr is not None else train.lr / 3, seed=seed,
        autocast=train.autocast, compile=train.compile,
    )


def run_drope_row(
    config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter, base: BaseRun, qk_norm: bool,
) -> dict:
    """Row ``rope+drope`` (``rope+drope+qknorm``): the trained model with its rotation dropped
    (and a QK-norm), recalibrated at L, evaluated at every length as NoPE."""
    row = drope_row(qk_norm)
    train = drope_config(config, base.seed)
    extension = {"base": BASE, "method": "drope", "qk_norm": qk_norm, "finetune": train.to_dict()}
    expected = {**base.fingerprint, "extension": extension}

    def compute() -> dict:
        sizes = config.model
        torch.manual_seed(base.seed)
        tuned = dropped_model(base.model(), drope_encoding(sizes.num_heads, sizes.num_kv_heads, sizes.head_dim,
                                                           sizes.num_layers, qk_norm))
        training = train_run(tuned, corpus.train, train, store, row, base.seed, expected, reporter)
        evals = _evaluate_row(config, corpus, tuned, row, base.seed, reporter, None)
        return _record(row, base.seed, config, tuned, training, extension, evals)

    return store.run(row, base.seed, expected, compute, reporter)


def run_nope_long_row(
    config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter, base: BaseRun,
) -> dict:
    """Row ``nope+long``: NoPE trained from scratch for the rope run's steps + ``drope_steps``
    (DroPE's total), with the base runs' schedule stretched over them."""
    train = dataclasses.replace(config.train_config(base.seed), steps=config.train.steps + config.drope_steps)
    extension = {"base": None, "method": "nope from scratch", "steps": train.steps, "finetune": None}
    expected = {**base.fingerprint, "encoding": NOPE_LONG, "train": train.to_dict(), "extension": extension}

    def compute() -> dict:
        torch.manual_seed(base.seed)
        model = TransformerLM(config.model_config(), "nope").to(config.device)
        training = train_run(model, corpus.train, train, store, NOPE_LONG, base.seed, expected, reporter)
        evals = _evaluate_row(config, corpus, model, NOPE_LONG, base.seed, reporter, None)
        return _record(NOPE_LONG, base.seed, config, model, training, extension, evals)

    return store.run(NOPE_LONG, base.seed, expected, compute, reporter)


class RopeExtension:
    """The row provider (:class:`~posenc.lab.experiments.rows.RowProvider`) of the rope+... rows."""

    name = "rope extension"
    base = BASE
    options = "--rope-scaling / --finetune-steps / --drope-steps"

    def rows(self, config: ExtrapolationConfig) -> list[str]:
        return extension_rows(config)

    def run(self, config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter,
            base: BaseRun) -> list[dict]:
        records = [run_inference_row(config, corpus, store, reporter, base, m) for m in config.extension_methods]
        if config.finetune_steps:
            methods = [m for m in config.extension_methods if m in EXTENSION_METHODS]
            records += [run_finetune_row(config, corpus, store, reporter, base, m) for m in (None, *methods)]
        if config.drope_steps:
            records += [run_drope_row(config, corpus, store, reporter, base, q)
                        for q in ((False, True) if config.drope_qk_norm else (False,))]
            records.append(run_nope_long_row(config, corpus, store, reporter, base))
        return records
