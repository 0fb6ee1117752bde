"""Extend the trained RoPE model past L with RoPE scalings: at inference, and after a short fine-tune.

A row provider (:mod:`posenc.lab.experiments.rows`) of the extrapolation sweep: for each method m of
``config.extension_methods`` (a :data:`posenc.rope.EXTENSION_METHODS` name; CLI ``--rope-scaling``),
per seed of the trained ``rope`` model:

- ``rope+m``, no training: at each evaluation length n the model's RoPE is replaced by one
  with scaling m at factor s = n / L and L0 = L (:func:`posenc.rope.extension_scaling`);
  s = 1 at n = L, where every method is the plain RoPE. This is how a user stretches a
  trained model to a target length without touching its weights.
- ``rope+m+ft``: a copy of the model with scaling m at the fixed factor F =
  ``finetune_factor`` is trained ``finetune_steps`` more steps at length F * L, at a lower
  learning rate, with a fresh AdamW (Position Interpolation, Chen et al. 2023, sec. 3;
  YaRN, Peng et al. 2023, sec. 4), then evaluated at every length with that same scaling, as
  a fine-tuned model's config fixes it. ``rope+ft`` is the control: the same fine-tune with
  no scaling, which tells how much of a recovery is just training at F * L.

The model never learns which encoding it holds: its ``encoding`` module is swapped for a
:class:`~posenc.RoPE` built with ``scaling=`` (RoPE has no parameters, so the weights are
untouched). The trained weights come from the rope run's final training checkpoint. Each row
is one record of the sweep's :class:`~posenc.lab.experiments.runs.RunStore` with a fingerprint (the
base run's plus the extension's settings), and the fine-tunes checkpoint there, so an
interrupted sweep resumes as the base runs do.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from posenc.lab.data import Corpus
from posenc.encodings.rope.rotary import RoPE
from posenc.lab.model import TransformerLM
from posenc.rope import extension_scaling
from posenc.lab.train import TrainConfig
from posenc.lab.experiments.extrapolation_config import ExtrapolationConfig
from posenc.lab.experiments.lm import evaluate_lengths, train_run
from posenc.lab.experiments.rows import BaseRun
from posenc.lab.experiments.runs import Reporter, RunStore
from posenc.errors import InvalidType

BASE = "rope"


def inference_row(method: str) -> str:
    return f"{BASE}+{method}"


def finetune_row(method: str | None) -> str:
    return f"{BASE}+{method}+ft" if method else f"{BASE}+ft"


def extension_rows(config: ExtrapolationConfig) -> list[str]:
    """Row names in table order: the inference rows, then the control and the fine-tunes."""
    rows = [inference_row(m) for m in config.extension_methods]
    if config.finetune_steps:
        rows += [finetune_row(None)] + [finetune_row(m) for m in config.extension_methods]
    return rows


def rope_like(rope: RoPE, scaling: Mapping[str, Any] | None) -> RoPE:
    """A RoPE with ``rope``'s geometry (head_dim, rotary_dim, base, layout) and ``scaling``."""
    if not isinstance(rope, RoPE):
        raise InvalidType(f"the model's encoding must be a posenc RoPE to rescale, got {type(rope).__name__}")
    return RoPE(rope.head_dim, rotary_dim=rope.rotary_dim, base=rope.base, interleaved=rope.interleaved, scaling=scaling)


@contextmanager
def swapped_encoding(model: TransformerLM, encoding: RoPE) -> Iterator[TransformerLM]:
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
    config: ExtrapolationConfig, corpus: Corpus, model: TransformerLM, row: str, seed: int, reporter: Reporter, scaling_at,
) -> dict[str, dict]:
    """Evaluate ``model`` at every length with the RoPE of ``scaling_at(length)``."""
    return evaluate_lengths(
        model, corpus.val, config.eval_lengths, train_len=config.train_len, eval_tokens=config.eval_tokens,
        row=row, seed=seed, reporter=reporter,
        setting=lambda length: swapped_encoding(model, rope_like(model.encoding, scaling_at(length))),
        autocast=config.train.autocast,
    )


def _record(row: str, seed: int, config: ExtrapolationConfig, model: TransformerLM, training: dict,
            extension: dict, evals: dict) -> dict:
    return {
        "encoding": row, "seed": seed, "train_len": config.train_len, "parameters": model.num_parameters(),
        **training, "extension": extension, "eval": evals, "not_applicable": {},
    }


def run_inference_row(
    config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter, base: BaseRun, method: str,
) -> dict:
    """Row ``rope+method``: the trained model with the scaling at factor length / L, no training."""
    row = inference_row(method)
    extension = {"base": BASE, "method": method, "factor": "eval_len / train_len",
                 "original_max_position_embeddings": config.train_len, "finetune": None}

    def compute() -> dict:
        model = base.model()
        evals = _evaluate_row(
            config, corpus, model, row, base.seed, reporter,
            lambda length: extension_scaling(method, length / config.train_len, config.train_len),
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
        evals = _evaluate_row(config, corpus, tuned, row, base.seed, reporter, lambda length: scaling)
        return _record(row, base.seed, config, tuned, training, extension, evals)

    return store.run(row, base.seed, expected, compute, reporter)


class RopeExtension:
    """The row provider (:class:`~posenc.lab.experiments.rows.RowProvider`) of the rope+... rows."""

    name = "rope extension"
    base = BASE
    options = "--rope-scaling / --finetune-steps"

    def rows(self, config: ExtrapolationConfig) -> list[str]:
        return extension_rows(config)

    def run(self, config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter,
            base: BaseRun) -> list[dict]:
        records = [run_inference_row(config, corpus, store, reporter, base, m) for m in config.extension_methods]
        if config.finetune_steps:
            records += [run_finetune_row(config, corpus, store, reporter, base, m) for m in (None, *config.extension_methods)]
        return records
