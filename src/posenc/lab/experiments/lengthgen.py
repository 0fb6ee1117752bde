"""Length generalization on synthetic tasks: train on instances of size <= N, score exact match
at N/2, N, 1.5N, 2N, 3N, 4N (``posenc lengthgen``).

For each (task, encoding, seed): train the byte-level LM on instances of the task
(:mod:`posenc.lab.experiments.tasks`) whose size is uniform in ``min_size .. N``, with the loss on
the answer tokens only (the answer and its end marker; prompt tokens and padding are
:data:`~posenc.lab.train.IGNORE_INDEX`); then, at each evaluation size, decode
``eval_instances`` fresh instances greedily with the KV cache
(:meth:`~posenc.lab.model.TransformerLM.generate`, one batch per size: all prompts of a size have
one length) and count the instances whose whole answer is right
(:func:`~posenc.lab.experiments.tasks.exact_match`). Every run is a record of a
:class:`~posenc.lab.experiments.runs.RunStore` (row ``<task>-<encoding>``), so an interrupted
sweep resumes and torchrun splits the runs, as ``posenc extrapolate`` does.

``results.json`` (what :func:`run_lengthgen` returns)::

    {"config": {...LengthgenConfig.to_dict(), "posenc_version",
                "task_settings": {task: {"train_size", "steps", "eval_sizes", "size_unit"}}},
     "results": {task: {row: {
         "train_size": N, "size_unit": str, "parameters": int,
         "eval": {"<size>": {"factor": size / N, "accuracy": mean exact match over seeds in [0, 1],
                             "accuracy_std": spread over seeds (0 for one), "token_accuracy": mean
                             share of answer bytes (and END) right at their place, "instances": per seed,
                             "seeds": int, "by_depth": {"<depth>": accuracy} (passkey, multikey)}},
         "not_applicable": {"<size>": why},
         "runs": {"<seed>": that seed's "eval"},
         "positions": {"scheme", ...} (rows with a position suffix only),
         "extension": {"base", "method", "original_max_position_embeddings", "factor" | "parameters"}
                      (extension rows only)}}},
     "ranking": {"learned_at_n": {task: [rows]}, "2": {"per_task": {task: [{"row", "accuracy",
                 "rank"}, ...]}, "mean_reciprocal_rank": {row: float} (over every task)}, "4": {...}},
     "reading": {"threshold": 0.9, "generalization": {task: {row: {"size", "factor", "learned_at_n",
                 "why", "per_seed"}}}, "all_tie": [tasks], "separating": [tasks], "tied_at": {"2": [tasks],
                 "4": [...]}, "mean_reciprocal_rank": {"2": {row: {"mrr", "tasks"}}, "4": {...}}
                 (over the separating tasks; :mod:`posenc.lab.experiments.lengthgen_report`),
                 "extension": {task: {row: {"base", "accuracy": {"1", "2", "4"}, "vs_base": {"2", "4"}}}}
                 (with extension rows only)}}

Beside it, ``summary.md``: the reading as markdown (generalization lengths, the ranking over the
separating tasks with the all-tie tasks named, the comparison with the papers).

The rows of a task are ``encodings`` (every task), then that task's ``task_rows`` (``TASK=ROW``:
the default preset's ``addition=rope+coupled``). A row is an encoding, or the same encoding with
a position suffix
(:mod:`posenc.lab.experiments.task_positions`): ``<encoding>+rand`` (randomized positions, Ruoss
et al. 2023, sampled in training and at test), ``<encoding>+coupled`` (position coupling, Cho et
al. 2024) or ``<encoding>+abacus`` (Abacus, McLeish et al. 2024); such a row's results and
records state its scheme (``"positions"``). A row ``rope+<method>`` (``rope+yarn``,
``rope+self_extend``, ...: :mod:`posenc.lab.experiments.lengthgen_extension`) trains nothing:
it is the task's ``rope`` run's model, from its final checkpoint, scored at every size with that
context extension; it needs ``rope`` among the task's rows, and runs after every trained row
(a second sweep of the same run store: resumed, split across ranks and workers alike).
Accuracies are fractions of instances; sizes are counted in
each task's unit (``size_unit``). Wall-clock times stay in the run records (``runs/*.json``:
``train_seconds``, ``eval_seconds``) so that the same arguments give the same results.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from posenc._version import __version__
from posenc._validation import check_positive_int
from posenc.errors import InvalidArgument
from posenc.lab.experiments.frame import (
    CORE_ENCODINGS, MODEL_TRAIN_OPTIONS, Row, RunConfig, cells_over_seeds, check_names, evals_by_seed, merged_not_applicable, spread,
    write_csv as write_csv_rows,
)
from posenc.encodings import create_for_model, encoding_class
from posenc.lab.checkpoint import CheckpointMismatch, atomic_write_bytes
from posenc.lab.experiments.extrapolation_config import CPU_FLOPS, H100_FLOPS, MODEL_FLOPS_UTILIZATION
from posenc.lab.experiments.limits import Workload, holds_a_table, parameter_floor
from posenc.lab.experiments.lengthgen_extension import (
    BASE as EXTENSION_BASE, check_extension_row, check_extension_spelling, encoding_at, extension_method,
    extension_rows, extension_settings,
)
from posenc.lab.experiments.lengthgen_report import reading, summary_markdown
from posenc.lab.experiments.lm import load_trained, train_run
from posenc.lab.experiments.rope_extension import swapped_encoding
from posenc.lab.experiments.runs import Reporter, RunStore, is_diverged
from posenc.lab.experiments.task_positions import (
    ALIGNED_TASKS, COUPLED_RANGE_FACTOR, RANDOMIZED_RANGE_FACTOR, TASK_SCHEMES, AbacusPositions, CoupledPositions, PositionScheme,
    RandomizedPositions, check_task, greedy_decode, positions_tensor,
)
from posenc.lab.experiments.tasks import END, TASKS, Example, Task, eval_examples, exact_match, get_task
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import IGNORE_INDEX, BatchSource, TrainConfig

#: The tasks of the default run.
DEFAULT_TASKS = ("copy", "reverse", "addition", "flipflop", "passkey")

#: The largest N (``train_size``, ``--train-size``): an instance of every task at 4N builds in
#: milliseconds, and a model past it would not train on this machine anyway (the memory check
#: says so). Checked before any instance is built: at N = 10^9 building one grew memory
#: without bound.
MAX_TRAIN_SIZE = 16384

#: The largest evaluation size, as a multiple of :data:`MAX_TRAIN_SIZE`.
MAX_EVAL_FACTOR = 4

#: Evaluation sizes as multiples of the training size N.
EVAL_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class TaskSetting:
    """A task's defaults: its training size N and training steps."""

    train_size: int
    steps: int


#: Each task's N and steps, sized so that some encoding learns it at N (accuracy >= 0.9)
#: within the default run's budget (docs/results.md has the measurements). Learning these
#: tasks is a sudden transition after a plateau (hundreds of steps), whose step varies from run
#: to run: the steps leave a margin past where it came in our trials.
TASK_SETTINGS: dict[str, TaskSetting] = {
    "copy": TaskSetting(train_size=8, steps=1300),
    "reverse": TaskSetting(train_size=8, steps=1300),
    "sort": TaskSetting(train_size=8, steps=2000),
    "addition": TaskSetting(train_size=3, steps=2500),
    "flipflop": TaskSetting(train_size=16, steps=700),
    "selective_copy": TaskSetting(train_size=8, steps=3000),
    "passkey": TaskSetting(train_size=16, steps=1200),
    # Not measured yet (issue 23 item 3 added them to the catalogue, not to the default run):
    # N and steps are those of the measured task nearest in kind (copy for the strings, flip-flop
    # for the one-symbol answers, passkey for the haystacks), with more steps for the harder ones.
    "mqar": TaskSetting(train_size=8, steps=2000),
    "parity": TaskSetting(train_size=16, steps=1500),
    "modular": TaskSetting(train_size=8, steps=2000),
    "cycle": TaskSetting(train_size=16, steps=1500),
    "bucket_sort": TaskSetting(train_size=8, steps=2000),
    "duplicate": TaskSetting(train_size=8, steps=1300),
    "missing": TaskSetting(train_size=8, steps=2000),
    "multikey": TaskSetting(train_size=32, steps=1500),
    "vartrack": TaskSetting(train_size=32, steps=2000),
    "counting": TaskSetting(train_size=16, steps=1500),
}


#: The rows of the default run: the six core encodings, the rows that separate them where the
#: core rows all score 0 past N (Ruoss et al.'s randomized positions, ``rope+rand``), and a hybrid
#: plan (NoPE on the last of every 3 layers over RoPE, SmolLM3's rule for this 3-layer model).
DEFAULT_ROWS = (*CORE_ENCODINGS, "rope+rand", "rope/nope:3")

#: The rows the default run adds to one task: position coupling (Cho et al. 2024) on addition,
#: the one published fix that learned it at N in our runs (docs/results.md).
DEFAULT_TASK_ROWS = ("addition=rope+coupled",)

#: The paper preset's tasks: those of Kazemnejad et al. (2023) in this catalogue (copy, reverse,
#: addition, sort) and Deletang et al.'s that Ruoss et al. (2023) report on (duplicate string,
#: missing duplicate, parity, modular arithmetic, cycle navigation, bucket sort).
PAPER_TASKS = ("copy", "reverse", "addition", "sort", "duplicate", "missing", "parity", "modular", "cycle",
               "bucket_sort")

#: The extension preset's tasks: those of the catalogue that test recall and order, the two
#: abilities a context extension must keep past N, at the sizes measured to be learned at N
#: (docs/results.md): passkey (recall: one needle read back from anywhere in the haystack),
#: flip-flop (recall of the last write past distractors: the bit must be fetched from the
#: right place), copy and reverse (order: every letter emitted at its place, in order and
#: reversed). Multikey, the harder recall task, trains on 107-token sequences: about 4.5
#: minutes a run here, 40 minutes for its 9 runs alone, past this preset's budget; sort,
#: mqar and vartrack are not yet measured to be learned at N.
EXTENSION_TASKS = ("passkey", "flipflop", "copy", "reverse")

#: The extension preset's rows: the trained rope row, every context extension of it (its RoPE
#: scalings, then the branch-merge maps: no training of their own), and NoPE and ALiBi, the
#: references that extrapolate without an extension.
EXTENSION_ROWS = ("rope", *extension_rows(), "nope", "alibi")

#: Named sizes (options of :func:`preset_config`):
#:
#: - "quick": a smoke run, nope, rope and alibi on copy and flip-flop (about 1 minute on 2 cores);
#: - "default": the default run, :data:`DEFAULT_TASKS` x :data:`DEFAULT_ROWS` plus
#:   :data:`DEFAULT_TASK_ROWS` (41 runs; about 12 minutes on this project's 2 cores, estimated
#:   from measured step times in docs/results.md);
#: - "full": every task on every registered encoding and the hybrid plans;
#: - "extension": every context extension of the trained RoPE model on the recall and order
#:   tasks (:data:`EXTENSION_TASKS` x :data:`EXTENSION_ROWS`, 3 seeds, 100 instances per size):
#:   36 trained runs and 156 evaluations of the rope models with a method (15-20 minutes on
#:   this project's 2 cores with 2 workers, the CLI's default there; 28-40 in one process;
#:   estimated from timed steps and a timed run of one task, docs/results.md, issue 26);
#: - "paper": one GPU at the papers' scale (refused on a CPU, :func:`check_gpu_preset`): the
#:   NoPE paper's model (Kazemnejad et al. 2023: a T5-base-sized decoder, 12 layers, d_model 768,
#:   12 heads, FFN 3072; 40,000 steps of batch 64 at lr 3e-5, McGill-NLP/length-generalization
#:   configs/trainer/base_model.jsonnet) on :data:`PAPER_TASKS`, trained on sizes <= 40 and tested
#:   up to 500 (Ruoss et al.'s N = 40 and test lengths 41-500, randomized positions from
#:   [0, 2048): google-deepmind/randomized_positional_encodings), rows NoPE, APE (sinusoidal,
#:   learned), RoPE, ALiBi, T5, ``rope+rand``, and on addition ``rope+coupled`` and
#:   ``learned+abacus``; 100 instances per size (addition's 200 at 500 digits, 1504 tokens
#:   each, would need at least 57 GiB at once to evaluate: a floor near an H100's 80).
PRESETS: dict[str, dict] = {
    "quick": dict(encodings=("nope", "rope", "alibi"), tasks=("copy", "flipflop"), eval_instances=100),
    "default": dict(encodings=DEFAULT_ROWS, task_rows=DEFAULT_TASK_ROWS),
    "full": dict(encodings=None, tasks=tuple(TASKS)),
    "extension": dict(encodings=EXTENSION_ROWS, tasks=EXTENSION_TASKS, seeds=(0, 1, 2), eval_instances=100),
    "paper": dict(encodings=(*CORE_ENCODINGS, "rope+rand"), task_rows=("addition=rope+coupled", "addition=learned+abacus"),
                  tasks=PAPER_TASKS, model=LMConfig(d_model=768, num_layers=12, num_heads=12, mlp_ratio=4),
                  train=TrainConfig(batch_size=64, lr=3e-5, weight_decay=0.05, stable_frac=0.6, autocast="bfloat16"),
                  steps=40000, train_size=40, eval_factors=(0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.5),
                  randomized_positions=2048, eval_instances=100),
}

#: Presets refused on a CPU, with their time estimate (:func:`gpu_hours`).
GPU_PRESETS = ("paper",)

#: Flat options that override a field of ``model`` or ``train`` (those of every experiment).
OPTIONS: dict[str, tuple[str, str]] = MODEL_TRAIN_OPTIONS


@dataclass(frozen=True)
class LengthgenConfig(RunConfig):
    """Everything that determines the results of ``posenc lengthgen``.

    Args:
        tasks: task names (:data:`posenc.lab.experiments.tasks.TASKS`).
        encodings: registered encoding names or position plans
            (:data:`~posenc.lab.experiments.frame.PLAN_SPELLING`, e.g. ``rope/nope:3``), one
            row each (per task). A plan row's sliding window (or chunk) is, unless given, a
            quarter of the task's longest training sequence. A row may end in one position
            suffix (:mod:`posenc.lab.experiments.task_positions`): ``+rand`` (randomized
            positions from [0, ``randomized_positions``), in training and at test),
            ``+coupled`` (position coupling; range R = :meth:`coupled_range`) or ``+abacus``
            (Abacus ids, training offset in [0, 100)); the last two only with tasks that have an
            alignment (addition, copy, reverse).
        model: the LM's sizes (default: d_model 64, 3 layers, 8 heads, MLP ratio 2: a third
            layer is what addition's carry needed; the narrower MLP costs a third less with no
            slower learning in our trials); its ``max_positions`` is not read: each task's
            model gets a learned table as long as its longest evaluation sequence (or the
            randomized range, if longer).
        train: batch size, learning rate and schedule (default: 32 instances, lr 3e-3,
            warm-up 5%, stable 60%, cosine to 10%: a rate that decays from the start postponed
            the learning transition past the last step); its ``steps`` and ``seq_len`` are not
            read (``steps`` and each task's sequences set them) nor its ``seed`` (``seeds``).
        train_size: N for every task; None: each task's :data:`TASK_SETTINGS` value.
        steps: training steps for every task; None: each task's :data:`TASK_SETTINGS` value.
        eval_factors: evaluation sizes as multiples of N (size = factor * N rounded half up,
            at least the task's smallest size; duplicates dropped).
        eval_instances: fresh instances scored per size (the same ones for every encoding).
        seeds: one run per (task, encoding, seed); accuracies are means over seeds.
        device: a torch device string.
        randomized_positions: None, or M (L_max): the range of the ``+rand`` rows' positions,
            a sorted random sample from [0, M) per sequence in training and at test (Ruoss et al.
            2023; :class:`posenc.lab.train.TrainConfig`). When ``encodings`` names no ``+rand``
            row, M gives every row without a suffix a second row ``<name>+rand``; when it
            names some, None means :meth:`default_randomized_positions` (four times the longest
            evaluation sequence). M must be >= every task's longest training sequence; an
            evaluation size whose sequence is longer than M is not applicable to ``+rand`` rows.
        task_rows: rows trained on one task only, each ``"TASK=ROW"`` (e.g.
            ``"addition=rope+coupled"``), after the rows of every task (a row already among
            them is not repeated); entries of tasks not in ``tasks`` are ignored (a preset's
            task rows survive ``--tasks``). :meth:`from_preset` drops the preset's task rows
            when ``encodings`` is given without ``task_rows``: the rows are then those named.

    Raises:
        InvalidType: a field of the wrong type.
        InvalidArgument: any other bad value; the message names the field.
    """

    model: LMConfig = field(default_factory=lambda: LMConfig(d_model=64, num_layers=3, num_heads=8, mlp_ratio=2))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=32, lr=3e-3, stable_frac=0.6))
    tasks: tuple[str, ...] = DEFAULT_TASKS
    train_size: int | None = None
    steps: int | None = None
    eval_factors: tuple[float, ...] = EVAL_FACTORS
    eval_instances: int = 200
    task_rows: tuple[str, ...] = ()

    PRESETS: ClassVar[dict[str, dict]] = PRESETS
    OPTIONS: ClassVar[dict[str, tuple[str, str]]] = OPTIONS
    #: results.json's order since the first runs
    FIELD_ORDER: ClassVar[tuple[str, ...]] = (
        "tasks", "encodings", "model", "train", "train_size", "steps", "eval_factors", "eval_instances", "seeds",
        "device", "randomized_positions", "task_rows",
    )
    #: written (results.json, fingerprints) only when set: the runs stored before it read the same
    ADDED_LATER: ClassVar[dict[str, object]] = {"task_rows": ()}
    #: set per task (``steps``, ``seq_len``), per run (``seed``) and per task (the table size)
    UNREAD: ClassVar[tuple[str, ...]] = ("train.seed", "train.steps", "train.seq_len", "model.max_positions")
    #: The hybrid plans of ``--preset full``, for this experiment's 3-layer model: the global
    #: (NoPE, full-attention) layer is the last of every 3 (layer 2), where SmolLM3's and
    #: Cohere2's 4-layer groups put it last of every 4 (``rope/nope:4`` names no layer of 3).
    FULL_PLANS: ClassVar[tuple[str, ...]] = ("rope/nope:3", "rope@sliding/nope:3")
    NAMED_RANDOMIZED_ROWS: ClassVar[bool] = True
    TASK_POSITION_ROWS: ClassVar[bool] = True

    def derived_row(self, name: str) -> bool:
        """Whether ``name`` is a context-extension row (``rope+yarn``, ...:
        :mod:`posenc.lab.experiments.lengthgen_extension`): the ``rope`` model run with a method, not trained."""
        return extension_method(name) is not None

    def _check_run(self) -> None:
        if isinstance(self.encodings, (tuple, list)):  # a typo such as rope+yaml names the methods, not the encodings
            for name in self.encodings:
                if isinstance(name, str):
                    check_extension_spelling(name)
        super()._check_run()

    def _check_experiment(self) -> None:
        check_names(self.tasks, "tasks", "task", "('copy', 'passkey')")
        for name in self.tasks:
            get_task(name)  # unknown names raise, listing the tasks
        if self.train_size is not None:
            check_positive_int(self.train_size, "train_size")
            if self.train_size > MAX_TRAIN_SIZE:  # before any instance is built: one of 10^9 grows without bound
                raise InvalidArgument(f"train_size (--train-size) must be at most {MAX_TRAIN_SIZE}, got {self.train_size}")
            for name in self.tasks:
                if self.train_size < get_task(name).min_size:
                    raise InvalidArgument(f"train_size={self.train_size} is below the smallest {name} instance ({get_task(name).min_size})")
        if self.steps is not None:
            check_positive_int(self.steps, "steps")
        if not self.eval_factors or any(
            isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0 for f in self.eval_factors
        ):
            raise InvalidArgument(f"eval_factors: give one or more numbers > 0 (multiples of N), got {self.eval_factors}")
        for name in self.tasks:
            if max(self.eval_sizes(name)) > MAX_EVAL_FACTOR * MAX_TRAIN_SIZE:
                raise InvalidArgument(f"eval_factors: {name}'s largest evaluation size {max(self.eval_sizes(name))} is past "
                                      f"{MAX_EVAL_FACTOR * MAX_TRAIN_SIZE} ({MAX_EVAL_FACTOR} x the largest train_size)")
        for name in self.tasks:
            largest, bound = max(self.eval_sizes(name)), get_task(name).max_size
            if bound is not None and max(largest, self.task_train_size(name)) > bound:
                raise InvalidArgument(f"train_size/eval_factors: {name}'s largest size {max(largest, self.task_train_size(name))} "
                                      f"is past its largest instance ({bound} {get_task(name).size_unit})")
        check_positive_int(self.eval_instances, "eval_instances")
        self._check_task_rows()
        for name in (*self.encodings, *(row for _, row in self.task_row_pairs())):
            row = Row.parse(name)
            if row.plan is not None and row.positions is not None:
                # a plan's sliding and chunked spans count position ids, which these schemes
                # make sparse (+rand) or repeated (+coupled): its windows would no longer be W tokens
                raise InvalidArgument(f"encodings: row {name!r}: a plan row takes no position suffix here; "
                                      f"+{row.positions} goes on a single encoding (e.g. rope+{row.positions})")
            if row.task_positions is not None:
                for task in self.tasks:
                    if name in self.rows_of(task):
                        check_task(row.task_positions, task, name)
        head_dim = self.model.head_dim
        for task, row in self.jobs():
            if self.derived_row(row):
                check_extension_row(row, task, self.rows_of(task), head_dim, self.train_sequence_length(task))

    def _check_task_rows(self) -> None:
        if isinstance(self.task_rows, str) or not isinstance(self.task_rows, tuple) \
                or not all(isinstance(e, str) for e in self.task_rows):
            raise InvalidArgument(f"task_rows: give a tuple of 'TASK=ROW' strings, got {self.task_rows!r}")
        for entry in self.task_rows:
            task, sep, row = entry.partition("=")
            if not sep or not task or not row:
                raise InvalidArgument(f"task_rows: {entry!r} is not TASK=ROW (e.g. 'addition=rope+coupled')")
            get_task(task)  # unknown names raise, listing the tasks
            check_extension_spelling(row)
            if self.derived_row(row):  # checked with the task's other rows (_check_experiment)
                continue
            parsed = Row.parse(row, self.NAMED_RANDOMIZED_ROWS)
            if parsed.plan is not None:
                parsed.plan.check(self.model.num_layers, row)
            else:
                encoding_class(parsed.encoding)  # unknown names raise, listing the available ones

    @classmethod
    def from_preset(cls, preset: str = "default", **overrides) -> LengthgenConfig:
        """The preset's config with ``overrides`` (:meth:`RunConfig.from_preset`); ``encodings``
        given without ``task_rows`` drops the preset's task rows (the rows are those named). A
        preset's plan row that names no layer of the model (``rope/nope:3`` with
        ``num_layers`` below 3) is left out of its rows; a plan row given in ``encodings``
        is checked (and refused) as given."""
        if overrides.get("encodings") is not None and overrides.get("task_rows") is None:
            overrides["task_rows"] = ()
        named = cls.PRESETS.get(preset, {}).get("encodings")
        if overrides.get("encodings") is None and named:
            model = cls.PRESETS[preset].get("model") or next(
                f for f in dataclasses.fields(cls) if f.name == "model").default_factory()
            layers = overrides.get("num_layers") or model.num_layers
            overrides["encodings"] = tuple(row for row in named if _fits(row, layers))
        return super().from_preset(preset, **overrides)

    def task_row_pairs(self) -> list[tuple[str, str]]:
        """(task, row) of each ``task_rows`` entry whose task is in ``tasks``."""
        pairs = [tuple(entry.split("=", 1)) for entry in self.task_rows]
        return [(task, row) for task, row in pairs if task in self.tasks]

    def rows_of(self, task: str) -> list[str]:
        """The rows trained on ``task``, in table order: :attr:`rows`, then its ``task_rows``."""
        rows = list(self.rows)
        for name, row in self.task_row_pairs():
            if name == task and row not in rows:
                rows.append(row)
        return rows

    def jobs(self) -> list[tuple[str, str]]:
        """Every (task, row) of the sweep, task by task: trained rows and extension rows."""
        return [(task, row) for task in self.tasks for row in self.rows_of(task)]

    def trained_jobs(self) -> list[tuple[str, str]]:
        """The (task, row) of :meth:`jobs` that train a model (every row but the extension rows)."""
        return [(task, row) for task, row in self.jobs() if not self.derived_row(row)]

    def extension_jobs(self) -> list[tuple[str, str]]:
        """The (task, row) of :meth:`jobs` that run a task's trained ``rope`` model with a
        context extension (:mod:`posenc.lab.experiments.lengthgen_extension`)."""
        return [(task, row) for task, row in self.jobs() if self.derived_row(row)]

    def _named_randomized_rows(self) -> bool:
        return any(Row.parse(name).randomized for name in (*self.encodings, *(r for _, r in self.task_row_pairs())))

    def holds_a_table(self) -> bool:
        return holds_a_table(row.encoding for _, name in self.trained_jobs() for row in [Row.parse(name)] if row.plan is None)

    def default_randomized_positions(self) -> int:
        """L_max of ``+rand`` rows named without ``randomized_positions``: four times the longest
        evaluation sequence of any task (:data:`~posenc.lab.experiments.task_positions.
        RANDOMIZED_RANGE_FACTOR`; Ruoss et al. 2023 sample from 2048 for test lengths up to
        500), so that every evaluation size fits and its positions stay sparse."""
        return RANDOMIZED_RANGE_FACTOR * max(self.eval_sequence_length(task) for task in self.tasks)

    @property
    def rows(self) -> list[str]:
        """The trained rows, in table order: ``encodings`` as given, then, when
        ``randomized_positions`` is set and ``encodings`` names no ``+rand`` row, the
        ``+rand`` row of every encoding without a position suffix (plans take none: their
        windows count position ids; nor do the extension rows, which train nothing)."""
        if not self.randomized_positions or self._named_randomized_rows():
            return list(self.encodings)
        plain = [name for name in self.encodings if Row.parse(name).positions is None and Row.parse(name).plan is None
                 and not self.derived_row(name)]
        return [*self.encodings, *(Row(name, randomized=True).name for name in plain)]

    def _check_randomized_range(self, option: str) -> None:
        for name in self.tasks:
            needed = self.train_sequence_length(name)
            if self.randomized_positions < needed:
                raise InvalidArgument(f"{option}={self.randomized_positions} must be >= {needed}, the longest {name} training sequence")

    def task_train_size(self, task: str) -> int:
        """N of ``task``."""
        return self.train_size if self.train_size is not None else TASK_SETTINGS[task].train_size

    def task_steps(self, task: str) -> int:
        """Training steps of ``task``."""
        return self.steps if self.steps is not None else TASK_SETTINGS[task].steps

    def eval_sizes(self, task: str) -> list[int]:
        """The evaluation sizes of ``task``, ascending: factor * N rounded half up (1.5 x 3 is
        5) for each factor, at least the task's smallest size."""
        n, smallest = self.task_train_size(task), get_task(task).min_size
        return sorted({max(smallest, math.floor(f * n + 0.5)) for f in self.eval_factors})

    def train_sequence_length(self, task: str) -> int:
        """Tokens of the longest training sequence of ``task`` (prompt + answer + END at N)."""
        return get_task(task).sequence_length(self.task_train_size(task))

    def eval_sequence_length(self, task: str) -> int:
        """Tokens of the longest evaluation sequence of ``task`` (prompt + answer + END)."""
        return get_task(task).sequence_length(max(self.eval_sizes(task)))

    def coupled_range(self, task: str) -> int:
        """R of a ``+coupled`` row of ``task``: twice the largest id (+1) an instance of the
        largest size trained or evaluated has at offset 0 (Cho et al. 2024 train with
        ``max_pos`` 202 for 100-digit tests); training offsets keep every id below R."""
        probe = CoupledPositions(range=0)
        largest = max(probe.largest_test_id(get_task(task), size)
                      for size in (self.task_train_size(task), *self.eval_sizes(task)))
        return COUPLED_RANGE_FACTOR * (largest + 1)

    def position_scheme(self, task: str, row: str) -> PositionScheme | None:
        """The ids ``row`` feeds on ``task`` (:mod:`posenc.lab.experiments.task_positions`);
        None for ordinary positions 0, 1, 2, ..."""
        scheme = Row.parse(row).positions
        if scheme == "rand":
            return RandomizedPositions(self.randomized_positions)
        if scheme == "coupled":
            return CoupledPositions(self.coupled_range(task))
        if scheme == "abacus":
            return AbacusPositions()
        return None

    def model_config(self, task: str, row: str | None = None) -> LMConfig:
        """The LM of ``task``'s runs: ``model`` with a learned table as long as the longest
        evaluation sequence (or the randomized range, if longer); for a ``+coupled`` or
        ``+abacus`` ``row``, long enough for every id it trains and tests with."""
        longest = max(self.eval_sequence_length(task), self.randomized_positions or 0)
        scheme = self.position_scheme(task, row) if row is not None else None
        if scheme is not None and not isinstance(scheme, RandomizedPositions):
            found = get_task(task)
            longest = max(longest, scheme.largest_train_id(found, self.task_train_size(task)) + 1,
                          *(scheme.largest_test_id(found, size) + 1 for size in self.eval_sizes(task)))
        return dataclasses.replace(self.model, max_positions=longest)

    def row_run(self, task: str, row: str, seed: int) -> tuple[str, TrainConfig]:
        """(encoding, training) of a row of ``task``: ``<name>+rand`` is ``name`` trained with
        randomized positions."""
        return self.row_training(row, dataclasses.replace(
            self.train, steps=self.task_steps(task), seq_len=self.train_sequence_length(task), seed=seed,
        ))

    def workloads(self) -> list[Workload]:
        """Per task, one run's largest moments: training (batch x the longest training
        sequence; with randomized positions, a sort of M random keys per sequence) and the
        evaluation at the largest size (``eval_instances`` decoded at once with the KV cache,
        the instances' prompts held as Python lists)."""
        table, batch, works = self.holds_a_table(), self.train.batch_size, []
        positions = batch * self.randomized_positions * 12 if self.randomized_positions else 0
        for task in self.tasks:
            model, length = self.model_config(task), self.train_sequence_length(task)
            longest = get_task(task).sequence_length(max(self.eval_sizes(task)))
            works.append(Workload(f"{task} training (batch {batch} x {length} tokens)", model, batch, length, True, table,
                                  extra_bytes=positions))
            works.append(Workload(f"{task} evaluation ({self.eval_instances} instances x {longest} tokens)", model,
                                  self.eval_instances, longest, False, table, kv_cache=True,
                                  extra_bytes=8 * self.eval_instances * longest))
        return works

    def derived_fields(self) -> dict:
        """Per task its N, steps and evaluation sizes (``task_settings``), after the fields in results.json."""
        return {"task_settings": {
            task: {"train_size": self.task_train_size(task), "steps": self.task_steps(task),
                   "eval_sizes": self.eval_sizes(task), "size_unit": get_task(task).size_unit}
            for task in self.tasks
        }}


def _fits(row: str, num_layers: int) -> bool:
    """Whether every ``/PART:N`` of a plan row names a layer of a ``num_layers`` model (rows
    that are no plan always fit)."""
    plan = Row.parse(row).plan
    return plan is None or isinstance(num_layers, bool) or not isinstance(num_layers, int) \
        or all(n <= num_layers for _, n in plan.every)


def task_catalogue() -> list[dict]:
    """Every task of :data:`~posenc.lab.experiments.tasks.TASKS`, in table order, as
    ``posenc lengthgen --list`` prints it: ``task``, ``size_unit``, ``train_size`` (its default
    N), ``steps`` (its default training steps), ``prompt``, ``answer`` (formats in words),
    ``source``, ``in_default`` (whether the default run has it) and ``suffixes`` (the position
    suffixes its rows may take: ``+rand`` everywhere, ``+coupled`` and ``+abacus`` where it has
    an alignment)."""
    return [{
        "task": name, "size_unit": task.size_unit, "train_size": TASK_SETTINGS[name].train_size,
        "steps": TASK_SETTINGS[name].steps, "prompt": task.prompt_format, "answer": task.answer_format,
        "source": task.source, "in_default": name in DEFAULT_TASKS,
        "suffixes": ["+rand", *(f"+{scheme}" for scheme in TASK_SCHEMES if name in ALIGNED_TASKS)],
    } for name, task in TASKS.items()]


def run_flops(config: LengthgenConfig, task: str, parameters: int) -> float:
    """FLOPs of one run of ``task``: training, (6 N + 6 n_layers L d) per token (Kaplan et al.
    2020 for the 6 N of the matrix products; causal attention's two products after PaLM,
    Chowdhery et al. 2022, appendix B) over steps x batch x L tokens, L the longest training
    sequence (batches are padded to their longest instance, which at batch 32-64 is near N);
    then the evaluation, 2 N per token over every size's instances, prompt and answer."""
    model, length = config.model, config.train_sequence_length(task)
    per_token = 6 * parameters + 6 * model.num_layers * length * model.d_model
    training = per_token * config.task_steps(task) * config.train.batch_size * length
    found = get_task(task)
    evaluation = sum(2 * parameters * config.eval_instances * found.sequence_length(size) for size in config.eval_sizes(task))
    return training + evaluation


def gpu_hours(config: LengthgenConfig, gpus: int = 1) -> float:
    """Hours for every run of ``config`` (tasks x rows x seeds) on ``gpus`` H100s at
    :data:`~posenc.lab.experiments.extrapolation_config.MODEL_FLOPS_UTILIZATION` of bf16 peak
    (:func:`run_flops`; runs split evenly). A floor: sequences of 40-1000 tokens and greedy
    decoding, one token a step, keep a GPU further from its peak than language modelling does."""
    parameters = parameter_floor(config.model, table=False)
    flops = sum(run_flops(config, task, parameters) for task, _ in config.trained_jobs()) * len(config.seeds)
    return flops / (H100_FLOPS * MODEL_FLOPS_UTILIZATION * gpus) / 3600


def check_gpu_preset(preset: str, config: LengthgenConfig) -> None:
    """Refuse a preset of :data:`GPU_PRESETS` on a CPU, with its estimate there and on one GPU.

    Raises:
        InvalidArgument: ``preset`` in :data:`GPU_PRESETS` and ``config.device`` a CPU.
    """
    if preset not in GPU_PRESETS or torch.device(config.device).type != "cpu":
        return
    parameters = parameter_floor(config.model, table=False)
    runs = len(config.trained_jobs()) * len(config.seeds)
    cpu_days = gpu_hours(config) * 3600 * H100_FLOPS * MODEL_FLOPS_UTILIZATION / CPU_FLOPS / 86400
    raise InvalidArgument(
        f"--preset {preset} trains {runs} runs of a {parameters / 1e6:.0f}M-parameter model: about {cpu_days:,.0f} days "
        f"on a CPU at {CPU_FLOPS / 1e9:.0f} GFLOP/s; {gpu_hours(config):.0f} h on one H100 (at "
        f"{MODEL_FLOPS_UTILIZATION:.0%} of bf16 peak, a floor): run it with --device cuda")


#: The preset's config with overrides: fields of :class:`LengthgenConfig` or the :data:`OPTIONS`
#: names, None values ignored (:meth:`~posenc.lab.experiments.frame.RunConfig.from_preset`).
preset_config = LengthgenConfig.from_preset


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
    _, train = config.row_run(task, row, seed)
    scheme = config.position_scheme(task, row)
    # a row with a position scheme states it (a +rand row's test-time sampling is new: its old
    # runs, evaluated at 0, 1, 2, ..., are not reused); other rows' fingerprints are unchanged
    positions = {} if scheme is None else {"positions": scheme.describe()}
    # a learned table under task-structured ids is built at the tokens' scale: its runs under
    # the table's own default (0.02) are not reused
    options = {} if scheme is None else scheme.encoding_options(Row.parse(row).encoding)
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
    task = get_task(task_name)
    torch.manual_seed(seed)
    encoding, train = config.row_run(task_name, row, seed)
    model_config, scheme = config.model_config(task_name, row), config.position_scheme(task_name, row)
    # a plan row's windows scale with the task's longest training sequence (its L)
    encoding = config.row_model(encoding, model_config, config.train_sequence_length(task_name))
    if scheme is not None and isinstance(encoding, str) and (options := scheme.encoding_options(encoding)):
        encoding = create_for_model(encoding, **model_config.encoding_sizes(), **options)
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
            Row.parse(row).encoding)) else {}),
    }


def extension_fingerprint(config: LengthgenConfig, task: str, row: str, seed: int) -> dict:
    """What an extension row's result depends on: the ``rope`` run's fingerprint (the model it
    runs), with the row's name and the extension's settings
    (:func:`~posenc.lab.experiments.lengthgen_extension.extension_settings`)."""
    settings = extension_settings(extension_method(row), config.train_sequence_length(task))
    return {**fingerprint(config, task, EXTENSION_BASE, seed), "row": row, "extension": settings}


def load_base_model(config: LengthgenConfig, task: str, seed: int, store: RunStore, needed_for: str) -> TransformerLM:
    """The model the ``rope`` run of (task, seed) trained, from its final checkpoint in ``store``.

    Raises:
        CheckpointMismatch: the checkpoint is missing, unfinished, corrupt or from other arguments.
    """
    encoding, train = config.row_run(task, EXTENSION_BASE, seed)
    return load_trained(store, row_name(task, EXTENSION_BASE), seed, fingerprint(config, task, EXTENSION_BASE, seed),
                        config.model_config(task, EXTENSION_BASE), train, encoding, device=config.device,
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
    base_name = row_name(task_name, EXTENSION_BASE)
    base = store.stored(base_name, seed, fingerprint(config, task_name, EXTENSION_BASE, seed))
    if base is None:
        raise CheckpointMismatch(f"--out: {store.record_path(base_name, seed)} is missing; row {row} runs that model")
    if is_diverged(base):  # no trained model to extend: the row says why
        return {"task": task_name, "encoding": row, "seed": seed,
                "diverged": f"the {EXTENSION_BASE} run it extends diverged: {base['diverged']}"}
    model = base_model() if base_model is not None else load_base_model(config, task_name, seed, store, f"row {row}")
    method, train_length = extension_method(row), config.train_sequence_length(task_name)
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


def aggregate(config: LengthgenConfig, records: Sequence[dict]) -> dict:
    """results.json's ``results``: per task and row, the mean over seeds of each size's
    accuracies, their spread, and each seed's cells (schema in the module docstring)."""
    results: dict[str, dict] = {}
    for task in config.tasks:
        n = config.task_train_size(task)
        results[task] = {}
        for row in config.rows_of(task):
            every = [r for r in records if r["task"] == task and r["encoding"] == row]
            runs = [r for r in every if not is_diverged(r)]
            diverged = {str(r["seed"]): r["diverged"] for r in every if is_diverged(r)}
            if not runs:  # every seed diverged: no scores, the row says so
                results[task][row] = {"train_size": n, "size_unit": get_task(task).size_unit, "parameters": None,
                                      "eval": {}, "not_applicable": {}, "runs": {}, "diverged": diverged}
                continue
            evals = {}
            for size, cells in cells_over_seeds([r["eval"] for r in runs], config.eval_sizes(task)):
                accuracies = [c["accuracy"] for c in cells]
                cell = {
                    "factor": int(size) / n, "accuracy": statistics.fmean(accuracies), "accuracy_std": spread(accuracies),
                    "token_accuracy": statistics.fmean(c["token_accuracy"] for c in cells),
                    "instances": cells[0]["instances"], "seeds": len(cells),
                }
                if "by_depth" in cells[0]:
                    cell["by_depth"] = {d: statistics.fmean(c["by_depth"][d] for c in cells) for d in cells[0]["by_depth"]}
                evals[size] = cell
            results[task][row] = {
                "train_size": n, "size_unit": get_task(task).size_unit, "parameters": runs[0]["parameters"],
                "eval": evals, "not_applicable": merged_not_applicable(runs), "runs": evals_by_seed(runs),
            }
            if "positions" in runs[0]:
                results[task][row]["positions"] = runs[0]["positions"]
            if "extension" in runs[0]:
                results[task][row]["extension"] = runs[0]["extension"]
            if diverged:
                results[task][row]["diverged"] = diverged
    return results


#: The sizes, as multiples of N, that :func:`rankings` ranks the rows at.
RANK_FACTORS = (2.0, 4.0)
#: Accuracy at N from which a row counts as having learned a task (the issue's bar).
LEARNED_ACCURACY = 0.9


def fractional_ranks(scores: Sequence[float]) -> list[float]:
    """1-based ranks of ``scores``, highest first; tied scores share the mean of their ranks
    (two rows tied for first both rank 1.5)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _accuracy_at(result: dict, factor: float) -> float | None:
    """A row's accuracy at size factor * N; 0 where the size was not applicable (the
    encoding cannot represent it); None where no evaluation size has this factor."""
    for size, cell in result["eval"].items():
        if math.isclose(cell["factor"], factor):
            return cell["accuracy"]
    if any(math.isclose(int(size) / result["train_size"], factor) for size in result["not_applicable"]):
        return 0.0
    return None


def rankings(results: dict, factors: Sequence[float] = RANK_FACTORS) -> dict:
    """The rows ranked per task by accuracy at factor * N, and each row's mean reciprocal rank
    over the tasks (the NoPE paper's summary statistic, Kazemnejad et al. 2023, section 4).

    Returns ``{"learned_at_n": {task: [rows with accuracy >= LEARNED_ACCURACY at N]},
    "<factor>": {"per_task": {task: [{"row", "accuracy", "rank"}, ...] best first},
    "mean_reciprocal_rank": {row: float}}}`` (factor formatted ``%g``); ties share their mean
    rank (:func:`fractional_ranks`). Rows that did not learn a task are ranked too, as the
    paper does; ``learned_at_n`` says which ones did.
    """
    ranked: dict = {"learned_at_n": {
        task: [row for row, res in rows.items() if (_accuracy_at(res, 1.0) or 0.0) >= LEARNED_ACCURACY]
        for task, rows in results.items()
    }}
    for factor in factors:
        per_task, reciprocal = {}, {}
        for task, rows in results.items():
            scored = [(row, _accuracy_at(res, factor)) for row, res in rows.items()]
            scored = [(row, acc) for row, acc in scored if acc is not None]
            if not scored:
                continue
            ranks = fractional_ranks([acc for _, acc in scored])
            entries = sorted(({"row": row, "accuracy": acc, "rank": rank} for (row, acc), rank in zip(scored, ranks)),
                             key=lambda e: e["rank"])
            per_task[task] = entries
            for entry in entries:
                reciprocal.setdefault(entry["row"], []).append(1 / entry["rank"])
        ranked[f"{factor:g}"] = {
            "per_task": per_task,
            "mean_reciprocal_rank": {row: statistics.fmean(r) for row, r in reciprocal.items()},
        }
    return ranked


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


#: The columns of results.csv, one row per (task, row, size).
CSV_COLUMNS = ("task", "encoding", "train_size", "size", "factor", "accuracy", "accuracy_std", "token_accuracy",
               "instances", "seeds")


def write_csv(path: Path, summary: dict) -> None:
    """results.csv: one row per (task, encoding row, evaluation size); accuracies in [0, 1]
    (empty where the size is not applicable)."""
    write_csv_rows(path, CSV_COLUMNS, (
        _csv_row(task, row, res, size)
        for task, rows in summary["results"].items() for row, res in rows.items()
        for size in summary["config"]["task_settings"][task]["eval_sizes"]
    ))


def _csv_row(task: str, row: str, res: dict, size: int) -> list:
    cell, n = res["eval"].get(str(size)), res["train_size"]
    if cell is None:
        return [task, row, n, size, f"{size / n:g}", "", "", "", "", 0]
    return [task, row, n, size, f"{size / n:g}", f"{cell['accuracy']:.4f}", f"{cell['accuracy_std']:.4f}",
            f"{cell['token_accuracy']:.4f}", cell["instances"], cell["seeds"]]


__all__ = [
    "DEFAULT_ROWS", "DEFAULT_TASK_ROWS", "DEFAULT_TASKS", "EVAL_FACTORS", "EXTENSION_ROWS", "EXTENSION_TASKS", "GPU_PRESETS", "OPTIONS", "PAPER_TASKS", "PRESETS",
    "TASK_SETTINGS", "LengthgenConfig", "TaskSetting", "check_gpu_preset", "gpu_hours", "run_flops",
    "LEARNED_ACCURACY", "RANK_FACTORS",
    "aggregate", "encode_training_batch", "evaluate_extension", "evaluate_sizes", "extension_fingerprint", "fingerprint", "fractional_ranks", "preset_config", "rankings",
    "run_lengthgen", "score", "task_batches", "task_catalogue", "train_and_evaluate", "write_csv",
]
