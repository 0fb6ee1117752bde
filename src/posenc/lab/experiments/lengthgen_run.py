"""Running ``posenc lengthgen``: training batches of a task, greedy scoring, each run's
evaluation at every size (trained rows, and the ``rope+<method>`` rows that run the trained
``rope`` model with a context extension), the fingerprints that let a sweep resume, and
:func:`run_lengthgen`, the sweep through the run store that writes results.json, results.csv and
summary.md (the schema: :mod:`posenc.lab.experiments.lengthgen`).

The merge of the records is :mod:`posenc.lab.experiments.lengthgen_results`; what the results
say, :mod:`posenc.lab.experiments.lengthgen_report`.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import Tensor

from posenc._version import __version__
from posenc.encodings import create_for_model
from posenc.errors import InvalidArgument
from posenc.lab.checkpoint import CheckpointMismatch, atomic_write_bytes
from posenc.lab.experiments.lengthgen_config import LengthgenConfig
from posenc.lab.experiments.lengthgen_extension import (
    BASE as EXTENSION_BASE,
)
from posenc.lab.experiments.lengthgen_extension import (
    encoding_at,
    extension_settings,
)
from posenc.lab.experiments.lengthgen_report import summary_markdown
from posenc.lab.experiments.lengthgen_results import (
    aggregate,
    rankings,
    reading,
    write_csv,
)
from posenc.lab.experiments.lm import load_trained, train_run
from posenc.lab.experiments.rope_extension import swapped_encoding
from posenc.lab.experiments.runs import Reporter, RunStore, is_diverged
from posenc.lab.experiments.task_positions import (
    PositionScheme,
    RandomizedPositions,
    greedy_decode,
    positions_tensor,
)
from posenc.lab.experiments.tasks import (
    END,
    Example,
    Task,
    eval_examples,
    exact_match,
    get_task,
)
from posenc.lab.model import TransformerLM
from posenc.lab.train import IGNORE_INDEX, BatchSource


def encode_training_batch(examples: Sequence[Example]) -> tuple[Tensor, Tensor]:
    """Instances as a training batch: inputs and next-token targets, int64 (B, T), T = the
    longest instance's prompt + answer + END, minus one. Rows are right-padded (with END; a
    causal model never lets a real token see the padding); targets are
    :data:`~posenc.lab.train.IGNORE_INDEX` except at the answer and END tokens. The ids of a
    position scheme go with it as a third tensor (:func:`task_batches`)."""
    sequences = [list((e.prompt + e.target).encode("ascii")) for e in examples]
    width = max(map(len, sequences)) - 1
    inputs = torch.full((len(examples), width), ord(END), dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, (example, sequence) in enumerate(zip(examples, sequences)):
        inputs[row, : len(sequence) - 1] = torch.tensor(sequence[:-1])
        start = len(example.prompt) - 1  # the target of the prompt's last token is the first answer byte
        targets[row, start : len(sequence) - 1] = torch.tensor(sequence[start + 1 :])
    return inputs, targets


def task_batches(task: Task, train_size: int, scheme: PositionScheme | None = None) -> BatchSource:
    """A :data:`~posenc.lab.train.BatchSource` of training instances of ``task`` with sizes
    uniform in ``min_size .. train_size``: each batch's instances come from a
    :class:`random.Random` seeded by one draw of the training generator (so a resumed run
    sees the same batches). With a ``scheme`` that draws training ids (``+coupled``,
    ``+abacus``), each batch is (inputs, targets, positions), positions int64 (B, T): each
    instance's ids from the same generator, after its instance."""

    def make(batch_size: int, generator: torch.Generator) -> tuple[Tensor, ...]:
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        examples = [task.train_example(train_size, rng) for _ in range(batch_size)]
        inputs, targets = encode_training_batch(examples)
        if scheme is None:
            return inputs, targets
        ids = [scheme.train_ids(task.name, example, rng) for example in examples]
        if any(i is None for i in ids):  # +rand: the training loop draws them
            return inputs, targets
        return inputs, targets, positions_tensor(ids, inputs.shape[1])

    return make


@torch.no_grad()
def score(model: TransformerLM, examples: Sequence[Example], positions: Sequence[Sequence[int]] | None = None) -> dict:
    """Greedy-decode every instance with the KV cache, in one batch, and score it.

    Prompts of different lengths are left-padded (``padding_mask``); the decode runs
    ``max len(answer) + 1`` steps. ``positions``: per instance, the ids of its prompt and
    target tokens (a position scheme's :meth:`~posenc.lab.experiments.task_positions.
    PositionScheme.test_ids`; every prompt then of one length), each generated token placed
    at its id; None: ordinary positions. Returns ``accuracy`` (share of exact matches),
    ``correct``, ``instances``, ``token_accuracy`` (share of target bytes right at their
    place), ``outputs`` (each instance's decoded continuation, str) and, when the instances
    have depths, ``by_depth`` ({depth as str: accuracy}).

    Raises:
        InvalidArgument: ``positions`` with prompts of different lengths.
    """
    device = next(model.parameters()).device
    prompts = [list(e.prompt.encode("ascii")) for e in examples]
    width = max(map(len, prompts))
    steps = max(len(e.target) for e in examples)
    if positions is not None:
        if len(set(map(len, prompts))) != 1:
            raise InvalidArgument("positions: the instances of one positioned batch need prompts of one length")
        ids = positions_tensor(positions, width + steps)
        generated = greedy_decode(model, torch.tensor(prompts, device=device), ids.to(device), steps).cpu()
    else:
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        real = torch.zeros(len(prompts), width, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt):] = torch.tensor(prompt)
            real[row, width - len(prompt):] = True
        padding_mask = None if bool(real.all()) else real.to(device)
        generated = model.generate(tokens.to(device), steps, padding_mask=padding_mask)[:, width:].cpu()
    outputs = [bytes(row.tolist()).decode("latin-1") for row in generated]
    hits = [exact_match(output, example) for output, example in zip(outputs, examples)]
    token_hits = sum(sum(a == b for a, b in zip(output, example.target)) for output, example in zip(outputs, examples))
    result = {
        "accuracy": sum(hits) / len(hits), "correct": sum(hits), "instances": len(hits),
        "token_accuracy": token_hits / sum(len(e.target) for e in examples), "outputs": outputs,
    }
    if examples[0].depth is not None:
        by_depth: dict[str, list[bool]] = {}
        for hit, example in zip(hits, examples):
            by_depth.setdefault(f"{example.depth:g}", []).append(hit)
        result["by_depth"] = {depth: sum(h) / len(h) for depth, h in by_depth.items()}
    return result


def row_name(task: str, row: str) -> str:
    """The run store's row of (task, encoding row): ``<task>-<row>``."""
    return f"{task}-{row}"


def fingerprint(config: LengthgenConfig, task: str, row: str, seed: int) -> dict:
    """What a run's result depends on; a stored run is reused only if this matches exactly."""
    row = config.row(row)
    _, train = config.row_run(task, row, seed)
    scheme = config.position_scheme(task, row)
    # a row with a position scheme states it (a +rand row's test-time sampling is new: its old
    # runs, evaluated at 0, 1, 2, ..., are not reused); other rows' fingerprints are unchanged
    positions = {} if scheme is None else {"positions": scheme.describe()}
    # a learned table under task-structured ids is built at the tokens' scale: its runs under
    # the table's own default (0.02) are not reused
    options = {} if scheme is None else scheme.encoding_options(row.encoding)
    positions.update({"encoding_options": options} if options else {})
    return config.run_fingerprint({
        "task": task, "row": row, "seed": seed,
        "train_size": config.task_train_size(task), "model": config.model_config(task, row).to_dict(),
        "train": train.to_dict(), "eval_sizes": config.eval_sizes(task), "eval_instances": config.eval_instances,
        **positions,
    })


def _eval_positions(scheme: PositionScheme | None, task: Task, examples: Sequence[Example], size: int,
                    seed: int) -> list[list[int]] | None:
    """The test ids of ``examples`` under ``scheme`` (None: ordinary positions), drawn (``+rand``)
    from a generator seeded by (task, size, seed) alone."""
    if scheme is None:
        return None
    rng = random.Random(f"positions/{task.name}/{size}/{seed}")
    return [scheme.test_ids(task.name, example, rng) for example in examples]


def _not_applicable(model: TransformerLM, scheme: PositionScheme | None, task: Task, size: int) -> str | None:
    """Why ``size`` cannot be evaluated (None: it can): more ids than the encoding holds, or
    (``+rand``) more tokens than the randomized range has ids."""
    if isinstance(scheme, RandomizedPositions) and not scheme.fits(task, size):
        return f"{task.sequence_length(size)} tokens do not fit the randomized range [0, {scheme.range})"
    # the last target byte is never fed back; a scheme's largest test id bounds what it feeds
    needed = task.sequence_length(size) - 1 if scheme is None else scheme.largest_test_id(task, size) + 1
    if model.max_positions is not None and needed > model.max_positions:
        return f"the encoding represents at most {model.max_positions} positions"
    return None


def evaluate_sizes(
    config: LengthgenConfig, task: Task, model: TransformerLM, scheme: PositionScheme | None, name: str, seed: int,
    reporter: Reporter, setting: Callable[[int], AbstractContextManager] | None = None,
) -> tuple[dict, dict]:
    """(``eval``, ``not_applicable``) of a run's record: :func:`score` of ``config.eval_instances``
    instances of ``task`` at each evaluation size (the same instances for every row of a seed),
    with an example of each; a size the model cannot represent is not applicable, with why.
    ``setting(length)``, if given, is a context manager the size whose instances are ``length``
    tokens (prompt + answer + END) is scored inside (e.g. the model's RoPE scaled for it)."""
    sizes = config.eval_sizes(task.name)
    reporter.eval_started(name, seed, len(sizes))
    evals, not_applicable = {}, {}
    for size in sizes:
        if (why := _not_applicable(model, scheme, task, size)) is not None:
            not_applicable[str(size)] = why
        else:
            with setting(task.sequence_length(size)) if setting is not None else contextlib.nullcontext():
                examples = eval_examples(task, size, config.eval_instances, seed)
                result = score(model, examples, _eval_positions(scheme, task, examples, size, seed))
            example = eval_examples(task, size, 1, seed)[0]
            result["example"] = {"prompt": example.prompt, "target": example.target, "output": result["outputs"][0]}
            del result["outputs"]
            evals[str(size)] = result
        reporter.eval_advanced(1)
    return evals, not_applicable


def train_and_evaluate(
    config: LengthgenConfig, task_name: str, row: str, seed: int, store: RunStore, reporter: Reporter, expected: dict,
) -> dict:
    """Train and score one (task, row, seed); the body of its record."""
    task, row = get_task(task_name), config.row(row)
    torch.manual_seed(seed)
    _, train = config.row_run(task_name, row, seed)
    model_config, scheme = config.model_config(task_name, row), config.position_scheme(task_name, row)
    # a plan row's windows scale with the task's longest training sequence (its L)
    encoding = config.row_model(row, model_config, config.train_sequence_length(task_name))
    if scheme is not None and row.plan is None and (options := scheme.encoding_options(row.encoding)):
        encoding = create_for_model(row.encoding, **model_config.encoding_sizes(), **dict(row.options), **options)
    model = TransformerLM(model_config, encoding).to(config.device)
    name = row_name(task_name, row)
    training = train_run(model, task_batches(task, config.task_train_size(task_name), scheme), train, store, name,
                         seed, expected, reporter)
    model.eval()
    started = time.perf_counter()
    evals, not_applicable = evaluate_sizes(config, task, model, scheme, name, seed, reporter)
    return {
        "task": task_name, "encoding": row, "seed": seed, "train_size": config.task_train_size(task_name),
        "parameters": model.num_parameters(), **training, "eval_seconds": round(time.perf_counter() - started, 3),
        "eval": evals, "not_applicable": not_applicable,
        **({} if scheme is None else {"positions": scheme.describe()}),
        **({"encoding_options": options} if scheme is not None and (options := scheme.encoding_options(
            row.encoding)) else {}),
    }


def extension_fingerprint(config: LengthgenConfig, task: str, row: str, seed: int) -> dict:
    """What an extension row's result depends on: the ``rope`` run's fingerprint (the model it
    runs), with the row's name and the extension's settings
    (:func:`~posenc.lab.experiments.lengthgen_extension.extension_settings`)."""
    settings = extension_settings(config.row(row).extension, config.train_sequence_length(task))
    base = config.extended_row(task, row)
    return {**fingerprint(config, task, base, seed), "row": str(row), "extension": settings}


def load_base_model(config: LengthgenConfig, task: str, seed: int, store: RunStore, needed_for: str) -> TransformerLM:
    """The model the ``rope`` run of (task, seed) trained, from its final checkpoint in ``store``.

    Raises:
        CheckpointMismatch: the checkpoint is missing, unfinished, corrupt or from other arguments.
    """
    base = config.row_of(task, EXTENSION_BASE)
    encoding, train = config.row_run(task, base, seed)
    return load_trained(store, row_name(task, base), seed, fingerprint(config, task, base, seed),
                        config.model_config(task, base), train, encoding, device=config.device,
                        needed_for=needed_for)


def evaluate_extension(
    config: LengthgenConfig, task_name: str, row: str, seed: int, store: RunStore, reporter: Reporter,
    base_model: Callable[[], TransformerLM] | None = None,
) -> dict:
    """Score extension row ``row`` (``rope+<method>``) of (task, seed): the ``rope`` run's model
    with the method at every size (:func:`~posenc.lab.experiments.lengthgen_extension.encoding_at`,
    L0 the task's longest training sequence); the body of its record. ``base_model`` loads
    that model (None: from ``store``); a diverged ``rope`` run gives a diverged record.

    Raises:
        CheckpointMismatch: the ``rope`` run's record or checkpoint is missing or from other arguments.
    """
    task, name = get_task(task_name), row_name(task_name, row)
    base_row = config.extended_row(task_name, row)
    base_name = row_name(task_name, base_row)
    base = store.stored(base_name, seed, fingerprint(config, task_name, base_row, seed))
    if base is None:
        raise CheckpointMismatch(f"--out: {store.record_path(base_name, seed)} is missing; row {row} runs that model")
    if is_diverged(base):  # no trained model to extend: the row says why
        return {"task": task_name, "encoding": row, "seed": seed,
                "diverged": f"the {EXTENSION_BASE} run it extends diverged: {base['diverged']}"}
    model = base_model() if base_model is not None else load_base_model(config, task_name, seed, store, f"row {row}")
    method, train_length = config.row(row).extension, config.train_sequence_length(task_name)
    at = encoding_at(model.encoding, method, train_length)
    started = time.perf_counter()
    evals, not_applicable = evaluate_sizes(config, task, model, None, name, seed, reporter,
                                           setting=lambda length: swapped_encoding(model, at(length)))
    return {
        "task": task_name, "encoding": row, "seed": seed, "train_size": config.task_train_size(task_name),
        # no training of its own: the final loss is the rope run's
        "parameters": model.num_parameters(), "train_seconds": 0.0, "final_train_loss": base.get("final_train_loss"),
        "eval_seconds": round(time.perf_counter() - started, 3), "eval": evals, "not_applicable": not_applicable,
        "extension": extension_settings(method, train_length),
    }


#: The fields every evaluation cell of a run record holds as finite numbers (the merge
#: averages them); a stored record without them is corrupt (:class:`RunStore`).
SCORE_NUMBERS = ("accuracy", "token_accuracy")


def _jobs(config: LengthgenConfig) -> dict[str, tuple[str, str]]:
    """Every run store row of the sweep: ``<task>-<row>`` -> (task, row)."""
    return {row_name(task, row): (task, row) for task, row in config.jobs()}


def _compute_in_worker(config: LengthgenConfig, out: str, name: str, seed: int, expected: dict) -> dict:
    """:func:`train_and_evaluate` of one run store row, for a worker process (module level, so
    that it pickles; the worker reports no progress)."""
    return train_and_evaluate(config, *_jobs(config)[name], seed, RunStore(out, scores="eval", numbers=SCORE_NUMBERS), Reporter(), expected)


def _extension_in_worker(config: LengthgenConfig, out: str, name: str, seed: int, expected: dict) -> dict:
    """:func:`evaluate_extension` of one run store row, for a worker process."""
    return evaluate_extension(config, *_jobs(config)[name], seed, RunStore(out, scores="eval", numbers=SCORE_NUMBERS), Reporter())


def run_lengthgen(config: LengthgenConfig, out: Path, reporter: Reporter | None = None, workers: int = 1) -> dict | None:
    """Run (or resume) the sweep over tasks x rows x seeds; write results.json and
    results.csv to ``out``; return the results dict (schema in the module docstring). Under
    torchrun, rank 0 merges every rank's runs and returns the dict; the others return None.

    ``workers`` > 1 trains that many runs at once, in separate processes
    (:meth:`~posenc.lab.experiments.runs.RunStore.sweep`); the results do not depend on it.

    Raises:
        CheckpointMismatch: ``out`` holds runs made with other arguments, or corrupt ones.
        ValueError: ``workers`` not a positive integer.
    """
    reporter = reporter or Reporter()
    store = RunStore(out, scores="eval", numbers=SCORE_NUMBERS)
    split = _jobs(config)
    jobs = [(row_name(task, row), seed) for task, row in config.trained_jobs() for seed in config.seeds]
    if workers > 1:
        compute = functools.partial(_compute_in_worker, config, str(out))
    else:
        def compute(name: str, seed: int, expected: dict) -> dict:
            return train_and_evaluate(config, *split[name], seed, store, reporter, expected)
    records = store.sweep(jobs, fingerprint=lambda name, seed: fingerprint(config, *split[name], seed),
                          compute=compute, reporter=reporter, workers=workers)
    if config.extension_jobs():  # every rank, after the barrier that ends the training sweep
        extended = _extension_sweep(config, store, reporter, workers)
        records = None if records is None else records + extended
    if records is None:  # not rank 0
        return None
    results = aggregate(config, records)
    ranking = rankings(results)
    summary = {"config": {**config.to_dict(), "posenc_version": __version__}, "results": results,
               "ranking": ranking, "reading": reading(results, ranking)}
    store.write_json("results.json", summary)
    write_csv(store.out / "results.csv", summary)
    atomic_write_bytes(store.out / "summary.md", summary_markdown(summary).encode("utf-8"))
    return summary


def _extension_sweep(config: LengthgenConfig, store: RunStore, reporter: Reporter, workers: int) -> list[dict] | None:
    """The records of every extension row (:meth:`LengthgenConfig.extension_jobs`) x seed,
    stored or computed through ``store`` as the trained runs are (split across ranks, in
    ``workers`` processes); each (task, seed)'s ``rope`` model loaded once in this process."""
    split = _jobs(config)
    jobs = [(row_name(task, row), seed) for task, row in config.extension_jobs() for seed in config.seeds]
    if workers > 1:
        compute = functools.partial(_extension_in_worker, config, str(store.out))
    else:
        @functools.cache
        def base_model(task: str, seed: int) -> TransformerLM:
            return load_base_model(config, task, seed, store, "the extension rows")

        def compute(name: str, seed: int, expected: dict) -> dict:
            task, row = split[name]
            return evaluate_extension(config, task, row, seed, store, reporter, lambda: base_model(task, seed))
    return store.sweep(jobs, fingerprint=lambda name, seed: extension_fingerprint(config, *split[name], seed),
                       compute=compute, reporter=reporter, workers=workers)


__all__ = [
    "SCORE_NUMBERS", "encode_training_batch", "evaluate_extension", "evaluate_sizes", "extension_fingerprint", "fingerprint",
    "load_base_model", "row_name", "run_lengthgen", "score", "task_batches", "train_and_evaluate",
]
