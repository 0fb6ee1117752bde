"""Extend the trained RoPE model past L with RoPE scalings: at inference, and after a short fine-tune.

Rows added to the extrapolation sweep for each method m of ``config.rope_scaling`` (a
:data:`posenc.rope.EXTENSION_METHODS` name), per seed of the trained ``rope`` model:

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
is one atomic record under ``out/runs/`` with a fingerprint (the base run's plus the
extension's settings) and the fine-tunes checkpoint under ``out/checkpoints/``, so an
interrupted sweep resumes as :mod:`posenc.experiments.extrapolation` does.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..checkpoint import CheckpointMismatch, atomic_write_json, load_checkpoint, read_json
from ..data import Corpus
from ..encodings.rotary import RoPE
from ..evaluate import evaluate_length
from ..model import TransformerLM
from ..rope import extension_scaling
from ..train import TrainConfig, train_lm
from .extrapolation import ExtrapolationConfig, Reporter, RunPaths, _length_record, _windows_at, fingerprint

BASE = "rope"


def inference_row(method: str) -> str:
    return f"{BASE}+{method}"


def finetune_row(method: str | None) -> str:
    return f"{BASE}+{method}+ft" if method else f"{BASE}+ft"


def extension_rows(config: ExtrapolationConfig) -> list[str]:
    """Row names in table order: the inference rows, then the control and the fine-tunes."""
    rows = [inference_row(m) for m in config.rope_scaling]
    if config.finetune_steps:
        rows += [finetune_row(None)] + [finetune_row(m) for m in config.rope_scaling]
    return rows


def rope_like(rope: RoPE, scaling: Mapping[str, Any] | None) -> RoPE:
    """A RoPE with ``rope``'s geometry (head_dim, rotary_dim, base, layout) and ``scaling``."""
    if not isinstance(rope, RoPE):
        raise TypeError(f"the model's encoding must be a posenc RoPE to rescale, got {type(rope).__name__}")
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
    factor = config.finetune_factor
    return TrainConfig(
        steps=config.finetune_steps, batch_size=max(1, config.batch_size // factor), seq_len=factor * config.train_len,
        lr=config.finetune_lr if config.finetune_lr is not None else config.lr / 10, seed=seed,
    )


def load_trained_rope(config: ExtrapolationConfig, corpus: Corpus, seed: int, paths: RunPaths) -> TransformerLM:
    """The rope run's trained model, from its final training checkpoint (checked against its fingerprint).

    Raises:
        CheckpointMismatch: the checkpoint is missing, unfinished, corrupt or from other arguments.
    """
    path = paths.checkpoint(BASE, seed)
    if not path.exists():
        raise CheckpointMismatch(
            f"--out: {path} is missing; the rope model's weights are needed for --rope-scaling / --finetune-steps: "
            f"delete {paths.run(BASE, seed)} to retrain it"
        )
    train_config = config.train_config(seed)
    state = load_checkpoint(path, {"train": train_config.to_dict(), **fingerprint(config, corpus, BASE, seed)})
    if state["step"] != train_config.steps:
        raise CheckpointMismatch(f"--out: {path} stopped at step {state['step']} of {train_config.steps}; rerun to finish it")
    model = TransformerLM(config.model_config(), BASE)
    model.load_state_dict(state["model"])
    return model.to(config.device).eval()


def _evaluate_rows(
    config: ExtrapolationConfig, corpus: Corpus, model: TransformerLM, row: str, seed: int,
    reporter: Reporter, scaling_at,
) -> dict[str, dict]:
    """Evaluate ``model`` at every length with the RoPE of ``scaling_at(length)``."""
    reporter.eval_started(row, seed, sum(_windows_at(n, config, corpus) for n in config.eval_lengths))
    evals = {}
    for length in config.eval_lengths:
        done_before = 0

        def advance(done: int) -> None:
            nonlocal done_before
            reporter.eval_advanced(done - done_before)
            done_before = done

        with swapped_encoding(model, rope_like(model.encoding, scaling_at(length))):
            result = evaluate_length(model, corpus.val, length, config.train_len, max_tokens=config.eval_tokens, on_batch=advance)
        evals[str(length)] = _length_record(result)
    return evals


def _stored(path, expected: dict, row: str, seed: int, reporter: Reporter) -> dict | None:
    """A finished row's record if it exists and matches ``expected``."""
    if not path.exists():
        return None
    record = read_json(path)
    if record.get("fingerprint") != expected:
        raise CheckpointMismatch(
            f"--out: {path} holds a run with other arguments or another posenc version; use another --out folder or delete it"
        )
    reporter.run_finished(row, seed, record, skipped=True)
    return record


def _record(expected: dict, row: str, seed: int, config: ExtrapolationConfig, model: TransformerLM, extension: dict,
            evals: dict, train_seconds: float, tokens_per_second: float, final_train_loss: float | None) -> dict:
    return {
        "fingerprint": expected, "encoding": row, "seed": seed, "train_len": config.train_len,
        "parameters": model.num_parameters(), "train_seconds": round(train_seconds, 3),
        "tokens_per_second": tokens_per_second, "final_train_loss": final_train_loss,
        "extension": extension, "eval": evals, "not_applicable": {},
    }


def run_inference_row(
    config: ExtrapolationConfig, corpus: Corpus, trained: Callable[[], TransformerLM], method: str, seed: int,
    paths: RunPaths, reporter: Reporter, base_record: dict,
) -> dict:
    """Row ``rope+method``: the trained model with the scaling at factor length / L, no training."""
    row = inference_row(method)
    extension = {"base": BASE, "method": method, "factor": "eval_len / train_len",
                 "original_max_position_embeddings": config.train_len, "finetune": None}
    expected = {**fingerprint(config, corpus, BASE, seed), "extension": extension}
    record = _stored(paths.run(row, seed), expected, row, seed, reporter)
    if record is not None:
        return record
    model = trained()
    evals = _evaluate_rows(
        config, corpus, model, row, seed, reporter,
        lambda length: extension_scaling(method, length / config.train_len, config.train_len),
    )
    record = _record(expected, row, seed, config, model, extension, evals, 0.0,
                     base_record["tokens_per_second"], base_record.get("final_train_loss"))
    atomic_write_json(paths.run(row, seed), record)
    reporter.run_finished(row, seed, record, skipped=False)
    return record


def run_finetune_row(
    config: ExtrapolationConfig, corpus: Corpus, trained: Callable[[], TransformerLM], method: str | None, seed: int,
    paths: RunPaths, reporter: Reporter,
) -> dict:
    """Row ``rope+method+ft`` (``rope+ft`` for method None): fine-tune a copy at F * L with the
    scaling at factor F, then evaluate it at every length with that scaling."""
    row = finetune_row(method)
    ft_config = finetune_config(config, seed)
    scaling = extension_scaling(method, config.finetune_factor, config.train_len) if method else None
    extension = {"base": BASE, "method": method, "factor": config.finetune_factor,
                 "original_max_position_embeddings": config.train_len, "scaling": scaling, "finetune": ft_config.to_dict()}
    expected = {**fingerprint(config, corpus, BASE, seed), "extension": extension}
    record = _stored(paths.run(row, seed), expected, row, seed, reporter)
    if record is not None:
        return record
    tuned = copy.deepcopy(trained())
    tuned.encoding = rope_like(tuned.encoding, scaling).to(config.device)
    started = time.perf_counter()
    losses = train_lm(
        tuned, corpus.train, ft_config, on_step=reporter.train_step,
        checkpoint_path=paths.checkpoint(row, seed), fingerprint=expected,
        on_resume=lambda step: reporter.run_started(row, seed, ft_config.steps, step),
    )
    train_seconds = time.perf_counter() - started
    evals = _evaluate_rows(config, corpus, tuned, row, seed, reporter, lambda length: scaling)
    tokens = ft_config.steps * ft_config.batch_size * ft_config.seq_len
    record = _record(expected, row, seed, config, tuned, extension, evals, train_seconds,
                     round(tokens / max(train_seconds, 1e-9)), sum(losses[-50:]) / len(losses[-50:]) if losses else None)
    atomic_write_json(paths.run(row, seed), record)
    reporter.run_finished(row, seed, record, skipped=False)
    return record


def run_rope_extension(config: ExtrapolationConfig, corpus: Corpus, paths: RunPaths, reporter: Reporter) -> list[dict]:
    """Every extension row for every seed (the rope runs must be finished); returns their records."""
    records = []
    for seed in config.seeds:
        base_record = read_json(paths.run(BASE, seed))
        # loaded once, and only if some row of this seed is not stored yet
        trained = functools.cache(functools.partial(load_trained_rope, config, corpus, seed, paths))
        for method in config.rope_scaling:
            records.append(run_inference_row(config, corpus, trained, method, seed, paths, reporter, base_record))
        if config.finetune_steps:
            for method in (None, *config.rope_scaling):
                records.append(run_finetune_row(config, corpus, trained, method, seed, paths, reporter))
    return records
