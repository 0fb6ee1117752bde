"""What a language-model run of any experiment does with the run store: train with
checkpoints and progress, reload a finished model, evaluate at many lengths.

Record fields written here (units): ``train_seconds`` (wall clock, s), ``tokens_per_second``
(training tokens / s), ``final_train_loss`` (mean of the last 50 steps, nats per token), and
per evaluation length ``loss`` / ``loss_last`` (nats per token), ``ppl``, ``bits_per_byte``,
``windows``, ``tokens`` (see :func:`posenc.lab.evaluate.evaluate_length`).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from posenc.errors import InvalidArgument
from posenc.lab.checkpoint import CheckpointMismatch, load_checkpoint
from posenc.lab.evaluate import LengthResult, evaluate_length
from posenc.encodings.base import PositionalEncoding
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import TrainConfig, train_lm
from posenc.lab.experiments.runs import Reporter, RunStore, checkpoint_every


def fold_flat_options(options: dict, table: Mapping[str, tuple[str, str]], defaults: Mapping[str, object]) -> dict:
    """``options`` with the flat names of ``table`` (option -> (composed config, its field),
    e.g. ``"lr": ("train", "lr")``) moved into their composed configs: each such config is
    ``options[part]`` (or ``defaults[part]``) with those fields replaced. The CLI's flat flags
    become an experiment config's ``model`` and ``train`` this way."""
    options = dict(options)
    changes: dict[str, dict] = {}
    for name in [n for n in options if n in table]:
        part, field_name = table[name]
        changes.setdefault(part, {})[field_name] = options.pop(name)
    for part, fields in changes.items():
        options[part] = dataclasses.replace(options.get(part) or defaults[part], **fields)
    return options


def length_record(result: LengthResult) -> dict:
    """One evaluation length's cell of a run record (losses in nats per token)."""
    return {
        "loss": result.loss, "ppl": result.ppl, "loss_last": result.loss_last,
        "bits_per_byte": result.bits_per_byte, "windows": result.windows, "tokens": result.tokens,
    }


def windows_at(length: int, eval_tokens: int, val: Tensor, stride: int | None = None) -> int:
    """How many windows of ``length`` tokens an evaluation reads from ``val`` (1-D bytes) within
    ``eval_tokens`` predicted tokens, as :func:`posenc.lab.evaluate.evaluation_windows` (non-overlapping)
    or :func:`posenc.lab.evaluate.sliding_windows` (``stride``) cut them."""
    usable = min(eval_tokens, val.numel() - 1)
    if stride is None:
        return usable // length
    return max(0, (usable - length) // stride + 1)


#: Steps per point of a run record's ``loss_curve``.
LOSS_CURVE_STEPS = 50


def training_fields(config: TrainConfig, losses: Sequence[float], seconds: float, first_step: int = 0,
                    earlier_seconds: float | None = 0.0) -> dict:
    """``train_seconds``, ``tokens_per_second``, ``final_train_loss`` (mean of the last 50
    steps) and ``loss_curve`` (the mean loss of each block of :data:`LOSS_CURVE_STEPS` steps,
    nats per token: where a task's sudden learning transition came) of a training run.

    ``seconds`` is this leg's wall clock; a run resumed at step ``first_step`` > 0 adds
    ``earlier_seconds``, the seconds of the steps before it (from its checkpoint), so that time
    and throughput cover the whole run, and says ``resumed_at_step``. Where the earlier seconds
    are unknown (None: a checkpoint from before posenc kept them), the fields time this leg only
    and ``timed`` says ``"last leg"`` (a rate over every step's tokens but one leg's seconds was
    up to 3,000x too high)."""
    whole = not first_step or earlier_seconds is not None
    tokens = (config.steps - (0 if whole else first_step)) * config.batch_size * config.seq_len
    total = seconds + (earlier_seconds if whole and earlier_seconds else 0.0)
    resumed = {"resumed_at_step": first_step} if first_step else {}
    if not whole:
        resumed["timed"] = "last leg"
    return {
        "train_seconds": round(total, 3),
        "tokens_per_second": round(tokens / max(total, 1e-9)),
        **resumed,
        "final_train_loss": sum(losses[-50:]) / len(losses[-50:]) if losses else None,
        "loss_curve": [round(sum(block) / len(block), 4) for block in
                       (losses[i : i + LOSS_CURVE_STEPS] for i in range(0, len(losses), LOSS_CURVE_STEPS))],
    }


def train_run(
    model: nn.Module, data: Tensor, config: TrainConfig, store: RunStore, row: str, seed: int,
    fingerprint: dict, reporter: Reporter,
) -> dict:
    """Train ``model`` on ``data`` (1-D uint8 bytes) with ``config``, checkpointing to the store's
    checkpoint of (row, seed) and resuming from it; returns :func:`training_fields`.

    Raises:
        CheckpointMismatch: the checkpoint is corrupt or was made with another ``fingerprint``.
    """
    started, first_step, timing = time.perf_counter(), [], {}

    def on_resume(step: int) -> None:
        first_step.append(step)
        reporter.run_started(row, seed, config.steps, step)

    losses = train_lm(
        model, data, config,
        on_step=reporter.train_step,
        checkpoint_path=store.checkpoint_path(row, seed),
        checkpoint_every=checkpoint_every(),
        fingerprint=fingerprint,
        on_resume=on_resume,
        timing=timing,
    )
    return training_fields(config, losses, time.perf_counter() - started, first_step[0] if first_step else 0,
                           timing.get("earlier_seconds", 0.0))


def load_trained(
    store: RunStore, row: str, seed: int, fingerprint: dict, model_config: LMConfig, train_config: TrainConfig,
    encoding: str | PositionalEncoding, *, device: str = "cpu", needed_for: str = "this run",
) -> TransformerLM:
    """The model that (row, seed) trained, from its final checkpoint in ``store``, in eval mode on ``device``.

    ``fingerprint`` is the one the run trained with (:func:`train_run`'s); ``encoding`` what
    the model was built from (a name, or an encoding built with the run's options);
    ``needed_for`` names what asks for the weights, for the error message.

    Raises:
        CheckpointMismatch: the checkpoint is missing, unfinished (fewer than
            ``train_config.steps`` steps), corrupt or made with other arguments.
    """
    path = store.checkpoint_path(row, seed)
    if not path.exists():
        raise CheckpointMismatch(
            f"--out: {path} is missing; the {row} model's weights are needed for {needed_for}: "
            f"delete {store.record_path(row, seed)} to retrain it"
        )
    # train_lm stores its own TrainConfig under "train" next to the run's fingerprint
    state = load_checkpoint(path, {"train": train_config.to_dict(), **fingerprint})
    if state["step"] != train_config.steps:
        raise CheckpointMismatch(f"--out: {path} stopped at step {state['step']} of {train_config.steps}; rerun to finish it")
    model = TransformerLM(model_config, encoding)
    model.load_state_dict(state["model"])
    return model.to(device).eval()


def evaluate_lengths(
    model: nn.Module, val: Tensor, lengths: Sequence[int], *, train_len: int, eval_tokens: int,
    row: str, seed: int, reporter: Reporter,
    setting: Callable[[int], AbstractContextManager] | None = None,
    stride: int | None = None, autocast: str | None = None, compile: bool = False,
) -> dict[str, dict]:
    """:func:`length_record` of ``model`` on ``val`` at each of ``lengths`` (keys: the length as a string).

    Reports one evaluation bar over every window of every length. ``setting(length)``, if
    given, is a context manager the evaluation at that length runs inside (e.g. a RoPE
    scaled for it). ``stride``: sliding windows (:func:`posenc.lab.evaluate.evaluate_length`);
    ``autocast``: a dtype name for ``torch.autocast``; ``compile``: evaluate through
    ``torch.compile(model, dynamic=True)`` (one graph for every length).
    """
    reporter.eval_started(row, seed, sum(windows_at(n, eval_tokens, val, stride) for n in lengths))
    forward = torch.compile(model, dynamic=True) if compile else model
    evals = {}
    for length in lengths:
        done_before = 0

        def advance(done: int) -> None:
            # evaluate_length counts windows done at this length; the bar counts all lengths
            nonlocal done_before
            reporter.eval_advanced(done - done_before)
            done_before = done

        with setting(length) if setting is not None else nullcontext():
            result = evaluate_length(forward, val, length, train_len, max_tokens=eval_tokens, on_batch=advance,
                                     stride=stride, autocast=autocast)
        evals[str(length)] = length_record(result)
    return evals


#: The passkey prompt of :func:`passkey_map` past the key: the cue a model copies the key after.
PASSKEY_CUE = " key "


def passkey_prompts(length: int, depth: float, instances: int, rng: random.Random) -> tuple[Tensor, int]:
    """``instances`` byte prompts of exactly ``length`` bytes, (instances, length) int64, and
    where their key starts: passkey's filler (:class:`posenc.lab.experiments.tasks.Passkey`,
    its ``FILLER`` and ``KEY_SENTENCE``) with the key sentence at ``depth`` of it, then
    :data:`PASSKEY_CUE` and the 5-digit key, the last 5 bytes.

    Raises:
        InvalidArgument: ``length`` too short for the key sentence, the cue and the key."""
    from posenc.lab.experiments.tasks import Passkey

    fixed = len(Passkey.KEY_SENTENCE.format(key="0" * Passkey.KEY_DIGITS)) + len(PASSKEY_CUE) + Passkey.KEY_DIGITS
    room = length - fixed
    if room < 0:
        raise InvalidArgument(f"passkey: a prompt of {length} bytes is shorter than its fixed {fixed} bytes")
    filler = (Passkey.FILLER * (room // len(Passkey.FILLER) + 1))[:room]
    cut = round(depth * room)
    rows = []
    for _ in range(instances):
        key = "".join(rng.choice("0123456789") for _ in range(Passkey.KEY_DIGITS))
        text = filler[:cut] + Passkey.KEY_SENTENCE.format(key=key) + filler[cut:] + PASSKEY_CUE + key
        rows.append(list(text.encode()))
    return torch.tensor(rows, dtype=torch.long), length - Passkey.KEY_DIGITS


@torch.no_grad()
def passkey_map(
    model: nn.Module, lengths: Sequence[int], instances: int, *, seed: int,
    setting: Callable[[int], AbstractContextManager] | None = None,
) -> dict[str, dict[str, float]]:
    """Zero-shot passkey retrieval of a language model, by length and depth: ``{"<length>":
    {"<depth>": accuracy}}``, accuracy the fraction of ``instances`` prompts
    (:func:`passkey_prompts`, depths :data:`posenc.lab.experiments.tasks.DEPTHS`) whose every key
    byte is the model's greedy choice given the prompt before it (teacher-forced, one forward
    per prompt batch). The key comes once before, so a model finds it by copying from the
    context (an induction head), the longer the farther back. ``setting(length)``: as in
    :func:`evaluate_lengths`. The keys are drawn from ``seed``, the same for every row."""
    from posenc.lab.experiments.tasks import DEPTHS

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    result: dict[str, dict[str, float]] = {}
    for length in lengths:
        rng = random.Random(f"passkey {seed} {length}")
        cells = {}
        with setting(length) if setting is not None else nullcontext():
            for depth in DEPTHS:
                prompts, key_at = passkey_prompts(length, depth, instances, rng)
                prompts = prompts.to(device)
                logits = model(prompts[:, :-1])[:, key_at - 1:]
                cells[str(depth)] = (logits.argmax(-1) == prompts[:, key_at:]).all(dim=1).float().mean().item()
        result[str(length)] = cells
    model.train(was_training)
    return result


def passkey_means(maps: Sequence[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The mean over seeds of :func:`passkey_map` results, per length and depth."""
    return {length: {depth: sum(m[length][depth] for m in maps) / len(maps) for depth in cells}
            for length, cells in maps[0].items()}
