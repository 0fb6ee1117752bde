"""``posenc lengthgen``'s config: the tasks' defaults, the rows and presets, and
:class:`LengthgenConfig`, everything that determines a sweep's results (which tasks, which rows
on each, the sizes trained and evaluated, each task's model), with its checks; the catalogue of
tasks (``posenc lengthgen --list``) and the run-time estimates a GPU preset is refused with on a
CPU. What a row spells is parsed once, here, when the config is built
(:class:`~posenc.lab.experiments.frame.Row`).

The sweep itself is :mod:`posenc.lab.experiments.lengthgen_run`; the package face, with the
results' schema, :mod:`posenc.lab.experiments.lengthgen`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from posenc._validation import check_positive_int
from posenc.errors import InvalidArgument
from posenc.lab.experiments.extrapolation_config import (
    CPU_FLOPS,
    H100_FLOPS,
    MODEL_FLOPS_UTILIZATION,
)
from posenc.lab.experiments.frame import (
    CORE_ENCODINGS,
    MODEL_TRAIN_OPTIONS,
    Row,
    RunConfig,
    check_names,
)
from posenc.lab.experiments.lengthgen_extension import (
    EXTENSIONS as EXTENSION_ROW_METHODS,
)
from posenc.lab.experiments.lengthgen_extension import (
    check_extension_row,
    extension_rows,
)
from posenc.lab.experiments.limits import Workload, holds_a_table, parameter_floor
from posenc.lab.experiments.task_positions import (
    ALIGNED_TASKS,
    COUPLED_RANGE_FACTOR,
    RANDOMIZED_RANGE_FACTOR,
    TASK_SCHEMES,
    AbacusPositions,
    CoupledPositions,
    PositionScheme,
    RandomizedPositions,
    check_task,
)
from posenc.lab.experiments.tasks import TASKS, get_task
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig

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
    "quick": {"encodings": ("nope", "rope", "alibi"), "tasks": ("copy", "flipflop"), "eval_instances": 100},
    "default": {"encodings": DEFAULT_ROWS, "task_rows": DEFAULT_TASK_ROWS},
    "full": {"encodings": None, "tasks": tuple(TASKS)},
    "extension": {"encodings": EXTENSION_ROWS, "tasks": EXTENSION_TASKS, "seeds": (0, 1, 2), "eval_instances": 100},
    "paper": {"encodings": (*CORE_ENCODINGS, "rope+rand"), "task_rows": ("addition=rope+coupled", "addition=learned+abacus"),
              "tasks": PAPER_TASKS, "model": LMConfig(d_model=768, num_layers=12, num_heads=12, mlp_ratio=4),
              "train": TrainConfig(batch_size=64, lr=3e-5, weight_decay=0.05, stable_frac=0.6, autocast="bfloat16"),
              "steps": 40000, "train_size": 40, "eval_factors": (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.5),
              "randomized_positions": 2048, "eval_instances": 100},
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
    #: ``rope+<method>``: the task's trained ``rope`` model run with a context extension, not
    #: trained (:mod:`posenc.lab.experiments.lengthgen_extension`); ``rope+yaml`` is refused
    #: as a typo, naming the methods.
    EXTENSIONS: ClassVar[dict[str, tuple[str, ...]]] = EXTENSION_ROW_METHODS

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
        for row in (*self.encodings, *(row for _, row in self.task_row_pairs())):
            if row.plan is not None and row.positions is not None:
                # a plan's sliding and chunked spans count position ids, which these schemes
                # make sparse (+rand) or repeated (+coupled): its windows would no longer be W tokens
                raise InvalidArgument(f"encodings: row {row.name!r}: a plan row takes no position suffix here; "
                                      f"+{row.positions} goes on a single encoding (e.g. rope+{row.positions})")
            if row.task_positions is not None:
                for task in self.tasks:
                    if row in self.rows_of(task):
                        check_task(row.task_positions, task, row.name)
        head_dim = self.model.head_dim
        for task, row in self.jobs():
            if self.derived_row(row):
                check_extension_row(row, task, self.rows_of(task), head_dim, self.train_sequence_length(task))

    def _check_task_rows(self) -> None:
        if isinstance(self.task_rows, str) or not isinstance(self.task_rows, tuple) \
                or not all(isinstance(e, str) for e in self.task_rows):
            raise InvalidArgument(f"task_rows: give a tuple of 'TASK=ROW' strings, got {self.task_rows!r}")
        pairs = []
        for entry in self.task_rows:
            task, sep, name = entry.partition("=")
            if not sep or not task or not name:
                raise InvalidArgument(f"task_rows: {entry!r} is not TASK=ROW (e.g. 'addition=rope+coupled')")
            get_task(task)  # unknown names raise, listing the tasks
            row = self.parse_row(name)
            self.check_row(row)  # an extension row is checked with the task's other rows (_check_experiment)
            pairs.append((task, row))
        # each entry parsed once, here: task_row_pairs() hands out these rows (task_rows keeps
        # the spellings, results.json's form)
        object.__setattr__(self, "_task_row_pairs", tuple(pairs))

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

    def task_row_pairs(self) -> list[tuple[str, Row]]:
        """(task, row) of each ``task_rows`` entry whose task is in ``tasks``."""
        return [(task, row) for task, row in self._task_row_pairs if task in self.tasks]

    def rows_of(self, task: str) -> list[Row]:
        """The rows trained on ``task``, in table order: :attr:`rows`, then its ``task_rows``."""
        rows = list(self.rows)
        for name, row in self.task_row_pairs():
            if name == task and row not in rows:
                rows.append(row)
        return rows

    def row_of(self, task: str, name: str) -> Row:
        """The row named ``name`` among ``task``'s rows (:meth:`rows_of`), as the config parsed it.

        Raises:
            InvalidArgument: ``task`` has no such row.
        """
        for row in self.rows_of(task):
            if row == name:
                return row
        raise InvalidArgument(f"{name!r} is not a row of {task}: its rows are {self.rows_of(task)}")

    def extended_row(self, task: str, row: str) -> Row:
        """The trained row whose model extension row ``row`` (``rope+yarn``) runs on ``task``:
        its base, ``rope``, among the task's rows (checked when the config was built)."""
        return self.row_of(task, self.row(row).encoding)

    def jobs(self) -> list[tuple[str, Row]]:
        """Every (task, row) of the sweep, task by task: trained rows and extension rows."""
        return [(task, row) for task in self.tasks for row in self.rows_of(task)]

    def trained_jobs(self) -> list[tuple[str, Row]]:
        """The (task, row) of :meth:`jobs` that train a model (every row but the extension rows)."""
        return [(task, row) for task, row in self.jobs() if not self.derived_row(row)]

    def extension_jobs(self) -> list[tuple[str, Row]]:
        """The (task, row) of :meth:`jobs` that run a task's trained ``rope`` model with a
        context extension (:mod:`posenc.lab.experiments.lengthgen_extension`)."""
        return [(task, row) for task, row in self.jobs() if self.derived_row(row)]

    def _named_randomized_rows(self) -> bool:
        return any(row.randomized for row in (*self.encodings, *(r for _, r in self.task_row_pairs())))

    def holds_a_table(self) -> bool:
        return holds_a_table(row.encoding for _, row in self.trained_jobs() if row.plan is None)

    def default_randomized_positions(self) -> int:
        """L_max of ``+rand`` rows named without ``randomized_positions``: four times the longest
        evaluation sequence of any task (:data:`~posenc.lab.experiments.task_positions.
        RANDOMIZED_RANGE_FACTOR`; Ruoss et al. 2023 sample from 2048 for test lengths up to
        500), so that every evaluation size fits and its positions stay sparse."""
        return RANDOMIZED_RANGE_FACTOR * max(self.eval_sequence_length(task) for task in self.tasks)

    @property
    def rows(self) -> list[Row]:
        """The trained rows, in table order: ``encodings`` as given, then, when
        ``randomized_positions`` is set and ``encodings`` names no ``+rand`` row, the
        ``+rand`` row of every encoding without a position suffix (plans take none: their
        windows count position ids; nor do the extension rows, which train nothing)."""
        if not self.randomized_positions or self._named_randomized_rows():
            return list(self.encodings)
        plain = [row for row in self.encodings if row.positions is None and row.plan is None and row.extension is None]
        return [*self.encodings, *(Row(row.name, randomized=True) for row in plain)]

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
        scheme = self.row(row).positions
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


__all__ = [
    "DEFAULT_ROWS",
    "DEFAULT_TASKS",
    "DEFAULT_TASK_ROWS",
    "EVAL_FACTORS",
    "EXTENSION_ROWS",
    "EXTENSION_TASKS",
    "GPU_PRESETS",
    "MAX_EVAL_FACTOR",
    "MAX_TRAIN_SIZE",
    "OPTIONS",
    "PAPER_TASKS",
    "PRESETS",
    "TASK_SETTINGS",
    "LengthgenConfig",
    "TaskSetting",
    "check_gpu_preset",
    "gpu_hours",
    "preset_config",
    "run_flops",
    "task_catalogue",
]
