"""The frame every experiment stands on: its rows, its run config, its fingerprints and tables.

An experiment trains the byte-level LM once per (row, seed) and tabulates what the runs give.
What the experiments share lives here, once:

- :class:`Row`: a row's name parsed (``"rope"``, or ``"rope+rand"``: RoPE trained with
  randomized positions, Ruoss et al. 2023; or a position plan, :class:`PlanSpelling`:
  ``"rope/nope:4"``, NoPE every 4th layer over RoPE; or an encoding with constructor options,
  ``"path[forget_gate=true]"``: PaTH-FoX, :data:`OPTION_SPELLING`);
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
import io
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.markup import escape

from posenc._validation import check_device, check_positive_int
from posenc._version import __version__
from posenc.encodings import create_for_model, encoding_class
from posenc.encodings.base import Hook, PositionalEncoding
from posenc.errors import InvalidArgument, InvalidType
from posenc.lab.checkpoint import atomic_write_bytes
from posenc.plan import LayerPlan, PositionPlan
from posenc.lab.experiments.limits import SEED_LIMIT, Workload, holds_a_table
from posenc.lab.experiments.lm import fold_flat_options
from posenc.lab.fields import only_when_set
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig

if TYPE_CHECKING:  # typing.Self is Python 3.11's; annotations are not evaluated here (3.10 runs this)
    from typing import Self

#: The row of an encoding trained with randomized positions (Ruoss et al. 2023).
RANDOMIZED_SUFFIX = "+rand"
#: The rows of an encoding fed task-structured positions (``posenc lengthgen`` only:
#: :mod:`posenc.lab.experiments.task_positions`): position coupling (Cho et al. 2024) and
#: Abacus (McLeish et al. 2024), by suffix.
TASK_POSITION_SUFFIXES = {"+coupled": "coupled", "+abacus": "abacus"}
#: Every suffix a row name may end in; one per row.
POSITION_SUFFIXES = (RANDOMIZED_SUFFIX, *TASK_POSITION_SUFFIXES)
#: A plan part with gpt-oss's learned attention sinks (``rope+sinks``, ``rope@sliding+sinks``):
#: a logit per head in the layer's softmax denominator (:class:`~posenc.lab.model.TransformerLM`).
SINKS_SUFFIX = "+sinks"

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


#: How a plan row is spelled, for help texts and error messages.
PLAN_SPELLING = (
    "a plan row is BASE[/PART:N]...: BASE (ENCODING[@SPAN]) on every layer, then each PART (ENCODING[@SPAN]) "
    "on every N-th layer, counting from 1 (layers N-1, 2N-1, ...; a later part wins); SPAN is full (the default), "
    "sliding (a window of L/4 keys) or chunked (chunks of L/4 positions), or sliding=W / chunked=C; nope is a layer "
    "without positions; a part ending in +sinks has gpt-oss's learned attention sinks. E.g. rope/nope:4 (NoPE every "
    "4th layer over RoPE, SmolLM3), rope@sliding/nope:4 (RoPE on sliding-window layers, NoPE with full attention on "
    "every 4th, Cohere2) or rope@sliding+sinks/rope+sinks:2 (gpt-oss: sliding and full layers in turn, sinks on all)"
)

#: The hybrid plans of current long-context models that the full presets add (4-layer models):
#: SmolLM3's (NoPE every 4th layer over full-attention RoPE; ``no_rope_layers``) and Cohere2's
#: (RoPE on sliding-window layers, NoPE on a full-attention layer every 4th; ``layer_types``).
#: Llama 4's chunked variant is the ``irope`` encoding.
HYBRID_PLANS = ("rope/nope:4", "rope@sliding/nope:4")

#: The window W of a sliding span and the chunk C of a chunked one, when the row does not give
#: it, is the training length L over this (W = C = L // 4, at least 1): what iRoPE's chunks use
#: (:meth:`posenc.encodings.irope.IRoPE.options_for_train_len`). A quarter of L lets three
#: quarters of the training queries see a whole window, so the local layers meet at 2L..16L
#: what they trained on, and their encoding never sees a distance of W or more at any length:
#: only the full-attention layers reach further.
WINDOW_FRACTION = 4


def default_window(train_len: int) -> int:
    """W = C of a plan row's sliding and chunked spans at training length L: ``max(1, L // 4)``."""
    return max(1, train_len // WINDOW_FRACTION)


_SPANS = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerSpelling:
    """One part of a plan row: an encoding name, its span and an explicit window (None: the
    span's window comes from L, :func:`default_window`; always None for a full span)."""

    encoding: str
    span: str = "full"
    window: int | None = None
    sinks: bool = False


@dataclass(frozen=True)
class PlanSpelling:
    """A plan row parsed (grammar: :data:`PLAN_SPELLING`): ``base`` on every layer, then each
    ``(part, n)`` of ``every`` on the layers i with (i + 1) % n == 0, a later part winning.
    ``rope/nope:4`` is SmolLM3's plan (layers 3, 7, ... NoPE, as its ``no_rope_layers``);
    ``rope@sliding/nope:4`` Cohere2's (layers 3, 7, ... full attention without positions, the
    others RoPE in a sliding window, as its ``sliding_window_pattern`` 4)."""

    base: LayerSpelling
    every: tuple[tuple[LayerSpelling, int], ...] = ()

    @classmethod
    def parse(cls, text: str, row: str | None = None) -> PlanSpelling:
        """The plan spelled ``text`` (``row``: the row's whole name, for the message).

        Raises:
            InvalidArgument: not a plan's spelling; the message names the row and the allowed forms.
        """
        row = text if row is None else row
        parts = text.split("/")
        base = _parse_layer(parts[0], row)
        every = []
        for part in parts[1:]:
            layer, colon, n = part.rpartition(":")
            if not colon or not n.isdigit() or int(n) < 1:
                raise _spelling_error(row, f"{part!r} needs its interval, ENCODING[@SPAN]:N with N >= 1 (e.g. nope:4)")
            every.append((_parse_layer(layer, row), int(n)))
        return cls(base, tuple(every))

    def layer(self, index: int) -> LayerSpelling:
        """The part that layer ``index`` (0-based) takes."""
        chosen = self.base
        for part, n in self.every:
            if (index + 1) % n == 0:
                chosen = part
        return chosen

    @property
    def encodings(self) -> list[str]:
        """The encoding names the plan uses, each once, in order of appearance."""
        return list(dict.fromkeys([self.base.encoding, *(part.encoding for part, _ in self.every)]))

    def uses_default_window(self) -> bool:
        """Whether some sliding or chunked part takes its window from L."""
        return any(p.span != "full" and p.window is None for p in (self.base, *(part for part, _ in self.every)))

    def check(self, num_layers: int, row: str) -> None:
        """Raise unless every encoding is registered (the message lists them) and may sit on a
        layer (no ``embed`` hook), and every ``/PART:N`` names a layer of a ``num_layers`` model."""
        for name in self.encodings:
            try:
                cls = encoding_class(name)
            except InvalidArgument as err:
                raise _spelling_error(row, str(err)) from None
            if Hook.EMBED in cls.hooks:
                raise _spelling_error(row, f"{name} adds positions to the token embeddings, not inside a layer; "
                                           "a plan's parts are encodings of the attention (rope, alibi, t5, nope, ...)")
        for part, n in self.every:
            if n > num_layers:
                raise _spelling_error(row, f"{part.encoding}:{n} names no layer of a {num_layers}-layer model "
                                           f"(every {n}-th layer: layers {n - 1}, {2 * n - 1}, ...)")

    def build(self, sizes: dict, train_len: int, options: Callable[[str], dict] | None = None) -> PositionPlan:
        """The :class:`PositionPlan` of a model of ``sizes`` (:meth:`LMConfig.encoding_sizes`,
        ``num_layers`` among them) trained at length ``train_len``: each encoding built once with
        :func:`posenc.create_for_model` (and ``options(name)``, e.g. those it takes from L) and
        shared by its layers, ``nope`` as None (no positions); windows from L where not given."""
        built = {name: None if name == "nope" else create_for_model(name, **sizes, **(options(name) if options else {}))
                 for name in self.encodings}
        layers = []
        for index in range(sizes["num_layers"]):
            part = self.layer(index)
            window = None if part.span == "full" else part.window or default_window(train_len)
            layers.append(LayerPlan(built[part.encoding], span=part.span, window=window, sinks=part.sinks))
        return PositionPlan(tuple(layers))


def _spelling_error(row: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"encodings: row {row!r}: {problem}; {PLAN_SPELLING}")


def _parse_layer(text: str, row: str) -> LayerSpelling:
    if text.endswith(SINKS_SUFFIX):
        return dataclasses.replace(_parse_layer(text[: -len(SINKS_SUFFIX)], row), sinks=True)
    name, at, span = text.partition("@")
    if not name or not all(c.isalnum() or c == "_" for c in name):
        raise _spelling_error(row, f"{text!r} does not start with an encoding name")
    if not at:
        return LayerSpelling(name)
    span, equals, window = span.partition("=")
    if span not in _SPANS:
        raise _spelling_error(row, f"unknown span {span!r} (choose full, sliding, chunked)")
    if not equals:
        return LayerSpelling(name, span)
    if span == "full" or not window.isdigit() or int(window) < 1:
        raise _spelling_error(row, f"{text!r}: a window is a whole number >= 1 after sliding= or chunked=")
    return LayerSpelling(name, span, int(window))


#: How a row's encoding options are spelled, for help texts and error messages.
OPTION_SPELLING = (
    "an encoding's options are spelled NAME[key=value,key=value] (values true, false, none, numbers or words; "
    "e.g. path[forget_gate=true] for PaTH-FoX): the encoding built with those constructor arguments"
)


def _option_value(text: str) -> Any:
    """A spelled option value: true / false / none, an int, a float, else the word itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _spell_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "none"}[value]
    return str(value)


def _parse_options(text: str, row: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``NAME[key=value,...]`` -> (NAME, ((key, value), ...)) in the spelled order; a text
    without brackets -> (text, ())."""
    if "[" not in text and "]" not in text:
        return text, ()
    name, bracket, body = text.partition("[")
    if not bracket or not body.endswith("]") or "[" in body or not name:
        raise InvalidArgument(f"encodings: row {row!r}: {OPTION_SPELLING}")
    if not body[:-1].strip():
        raise InvalidArgument(f"encodings: row {row!r}: empty options; {OPTION_SPELLING}")
    options = []
    for item in body[:-1].split(","):
        key, equals, value = item.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key.isidentifier() or not value or key in dict(options):
            raise InvalidArgument(f"encodings: row {row!r}: option {item.strip()!r} is not key=value (each key once); "
                                  f"{OPTION_SPELLING}")
        options.append((key, _option_value(value)))
    return name, tuple(options)


def split_rows(value: str) -> list[str]:
    """A comma-separated list of rows, the commas inside an option list (``path[a=1,b=2]``)
    not splitting."""
    rows, depth, start = [], 0, 0
    for index, char in enumerate(value):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            rows.append(value[start:index])
            start = index + 1
    rows.append(value[start:])
    return [row.strip() for row in rows if row.strip()]


class Row(str):
    """A row of an experiment's table, parsed once from its spelling (:meth:`parse`, where a
    config is built from the command line or from a results file) and passed inward as this
    object: code further in reads its parts, never splits the string again.

    A row is an encoding (or a plan's spelling, ``rope/nope:4``: :data:`PLAN_SPELLING`, parsed
    into ``plan``) trained with ordinary positions or, ``randomized``, with randomized ones
    (``<encoding>+rand``, Ruoss et al. 2023), or, ``task_positions`` ``"coupled"`` or
    ``"abacus"``, fed the task's structured positions (``<encoding>+coupled``,
    ``<encoding>+abacus``); or, ``extension`` a method, another row's trained model run with that
    context extension, no training (``posenc lengthgen``'s ``rope+yarn``:
    :mod:`posenc.lab.experiments.lengthgen_extension`). An encoding row may carry constructor
    ``options`` (``path[forget_gate=true]``, :data:`OPTION_SPELLING`): the encoding is built
    with them (and with what it takes from the model's sizes).

    The row *is* its spelling: a ``str`` equal to it (``Row("rope", randomized=True) ==
    "rope+rand"``), so it is the key, the stored and the printed form everywhere (results.json,
    results.csv, run records, fingerprints: unchanged, an old run store resumes; its ``repr`` is
    the string's, so messages quoting a row read as before), and the parts ride along.
    Immutable, like the string.
    """

    encoding: str
    randomized: bool
    plan: PlanSpelling | None
    task_positions: str | None
    extension: str | None
    options: tuple[tuple[str, Any], ...]

    def __new__(cls, encoding: str, randomized: bool = False, plan: PlanSpelling | None = None,
                task_positions: str | None = None, extension: str | None = None,
                options: tuple[tuple[str, Any], ...] = ()) -> Self:
        options = tuple((str(key), value) for key, value in options)
        named = encoding
        if options:
            named = f"{encoding}[{','.join(f'{key}={_spell_value(value)}' for key, value in options)}]"
        if extension is not None:
            spelling = f"{named}+{extension}"
        elif task_positions is not None:
            spelling = f"{named}+{task_positions}"
        else:
            spelling = named + RANDOMIZED_SUFFIX if randomized else named
        encoding = str(encoding)  # a plain str: it reaches the model and its checkpoint
        row = super().__new__(cls, spelling)
        if plan is None and extension is None and _spells_a_plan(encoding):
            plan = PlanSpelling.parse(encoding, spelling)
        if options and plan is not None:
            raise InvalidArgument(f"encodings: row {spelling!r}: options are read on a one-encoding row, not in a plan")
        parts = {"encoding": encoding, "randomized": randomized, "plan": plan, "task_positions": task_positions,
                 "extension": extension, "options": options}
        for key, value in parts.items():
            object.__setattr__(row, key, value)
        return row

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a Row is immutable (its spelling is its identity): cannot set {key!r}")

    def __reduce__(self):
        # pickled (to a worker process) as its parts, not re-parsed from the spelling
        return (Row, (self.encoding, self.randomized, self.plan, self.task_positions, self.extension, self.options))

    @classmethod
    def parse(cls, name: str, randomized_rows: bool = True,
              extensions: Mapping[str, Sequence[str]] | None = None) -> Row:
        """The row spelled ``name`` (``"rope+rand"`` -> ``Row("rope", randomized=True)``,
        ``"rope+coupled"`` -> ``Row("rope", task_positions="coupled")``; a name with ``/`` or
        ``@`` is a plan). ``randomized_rows`` False: no suffix is read. ``extensions``
        {base row: its methods} (``posenc lengthgen``: ``{"rope": METHODS}``): ``<base>+<method>``
        is an extension row (``"rope+yarn"`` -> ``Row("rope", extension="yarn")``), and
        ``<base>+<other>`` that is neither a method nor a position suffix a typo.

        Raises:
            InvalidArgument: a plan's spelling that does not parse (the message names the row
                and the allowed forms); two position suffixes on one row; with ``extensions``,
                ``<base>+<name>`` whose name is no method (the message lists them).
        """
        if isinstance(name, Row) and extensions is None and randomized_rows:
            return name
        base, plus, method = name.partition("+")
        if extensions and plus and base in extensions and "+" + method.partition("+")[0] != SINKS_SUFFIX:
            if method in extensions[base]:
                return cls(base, extension=method)
            if "+" + method not in POSITION_SUFFIXES:
                raise InvalidArgument(
                    f"encodings: row {name!r}: {base}+<method> runs the trained {base} model with a context "
                    f"extension; method must be one of {list(extensions[base])} (or a position suffix "
                    f"{', '.join(POSITION_SUFFIXES)})")
        encoding, suffix = _split_suffix(name) if randomized_rows else (name, None)
        if suffix is not None and _split_suffix(encoding)[1] is not None:
            raise InvalidArgument(f"encodings: row {name!r}: one position suffix per row "
                                  f"({', '.join(POSITION_SUFFIXES)}), got two")
        encoding, options = _parse_options(encoding, name)
        plan = PlanSpelling.parse(encoding, name) if _spells_a_plan(encoding) else None
        return cls(encoding, suffix == RANDOMIZED_SUFFIX, plan, TASK_POSITION_SUFFIXES.get(suffix), options=options)

    @classmethod
    def of(cls, name: str, randomized_rows: bool = True) -> Row:
        """``name`` itself when it is a Row already (parsed where it entered), else
        :meth:`parse` of it: a spelling handed to a public function from outside."""
        return name if isinstance(name, Row) else cls.parse(name, randomized_rows)

    @property
    def name(self) -> str:
        """The row's spelling, a plain ``str``: its name in tables, run records and fingerprints."""
        return str(self)

    @property
    def positions(self) -> str | None:
        """The row's position scheme: ``"rand"``, ``"coupled"``, ``"abacus"`` or None (0, 1, 2, ...)."""
        return "rand" if self.randomized else self.task_positions


def _spells_a_plan(encoding: str) -> bool:
    """Whether a row's encoding part is a plan's spelling (:data:`PLAN_SPELLING`): layers
    (``/``), a span (``@``) or sinks (``+sinks``)."""
    return "/" in encoding or "@" in encoding or SINKS_SUFFIX in encoding


def _split_suffix(name: str) -> tuple[str, str | None]:
    """``name`` without its position suffix, and the suffix (None: it has none)."""
    for suffix in POSITION_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], suffix
    return name, None


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
        encodings: registered encoding names or plans (:data:`PLAN_SPELLING`, e.g.
            ``rope/nope:4``), one row each. Where the experiment allows it
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
    field)), ``FIELD_ORDER`` (every field, in results.json's order), ``FULL_PLANS`` (the plan
    rows a preset with ``encodings`` None adds), ``UNREAD`` (fields of
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
    #: Rows that run another row's trained model with a method, by base row: ``{"rope":
    #: methods}`` reads ``rope+<method>`` (:meth:`Row.parse`); none here.
    EXTENSIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Whether rows may end in ``+coupled`` / ``+abacus`` (:data:`TASK_POSITION_SUFFIXES`).
    TASK_POSITION_ROWS: ClassVar[bool] = False
    FULL_PLANS: ClassVar[tuple[str, ...]] = HYBRID_PLANS

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
        """The rows of a preset whose ``encodings`` is None: every registered encoding, then
        the plans of ``FULL_PLANS``."""
        from posenc.encodings import REGISTRY

        return (*REGISTRY, *cls.FULL_PLANS)

    # --- checks ---------------------------------------------------------------------------

    def __post_init__(self) -> None:
        self._check_run()
        self._check_experiment()
        self._check_randomized_positions()

    def _check_run(self) -> None:
        check_names(self.encodings, "encodings", "encoding", "('rope', 'alibi')")
        if not isinstance(self.model, LMConfig):
            raise InvalidType(f"model must be a posenc.lab.model.LMConfig, got {type(self.model).__name__}")
        # parsed once, here; from now on the config holds Row objects (equal to their spellings)
        object.__setattr__(self, "encodings", tuple(self.parse_row(name) for name in self.encodings))
        for row in self.encodings:
            self.check_row(row)
        if not isinstance(self.train, TrainConfig):
            raise InvalidType(f"train must be a posenc.lab.train.TrainConfig, got {type(self.train).__name__}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) \
                or any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < SEED_LIMIT for s in self.seeds):
            raise InvalidArgument(f"seeds: give one or more distinct integers in [0, 2**63) (torch's seed range), "
                                  f"got {self.seeds}")
        check_device(self.device)

    def parse_row(self, name: str) -> Row:
        """The row spelled ``name`` as this experiment reads rows (:meth:`Row.parse` with its
        ``NAMED_RANDOMIZED_ROWS`` and ``EXTENSIONS``); a Row is returned as it is."""
        if isinstance(name, Row):
            return name
        if not isinstance(name, str):
            raise InvalidType(f"encodings: a row is a name (str), got {name!r}")
        return Row.parse(name, self.NAMED_RANDOMIZED_ROWS, self.EXTENSIONS or None)

    def check_row(self, row: Row) -> None:
        """Raise unless ``row``'s encoding is registered (or its plan valid for the model) and
        the experiment takes its positions; an extension row is the experiment's to check."""
        if row.extension is not None:  # no encoding of its own: the experiment checks it
            return
        if row.task_positions is not None and not self.TASK_POSITION_ROWS:
            raise InvalidArgument(f"encodings: row {row.name!r}: +{row.task_positions} positions follow a task's "
                                  "structure; only posenc lengthgen has such rows")
        if row.plan is not None:
            row.plan.check(self.model.num_layers, row.name)
        else:
            encoding_class(row.encoding)  # unknown names raise, listing the available ones
        if row.options:
            self._check_options(row)

    def _check_options(self, row: Row) -> None:
        """Build the row's encoding once with its options, so that a misspelt or bad option
        stops the command before any training (the message names the row)."""
        cls = encoding_class(row.encoding)
        sizes = self.model.encoding_sizes()
        taken = set(cls.model_sizes)
        for key, _ in row.options:
            if key in taken:
                raise InvalidArgument(f"encodings: row {row.name!r}: {key!r} is the model's size (set by the model), "
                                      "not an option of the row")
        try:
            create_for_model(row.encoding, **sizes, **dict(row.options))
        except (TypeError, InvalidArgument) as err:  # a misspelt keyword, or a bad value
            raise InvalidArgument(f"encodings: row {row.name!r}: {err}") from None

    def row(self, name: str) -> Row:
        """Row ``name`` of this config: the Row itself when given one (the config's rows are),
        else the spelling parsed (:meth:`parse_row`): a name handed in from outside."""
        return self.parse_row(name)

    def trained_row(self, name: str) -> Row:
        """The row named ``name`` among :attr:`rows`, as the config parsed it (a row provider's
        base, ``rope``).

        Raises:
            InvalidArgument: no row of that name.
        """
        for row in self.rows:
            if row == name:
                return row
        raise InvalidArgument(f"{name!r} is not a row of this config: its rows are {self.rows}")

    def _check_experiment(self) -> None:
        """The experiment's own fields (a subclass's checks; may set derived fields)."""

    def derived_row(self, name: str) -> bool:
        """Whether row ``name`` is built from another row's trained model rather than trained
        (``posenc lengthgen``'s ``rope+yarn``, ...: an extension row, :attr:`Row.extension`):
        no encoding of that name exists, and the experiment checks it in
        :meth:`_check_experiment`."""
        return self.row(name).extension is not None

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
        return any(row.randomized for row in self.encodings)

    @property
    def rows(self) -> list[Row]:
        """The trained rows, in table order: ``encodings`` as given, then, when
        ``randomized_positions`` is set and ``encodings`` names no ``+rand`` row, every
        encoding's ``+rand`` row."""
        if not self.randomized_positions or self._named_randomized_rows():
            return list(self.encodings)
        return [*self.encodings, *(Row(row.name, randomized=True, plan=row.plan) for row in self.encodings)]

    def row_training(self, row: str, train: TrainConfig) -> tuple[str, TrainConfig]:
        """(encoding, training) of ``row`` given the run's ``train``: a ``+rand`` row is its
        encoding trained with ``randomized_positions``."""
        parsed = self.row(row)
        if parsed.randomized:
            return parsed.encoding, dataclasses.replace(train, randomized_positions=self.randomized_positions)
        return parsed.encoding, train

    def run_fingerprint(self, fields: dict) -> dict:
        """What a run's result depends on (``fields``, in order, after the posenc version);
        the ``ADDED_LATER`` fields only when set. A stored run is reused only if it matches.
        Rows in it are their plain spellings (a checkpoint holds the fingerprint, and
        ``torch.load(weights_only=True)`` reads plain types only)."""
        return plain_strings(only_when_set({"posenc_version": __version__, **fields}, self.ADDED_LATER))

    def row_model(self, encoding: str | Row, model: LMConfig, train_len: int,
                  options: Callable[[str], dict] | None = None) -> str | PositionalEncoding | PositionPlan:
        """What the LM of a row is built from: its encoding's name (the encoding built with
        the row's options when it has some), or a plan row's
        :class:`PositionPlan` for ``model`` at training length ``train_len``
        (``options(name)``: the options each encoding is built with). ``encoding``: the row
        (a :class:`Row`, its suffix not read), or an encoding's spelling
        (:meth:`row_training`'s first item)."""
        spec = Row.of(encoding, randomized_rows=False)
        if spec.plan is not None:
            return spec.plan.build(model.encoding_sizes(), train_len, options)
        if spec.options:
            return create_for_model(spec.encoding, **model.encoding_sizes(), **dict(spec.options))
        return spec.encoding

    # --- what a run needs of the machine ---------------------------------------------------

    def workloads(self) -> list[Workload]:
        """The largest moments of one run (training, evaluation), for
        :func:`~posenc.lab.experiments.limits.check_memory`; a subclass lists its own."""
        return []

    def holds_a_table(self) -> bool:
        """Whether some row's model keeps a learned table of ``max_positions`` rows (a plan
        holds none: encodings of the embeddings are refused there)."""
        return holds_a_table(row.encoding for row in self.rows if row.plan is None)

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


def plain_strings(value: Any) -> Any:
    """``value`` with every :class:`Row` (a ``str`` subclass) inside it, keys included, turned
    into its plain spelling: what a checkpoint or any pickle outside posenc may hold."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {plain_strings(k): plain_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_strings(v) for v in value)
    return value


def diverged_label(name: str, res: dict) -> str:
    """A results row's name in a console table (rich markup), with the seeds that diverged
    (their scores are left out of the row's means)."""
    diverged = res.get("diverged") or {}
    # escaped: a row's options, path[forget_gate=true], are not markup
    return f"{escape(name)} [red](diverged: seed {', '.join(diverged)})[/]" if diverged else escape(name)


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
    """``path`` as CSV, ``columns`` then ``rows``, written atomically through a temporary file
    of this process (two processes writing the same folder never share one)."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows(rows)
    atomic_write_bytes(path, text.getvalue().encode("utf-8"))
