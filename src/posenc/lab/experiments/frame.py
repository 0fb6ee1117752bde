"""The frame every experiment stands on: its rows, its run config, its fingerprints and tables.

An experiment trains the byte-level LM once per (row, seed) and tabulates what the runs give.
What the experiments share lives here, once:

- :class:`Row`: a row's name parsed (``"rope"``, or ``"rope+rand"``: RoPE trained with
  randomized positions, Ruoss et al. 2023);
- :class:`RunConfig`: the fields every experiment has (``encodings``, ``model``, ``train``,
  ``seeds``, ``device``, ``randomized_positions``), their checks, the rows they make, the
  presets and flat options (:meth:`RunConfig.from_preset`), ``to_dict`` for results.json and the
  fingerprint of a run (:meth:`RunConfig.run_fingerprint`);
- :func:`~posenc.lab.fields.only_when_set` (in ``lab/fields.py``, below the model and
  training, which use it too): the rule that keeps stored runs valid when an option is added
  (a field added later enters results.json and fingerprints only when it differs from its
  default);
- :func:`write_csv`, :func:`cells_over_seeds`, :func:`spread`: results.csv and the means over seeds.

An experiment is one module with a :class:`RunConfig` subclass (its own fields, ``PRESETS``,
``OPTIONS``, ``FIELD_ORDER``) and a function that sweeps its runs through a
:class:`~posenc.lab.experiments.runs.RunStore`; the CLI adds a short command
(:mod:`posenc.lab.cli`).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from posenc._version import __version__
from posenc.lab.fields import only_when_set
from posenc._validation import check_device, check_positive_int
from posenc.encodings import encoding_class
from posenc.errors import InvalidArgument, InvalidType
from posenc.lab.experiments.lm import fold_flat_options
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig

#: The row of an encoding trained with randomized positions (Ruoss et al. 2023).
RANDOMIZED_SUFFIX = "+rand"

#: The six encodings of both experiments' default runs.
CORE_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5")

#: Flat options (CLI flags) that override a field of ``model`` or ``train`` in every
#: experiment: option -> (composed config, its field).
MODEL_TRAIN_OPTIONS: dict[str, tuple[str, str]] = {
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "d_model": ("model", "d_model"),
    "num_layers": ("model", "num_layers"),
    "num_heads": ("model", "num_heads"),
}


@dataclass(frozen=True)
class Row:
    """A trained row of an experiment's table: an encoding, trained with ordinary positions or,
    ``randomized``, with randomized ones (named ``<encoding>+rand``)."""

    encoding: str
    randomized: bool = False

    @classmethod
    def parse(cls, name: str) -> Row:
        """The row named ``name`` (``"rope+rand"`` -> ``Row("rope", randomized=True)``)."""
        if name.endswith(RANDOMIZED_SUFFIX):
            return cls(name[: -len(RANDOMIZED_SUFFIX)], randomized=True)
        return cls(name)

    @property
    def name(self) -> str:
        """The row's name in tables, run records and fingerprints."""
        return self.encoding + RANDOMIZED_SUFFIX if self.randomized else self.encoding


def check_names(value: Any, argname: str, noun: str, example: str) -> None:
    """Raise unless ``value`` is a non-empty tuple or list of distinct names.

    Raises:
        InvalidType: ``value`` is a string or not a tuple or list.
        InvalidArgument: it is empty or names something twice.
    """
    if isinstance(value, str) or not isinstance(value, (tuple, list)):
        raise InvalidType(f"{argname} must be a sequence of {noun} names, e.g. {example}, got {value!r}")
    if not value:
        raise InvalidArgument(f"{argname}: give at least one {noun}")
    if len(set(value)) != len(value):
        raise InvalidArgument(f"{argname}: each name once, got {list(value)}")


@dataclass(frozen=True)
class RunConfig:
    """What every experiment's config holds: the rows it trains and how.

    Args:
        encodings: registered encoding names, one row each. Where the experiment allows it
            (``NAMED_RANDOMIZED_ROWS``), a name may carry the suffix ``+rand``: that encoding
            trained with randomized positions; the plain name need not be in the list.
        model: the LM's sizes.
        train: the training run; its ``seed`` is not read: each run trains with its own seed
            from ``seeds``.
        seeds: one run per (row, seed); results are means over seeds.
        device: a torch device string.
        randomized_positions: None, or N: the ``+rand`` rows are trained with each sequence's
            positions a sorted random sample from [0, N) (Ruoss et al. 2023; see
            :class:`posenc.lab.train.TrainConfig`) and evaluated at ordinary positions. When
            ``encodings`` names no ``+rand`` row, N gives every encoding a second row
            ``<name>+rand``; when it names some, those are the randomized rows and None means
            the experiment's :meth:`default_randomized_positions`.

    A subclass declares its own fields and these class attributes: ``PRESETS`` (named
    option sets, :meth:`from_preset`), ``OPTIONS`` (flat option -> (``model`` or ``train``,
    field)), ``FIELD_ORDER`` (every field, in results.json's order), ``UNREAD`` (fields of
    ``model`` / ``train`` the experiment sets itself, left out of results.json, as
    ``"part.name"``) and ``ADDED_LATER`` (fields written only when set, see
    :func:`only_when_set`).

    Raises:
        InvalidType: a field of the wrong type.
        InvalidArgument: any other bad value; the message names the field.
    """

    encodings: tuple[str, ...] = CORE_ENCODINGS
    model: LMConfig = field(default_factory=LMConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seeds: tuple[int, ...] = (0,)
    device: str = "cpu"
    randomized_positions: int | None = None

    PRESETS: ClassVar[Mapping[str, dict]] = {"default": {}}
    OPTIONS: ClassVar[Mapping[str, tuple[str, str]]] = MODEL_TRAIN_OPTIONS
    FIELD_ORDER: ClassVar[tuple[str, ...]] = ("encodings", "model", "train", "seeds", "device", "randomized_positions")
    UNREAD: ClassVar[tuple[str, ...]] = ("train.seed",)
    ADDED_LATER: ClassVar[Mapping[str, object]] = {}
    NAMED_RANDOMIZED_ROWS: ClassVar[bool] = False

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_options(cls, **options) -> RunConfig:
        """A config from flat options: the fields plus the ``OPTIONS`` names, which override
        the defaults of ``model`` / ``train``.

        Raises:
            InvalidType, InvalidArgument: as the constructor; TypeError: an unknown option.
        """
        defaults = {f.name: f.default_factory() for f in dataclasses.fields(cls) if f.name in ("model", "train")}
        return cls(**fold_flat_options(options, cls.OPTIONS, defaults))

    @classmethod
    def from_preset(cls, preset: str = "default", **overrides) -> RunConfig:
        """The preset's config with ``overrides`` (options of :meth:`from_options`; None values
        ignored) applied. A preset's ``encodings`` None means :meth:`every_encoding`.

        Raises:
            InvalidArgument: an unknown preset (the message lists them) or an invalid override.
            TypeError: an unknown option.
        """
        if preset not in cls.PRESETS:
            raise InvalidArgument(f"preset must be one of {list(cls.PRESETS)}, got {preset!r}")
        values = dict(cls.PRESETS[preset])
        if "encodings" in values and values["encodings"] is None:
            values["encodings"] = cls.every_encoding()
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_options(**values)

    @classmethod
    def every_encoding(cls) -> tuple[str, ...]:
        """The rows of a preset whose ``encodings`` is None: every registered encoding."""
        from posenc.encodings import REGISTRY

        return tuple(REGISTRY)

    # --- checks ---------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self._check_run()
        self._check_experiment()
        self._check_randomized_positions()

    def _check_run(self) -> None:
        check_names(self.encodings, "encodings", "encoding", "('rope', 'alibi')")
        for name in self.encodings:
            # unknown names raise, listing the available ones
            encoding_class(Row.parse(name).encoding if self.NAMED_RANDOMIZED_ROWS else name)
        if not isinstance(self.model, LMConfig):
            raise InvalidType(f"model must be a posenc.lab.model.LMConfig, got {type(self.model).__name__}")
        if not isinstance(self.train, TrainConfig):
            raise InvalidType(f"train must be a posenc.lab.train.TrainConfig, got {type(self.train).__name__}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) \
                or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise InvalidArgument(f"seeds: give one or more distinct integers >= 0, got {self.seeds}")
        check_device(self.device)

    def _check_experiment(self) -> None:
        """The experiment's own fields (a subclass's checks; may set derived fields)."""

    def _check_randomized_positions(self) -> None:
        if self.randomized_positions is None:
            if not self._named_randomized_rows():
                return
            object.__setattr__(self, "randomized_positions", self.default_randomized_positions())
        option = "randomized_positions (--randomized-positions)"
        check_positive_int(self.randomized_positions, option)
        self._check_randomized_range(option)

    def default_randomized_positions(self) -> int:
        """N where ``encodings`` names ``+rand`` rows and ``randomized_positions`` is None."""
        raise NotImplementedError

    def _check_randomized_range(self, option: str) -> None:
        """Raise unless ``randomized_positions`` fits the experiment (``option`` names it)."""

    # --- rows and runs -----------------------------------------------------------------------

    def _named_randomized_rows(self) -> bool:
        return any(Row.parse(name).randomized for name in self.encodings)

    @property
    def rows(self) -> list[str]:
        """The trained rows, in table order: ``encodings`` as given, then, when
        ``randomized_positions`` is set and ``encodings`` names no ``+rand`` row, every
        encoding's ``+rand`` row."""
        if not self.randomized_positions or self._named_randomized_rows():
            return list(self.encodings)
        return [*self.encodings, *(Row(name, randomized=True).name for name in self.encodings)]

    def row_training(self, row: str, train: TrainConfig) -> tuple[str, TrainConfig]:
        """(encoding, training) of ``row`` given the run's ``train``: a ``+rand`` row is its
        encoding trained with ``randomized_positions``."""
        parsed = Row.parse(row)
        if parsed.randomized:
            return parsed.encoding, dataclasses.replace(train, randomized_positions=self.randomized_positions)
        return parsed.encoding, train

    def run_fingerprint(self, fields: dict) -> dict:
        """What a run's result depends on (``fields``, in order, after the posenc version);
        the ``ADDED_LATER`` fields only when set. A stored run is reused only if it matches."""
        return only_when_set({"posenc_version": __version__, **fields}, self.ADDED_LATER)

    # --- results.json ----------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The config as written to results.json: every field in ``FIELD_ORDER`` (``model``
        and ``train`` as nested dicts) without the ``UNREAD`` ones, the ``ADDED_LATER`` ones
        only when set, then :meth:`derived_fields`."""
        fields = dataclasses.asdict(self)
        d = {name: fields[name] for name in self.FIELD_ORDER}
        for key in self.UNREAD:
            part, name = key.split(".")
            del d[part][name]
        return {**only_when_set(d, self.ADDED_LATER), **self.derived_fields()}

    def derived_fields(self) -> dict:
        """What results.json states beside the fields (lengths, sizes the fields imply)."""
        return {}


def spread(values: Sequence[float]) -> float:
    """The sample standard deviation of ``values`` over seeds; 0 for one seed."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def cells_over_seeds(evals: Sequence[dict], keys: Iterable) -> Iterator[tuple[str, list[dict]]]:
    """(key, its cells) for each of ``keys`` (lengths or sizes, as str) that some seed's
    ``evals`` holds; a key with no cell (not applicable at every seed) is skipped."""
    for key in map(str, keys):
        cells = [e[key] for e in evals if key in e]
        if cells:
            yield key, cells


def merged_not_applicable(runs: Sequence[dict]) -> dict:
    """The ``not_applicable`` lengths or sizes of every seed's run of a row, merged."""
    return {k: v for r in runs for k, v in r["not_applicable"].items()}


def evals_by_seed(runs: Sequence[dict]) -> dict:
    """Each seed's ``eval`` of a row's runs, keyed by the seed as str."""
    return {str(r["seed"]): r["eval"] for r in runs}


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Sequence]) -> None:
    """``path`` as CSV, ``columns`` then ``rows``, written atomically (a temporary file replaced)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)
    tmp.replace(path)
