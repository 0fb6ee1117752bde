"""What determines the results of ``posenc extrapolate``: its config, presets and options.

:class:`ExtrapolationConfig` is a :class:`~posenc.lab.experiments.frame.RunConfig` (the model's
:class:`~posenc.lab.model.LMConfig` and the training's :class:`~posenc.lab.train.TrainConfig`,
whose fields and defaults are declared once, there; the rows, seeds and randomized rows every
experiment has) with the experiment's own fields. The flat options of the CLI and of
:func:`preset_config` (``steps``, ``d_model``, ``train_len``, ...) are mapped onto the composed
configs in one place, :data:`OPTIONS`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from posenc._validation import check_positive_int
from posenc.encodings import REGISTRY, create_for_model, encoding_class
from posenc.encodings.base import PositionalEncoding
from posenc.errors import InvalidArgument, InvalidType
from posenc.plan import PositionPlan
from posenc.lab.experiments.limits import Workload, holds_a_table
from posenc.lab.experiments.frame import CORE_ENCODINGS, MODEL_TRAIN_OPTIONS, RANDOMIZED_SUFFIX, Row, RunConfig, default_window
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig
from posenc.rope import EXTENSION_METHODS
from posenc.lab.experiments.extension_methods import BRANCH_METHODS, check_extension_method

#: Tokens a forward pass of the evaluation reads (posenc.lab.evaluate.evaluate_length's default).
EVAL_TOKENS_PER_BATCH = 16384

__all__ = [
    "COMPARISONS", "CORE_ENCODINGS", "FULL_RANDOMIZED", "OPTIONS", "PRESETS", "RANDOMIZED_SUFFIX", "ExtrapolationConfig",
    "preset_config", "text_encodings", "train_flops", "paper_hours", "check_gpu_preset", "GPU_PRESETS",
]

#: Flat option -> (composed config, its field): the options of every experiment, plus
#: ``train_len``, the training window (the L of "train short, test long"), ``steps`` and the
#: precision options. Every option but ``train_len`` keeps its field's name.
OPTIONS: dict[str, tuple[str, str]] = {
    "train_len": ("train", "seq_len"),
    "steps": ("train", "steps"),
    **MODEL_TRAIN_OPTIONS,
    "autocast": ("train", "autocast"),
    "compile": ("train", "compile"),
}

#: Named sizes, as options of :meth:`ExtrapolationConfig.from_options`. "default"
#: reproduces the prototype's setting (< 15 min on 2 cores); "quick" is a smoke run
#: (< 3 min); "full" is the default size over every encoding of 1-D text (None:
#: :func:`text_encodings`), the hybrid plans of current long-context models
#: (:data:`~posenc.lab.experiments.frame.HYBRID_PLANS`: SmolLM3's ``rope/nope:4`` and
#: Cohere2's ``rope@sliding/nope:4``) and the randomized rows of :data:`FULL_RANDOMIZED`; "gpu" is the
#: papers' setting on one GPU (L = 512, 25.5M parameters, evaluation to 16L, non-overlapping
#: and sliding windows of stride L; about 10 minutes per encoding on one H100, see
#: :func:`train_flops` and docs/results.md), run with ``--device cuda``; "paper" is Press et
#: al. (2022)'s Table 2 model (16 layers, d_model 1024, 8 heads, FFN 4096; byte-level here, so
#: 201M parameters against the paper's 247M with adaptive word inputs, and L = 512 bytes against
#: the paper's 512 words, about 5x less text per window) and its rows, evaluated at the table's
#: ratios of L (1012, 1512, 2512, 3512, 15512 over 512: about 2, 3, 5, 7 and 30), for one or
#: several GPUs (:func:`paper_hours`); refused on a CPU.
PRESETS: dict[str, dict] = {
    "quick": dict(steps=300, num_layers=2, eval_factors=(1, 2, 4, 8), eval_tokens=16384),
    "default": {},
    "full": dict(encodings=None),
    "gpu": dict(train_len=512, d_model=512, num_layers=8, num_heads=8, batch_size=64, steps=12000, lr=1e-3,
                eval_factors=(1, 2, 4, 8, 16), eval_tokens=1 << 20, eval_stride=512),
    "paper": dict(encodings=("sinusoidal", "rope", "t5", "alibi"), train_len=512, d_model=1024, num_layers=16,
                  num_heads=8, batch_size=64, steps=50000, lr=3e-4, eval_factors=(1, 2, 3, 5, 7, 30),
                  eval_tokens=1 << 20),
}

#: Comparison presets (``--preset NAME`` as well), kept apart from :data:`PRESETS`, whose
#: names the error messages have always listed.
COMPARISONS: dict[str, dict] = {
    "extension": dict(encodings=("rope",), seeds=(0, 1, 2), train_len=256, d_model=64, num_layers=4, num_heads=2,
                      batch_size=8, steps=1500, eval_factors=(0.5, 1, 2, 4, 8, 16), eval_tokens=32768,
                      extension_methods=EXTENSION_METHODS + BRANCH_METHODS, extension_factor=16, finetune_steps=150, finetune_factor=4,
                      drope_steps=150, drope_qk_norm=True, passkey_instances=8),
}

#: ``--preset extension`` (issue 26) compares every context extension on the same trained RoPE
#: checkpoints, 3 seeds: head_dim 32 at L = 256 bytes, so that YaRN's ramp (beta_fast 32,
#: beta_slow 1) has pairs on both sides (the fastest pair turns 40.7 times in L, the slowest
#: 0.007 times); every RoPE scaling at inference as a config fixed for 16 L would serve every
#: length (``extension_factor`` 16: the short texts show what a static scaling costs them) and
#: fine-tuned 150 steps (10% of N) at 4 L; every training-free branch-merge map (Self-Extend, ReRoPE,
#: Leaky ReRoPE, DCA, STRING, LM-Infinite, StreamingLLM; windows scaled to L: ``branch_defaults``); DroPE with and without QK-norm recalibrated the same
#: 150 steps at L, beside NoPE trained 1650 steps from scratch; bits per byte at L/2 .. 16L and a
#: passkey map (8 prompts per length and depth). docs/results.md states its time on 2 CPU threads.

#: Presets refused on a CPU, with their time estimate (:func:`paper_hours`): days to months there.
GPU_PRESETS = ("paper",)

#: Dense bf16 FLOP/s of one H100 SXM (NVIDIA's datasheet, without sparsity) and the fraction
#: of it a model of this size reaches in training (10-25% for small models; docs/results.md
#: measured 449,548 tokens/s for the 25.5M-parameter gpu preset, about 7%).
H100_FLOPS, MODEL_FLOPS_UTILIZATION = 989e12, 0.15
#: FLOP/s a CPU sustains in float32 training (a generous 100 GFLOP/s: many cores with AVX-512).
CPU_FLOPS = 100e9

#: The encodings that ``--preset full`` also trains with randomized positions (one row each,
#: N = the longest evaluation length): RoPE, the encoding Ruoss et al. (2023) helped most.
FULL_RANDOMIZED = ("rope",)


@dataclass(frozen=True)
class ExtrapolationConfig(RunConfig):
    """Everything that determines the results of ``posenc extrapolate``.

    Args:
        encodings: registered encoding names, one row each, or position plans
            (:data:`~posenc.lab.experiments.frame.PLAN_SPELLING`: ``rope/nope:4`` is NoPE on
            every 4th layer over RoPE, ``rope@sliding/nope:4`` RoPE with a sliding window of
            L/4 keys and NoPE with full attention on every 4th layer). A name may carry the suffix
            ``+rand`` (``"rope+rand"``): that encoding trained with randomized positions
            (see ``randomized_positions``); the plain name need not be in the list.
        model: the LM's sizes. Its ``max_positions`` is not read: it is set to
            ``learned_positions`` (default: the longest evaluation length, so the learned
            table's rows past L exist but are never trained); lengths past the table are
            reported as not applicable.
        train: the training run; ``train.seq_len`` is the training length L. Its ``seed`` is
            not read: each run trains with its own seed from ``seeds``.
        eval_factors: evaluation lengths as whole multiples (>= 1) of L, or L / k for a factor
            1 / k (0.5: L/2) where k divides L (the Python API and ``--preset extension``; the
            CLI's ``--eval-factors`` takes whole multiples).
        seeds: one run per (encoding, seed); results are means over seeds.
        eval_tokens: validation tokens read at every length (the same prefix for all).
        learned_positions: see ``model``.
        device: a torch device string.
        extension_methods: :data:`posenc.rope.EXTENSION_METHODS` names and the branch-merge
            maps of :data:`~posenc.lab.experiments.extension_methods.BRANCH_METHODS` (inference
            only) (CLI ``--rope-scaling``):
            rows for the trained rope model extended with each RoPE scaling, at inference and,
            with ``finetune_steps`` > 0, after a short fine-tune at ``finetune_factor`` x L
            (:mod:`posenc.lab.experiments.rope_extension`). ``finetune_lr`` None means
            ``train.lr / 10``; the fine-tune's batch is ``train.batch_size // finetune_factor``
            windows (the same tokens per step).
        randomized_positions: None, or N: the ``+rand`` rows are trained with randomized
            positional encodings (Ruoss et al. 2023: each window's positions a sorted random
            sample from [0, N), see :class:`posenc.lab.train.TrainConfig`) and evaluated at
            ordinary positions. N >= L; with a learned table in the sweep, N <= its size. When
            ``encodings`` names no ``+rand`` row, N gives every encoding a second row
            ``<name>+rand`` (CLI ``--randomized-positions N``); when it names some, those are
            the randomized rows, and None means N = the longest evaluation length.
        eval_stride: None (default), or S in [1, L]: every length is also evaluated with
            sliding windows of stride S (:func:`posenc.lab.evaluate.evaluate_length`), reported as
            ``eval_sliding`` beside the non-overlapping ``eval``.
        extension_factor: None (default): the inference rows ``rope+m`` use factor
            max(1, length / L) at each length; an integer F >= 2: factor F at every length.
        drope_steps: > 0 adds DroPE's rows (:mod:`posenc.lab.experiments.drope`): ``rope+drope``,
            the trained rope model as NoPE recalibrated this many steps at L, and its control
            ``nope+long``, NoPE trained from scratch for ``steps + drope_steps``; with
            ``drope_qk_norm`` also ``rope+drope+qknorm``. ``drope_lr`` None means ``train.lr / 3``.
        passkey_instances: > 0: every row also gets a zero-shot passkey map (``passkey``: per
            length and depth, the fraction of this many prompts whose key the model copies,
            :func:`posenc.lab.experiments.lm.passkey_map`).

    Mixed precision and compilation are ``train.autocast`` and ``train.compile`` (options
    ``autocast`` and ``compile``); the evaluation uses them too.

    Raises:
        InvalidType: ``encodings`` is not a sequence of names; ``model`` / ``train`` of the wrong type.
        InvalidArgument: any other bad value; the message names the field.
    """

    eval_factors: tuple[int, ...] = (1, 2, 4, 8, 16)
    eval_tokens: int = 65536
    learned_positions: int | None = None
    extension_methods: tuple[str, ...] = ()
    finetune_steps: int = 0
    finetune_factor: int = 4
    finetune_lr: float | None = None
    eval_stride: int | None = None
    extension_factor: int | None = None
    drope_steps: int = 0
    drope_lr: float | None = None
    drope_qk_norm: bool = False
    passkey_instances: int = 0

    PRESETS: ClassVar[dict[str, dict]] = PRESETS
    OPTIONS: ClassVar[dict[str, tuple[str, str]]] = OPTIONS
    #: results.json's order since the first runs
    FIELD_ORDER: ClassVar[tuple[str, ...]] = (
        "encodings", "model", "train", "eval_factors", "seeds", "eval_tokens", "learned_positions", "device",
        "extension_methods", "finetune_steps", "finetune_factor", "finetune_lr", "randomized_positions", "eval_stride",
        "extension_factor", "drope_steps", "drope_lr", "drope_qk_norm", "passkey_instances",
    )
    #: options added after the first stored runs (the sliding-window stride, the options an
    #: encoding takes from L, the precision options): in results.json and fingerprints only when set
    ADDED_LATER: ClassVar[dict[str, object]] = {
        "train.autocast": None, "train.compile": False, "eval_stride": None, "encoding_options": {},
        "extension_factor": None, "drope_steps": 0, "drope_lr": None, "drope_qk_norm": False, "passkey_instances": 0,
    }
    NAMED_RANDOMIZED_ROWS: ClassVar[bool] = True

    @classmethod
    def from_options(cls, **options) -> ExtrapolationConfig:
        """A config from flat options: the fields above plus the :data:`OPTIONS` names
        (``train_len``, ``steps``, ``batch_size``, ``lr``, ``d_model``, ``num_layers``,
        ``num_heads``, ``autocast``, ``compile``), which override the defaults of ``model`` / ``train``.

        Raises:
            InvalidType, InvalidArgument: as the constructor; TypeError: an unknown option.
        """
        if "train_len" in options:
            check_positive_int(options["train_len"], "train_len")  # TrainConfig would call it seq_len
        return super().from_options(**options)

    @classmethod
    def from_preset(cls, preset: str = "default", **overrides) -> ExtrapolationConfig:
        """As :meth:`RunConfig.from_preset`, and the comparisons of :data:`COMPARISONS`.

        Raises:
            InvalidArgument: an unknown preset (the message lists both kinds).
        """
        if preset in COMPARISONS:
            values = {**COMPARISONS[preset], **{k: v for k, v in overrides.items() if v is not None}}
            return cls.from_options(**values)
        if preset not in cls.PRESETS:
            raise InvalidArgument(f"preset must be one of {list(cls.PRESETS)} or a comparison {list(COMPARISONS)}, "
                                  f"got {preset!r}")
        return super().from_preset(preset, **overrides)

    @classmethod
    def every_encoding(cls) -> tuple[str, ...]:
        """``--preset full``'s rows: :func:`text_encodings`, the hybrid plans (``FULL_PLANS``),
        then :data:`FULL_RANDOMIZED` randomized."""
        return (*text_encodings(), *cls.FULL_PLANS, *(Row(name, randomized=True).name for name in FULL_RANDOMIZED))

    def _check_experiment(self) -> None:
        check_positive_int(self.eval_tokens, "eval_tokens")
        if not self.eval_factors or not all(self._whole_length(f) for f in self.eval_factors):
            raise InvalidArgument(
                "eval_factors: evaluation lengths are whole multiples >= 1 of train_len, or train_len / k for a factor "
                f"1 / k (0.5: L/2) where k divides train_len (no evaluation shorter than L otherwise), got {self.eval_factors}"
            )
        if self.eval_tokens < max(self.eval_lengths):
            raise InvalidArgument(f"eval_tokens={self.eval_tokens} must be >= the longest eval length {max(self.eval_lengths)}")
        if self.learned_positions is not None:
            check_positive_int(self.learned_positions, "learned_positions")
        # the learned table's size is the experiment's to set (see model above)
        object.__setattr__(
            self, "model", dataclasses.replace(self.model, max_positions=self.learned_positions or max(self.eval_lengths))
        )
        if self.eval_stride is not None:
            check_positive_int(self.eval_stride, "eval_stride")
            if self.eval_stride > self.train_len:
                raise InvalidArgument(f"eval_stride={self.eval_stride} must be <= train_len={self.train_len} "
                                      "(each sliding window scores its last eval_stride tokens)")
        self._check_rope_extension()

    def _whole_length(self, factor: object) -> bool:
        """Whether ``factor`` is an integer >= 1, or 1 / k with k an integer dividing L."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
            return False
        if factor >= 1:
            return isinstance(factor, int)
        divisor = round(1 / factor)
        return math.isclose(factor * divisor, 1.0, rel_tol=1e-12) and self.train_len % divisor == 0

    def default_randomized_positions(self) -> int:
        """The longest evaluation length: Ruoss et al. sample positions up to (at least) the
        longest length they test at."""
        return max(self.eval_lengths)

    def _check_randomized_range(self, option: str) -> None:
        if self.randomized_positions < self.train_len:
            raise InvalidArgument(f"{option}={self.randomized_positions} must be >= train_len={self.train_len}")
        table = self.model.max_positions
        if self.randomized_positions > table and any(
                _holds_a_table(row.encoding, self.model) for row in self.rows
                if row.randomized and row.plan is None):  # a plan holds no table: embed encodings are refused there
            raise InvalidArgument(
                f"{option}={self.randomized_positions} is past the learned table's {table} positions "
                "(learned_positions, default the longest eval length): raise learned_positions or lower N"
            )

    def _check_rope_extension(self) -> None:
        methods = "extension_methods (--rope-scaling)"
        if isinstance(self.extension_methods, str) or not isinstance(self.extension_methods, (tuple, list)):
            raise InvalidType(f"{methods} must be a sequence of method names, e.g. ('yarn',), got {self.extension_methods!r}")
        unknown = [m for m in self.extension_methods if m not in (*EXTENSION_METHODS, *BRANCH_METHODS)]
        if unknown:
            raise InvalidArgument(f"{methods}: unknown method(s) {unknown}; choose from {list(EXTENSION_METHODS)}")
        for method in self.extension_methods:
            check_extension_method(method)  # the one construction the rows use (extension_methods._extension_encoding)
        if len(set(self.extension_methods)) != len(self.extension_methods):
            raise InvalidArgument(f"{methods}: each method once, got {list(self.extension_methods)}")
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            raise InvalidArgument(f"finetune_steps must be an integer >= 0, got {self.finetune_steps!r}")
        if (self.extension_methods or self.finetune_steps) and "rope" not in self.encodings:
            raise InvalidArgument(
                f"{methods} / finetune_steps extend the trained rope model: add rope to encodings (got {list(self.encodings)})"
            )
        if isinstance(self.finetune_factor, bool) or not isinstance(self.finetune_factor, int) or self.finetune_factor < 2:
            raise InvalidArgument(f"finetune_factor must be an integer >= 2 (fine-tune at that many times L), got {self.finetune_factor!r}")
        if self.finetune_lr is not None and not (self.finetune_lr > 0 and math.isfinite(self.finetune_lr)):
            raise InvalidArgument(f"finetune_lr must be a finite number > 0, got {self.finetune_lr!r}")
        if self.extension_factor is not None and (isinstance(self.extension_factor, bool) or not isinstance(
                self.extension_factor, int) or self.extension_factor < 2):
            raise InvalidArgument(f"extension_factor must be None (factor length / L) or an integer >= 2, got {self.extension_factor!r}")
        for name in ("drope_steps", "passkey_instances"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{name} must be an integer >= 0, got {value!r}")
        if self.drope_steps and "rope" not in self.encodings:
            raise InvalidArgument(f"drope_steps: DroPE recalibrates the trained rope model: add rope to encodings "
                                  f"(got {list(self.encodings)})")
        if not isinstance(self.drope_qk_norm, bool):
            raise InvalidArgument(f"drope_qk_norm must be True or False, got {self.drope_qk_norm!r}")
        if self.drope_qk_norm and not self.drope_steps:
            raise InvalidArgument("drope_qk_norm: the QK-norm row is a DroPE row: set drope_steps > 0")
        if self.drope_lr is not None and not (isinstance(self.drope_lr, (int, float)) and not isinstance(self.drope_lr, bool)
                                              and self.drope_lr > 0 and math.isfinite(self.drope_lr)):
            raise InvalidArgument(f"drope_lr must be a finite number > 0, got {self.drope_lr!r}")
        if self.passkey_instances:
            from posenc.lab.experiments.lm import passkey_prompts

            try:
                passkey_prompts(min(self.eval_lengths), 0.0, 0, random.Random(0))
            except InvalidArgument as error:
                raise InvalidArgument(f"passkey_instances: the shortest evaluation length is too short ({error}): "
                                      "raise train_len or the smallest eval factor") from None

    @property
    def train_len(self) -> int:
        """The training length L in tokens (``train.seq_len``)."""
        return self.train.seq_len

    @property
    def eval_lengths(self) -> list[int]:
        """The evaluation lengths in tokens, ascending: L times each of ``eval_factors``."""
        return sorted({round(self.train_len * f) for f in self.eval_factors})

    def model_config(self) -> LMConfig:
        """The LM every run builds (``model``, with ``max_positions`` set as documented)."""
        return self.model

    def encoding_options(self, name: str) -> dict:
        """The options the encoding ``name`` is built with in this experiment: those it scales
        with the training length L (:meth:`~posenc.PositionalEncoding.options_for_train_len`:
        iRoPE's attention_chunk_size and floor_scale = L // 4), else none. The model's
        ``max_positions`` is the table size (the longest evaluation length), not L.

        For a plan row: ``{"window": W}`` when a sliding or chunked part takes its window from
        L (:func:`~posenc.lab.experiments.frame.default_window`), and each of its encodings' own
        options from L under its name; empty otherwise (then the fingerprint, which holds these
        only when set, is the row's name and the run's fields alone).

        ``name``: the row (a :class:`~posenc.lab.experiments.frame.Row`, its suffix not read) or
        an encoding's spelling."""
        spec = Row.of(name, randomized_rows=False)
        plan = spec.plan
        if plan is None:
            return encoding_class(spec.encoding).options_for_train_len(self.train_len)
        options: dict = {"window": default_window(self.train_len)} if plan.uses_default_window() else {}
        for part in plan.encodings:
            if own := encoding_class(part).options_for_train_len(self.train_len):
                options[part] = own
        return options

    def encoding(self, name: str) -> PositionalEncoding | PositionPlan | str:
        """What the LM of ``name`` is built from: the name itself, or, when the encoding takes
        options from L (:meth:`encoding_options`), the encoding built with them for the model;
        for a plan row its :class:`~posenc.plan.PositionPlan` (each encoding with its
        options from L). ``name``: the row (a :class:`~posenc.lab.experiments.frame.Row`, its
        suffix not read) or an encoding's spelling."""
        spec = Row.of(name, randomized_rows=False)
        if spec.plan is not None:
            return self.row_model(spec, self.model, self.train_len,
                                  lambda part: encoding_class(part).options_for_train_len(self.train_len))
        options = {**self.encoding_options(spec), **dict(spec.options)}
        return create_for_model(spec.encoding, **self.model.encoding_sizes(), **options) if options else spec.encoding

    def train_config(self, seed: int) -> TrainConfig:
        """The training of the run with ``seed``."""
        return dataclasses.replace(self.train, seed=seed)

    def row_run(self, row: str, seed: int) -> tuple[str, TrainConfig]:
        """(encoding, training) of a trained row: ``<name>+rand`` is ``name`` trained with
        randomized positions."""
        return self.row_training(row, self.train_config(seed))

    def workloads(self) -> list[Workload]:
        """One run's largest moments: training (batch x L), the fine-tune (batch / f x f L)
        when asked, randomized positions (a sort of N random keys per sequence), and the
        evaluation at the longest length (``EVAL_TOKENS_PER_BATCH`` tokens a forward pass)."""
        table, train = self.holds_a_table(), self.train
        longest = max(self.eval_lengths)
        positions = train.batch_size * self.randomized_positions * 12 if self.randomized_positions else 0
        works = [Workload(f"training (batch {train.batch_size} x {self.train_len} tokens)", self.model,
                          train.batch_size, self.train_len, True, table, extra_bytes=positions),
                 Workload(f"evaluation at {longest} tokens", self.model, max(1, EVAL_TOKENS_PER_BATCH // longest),
                          longest, False, table)]
        if self.finetune_steps:
            batch, length = max(1, train.batch_size // self.finetune_factor), self.finetune_factor * self.train_len
            works.append(Workload(f"fine-tuning (batch {batch} x {length} tokens)", self.model, batch, length, True, table))
        return works

    def derived_fields(self) -> dict:
        """``train_len`` and ``eval_lengths``, after the fields in results.json."""
        return {"train_len": self.train_len, "eval_lengths": self.eval_lengths}


def _holds_a_table(name: str, model: LMConfig) -> bool:
    """Whether the encoding, built for ``model``, represents a bounded number of positions:
    read from its class (building it would allocate a table of ``max_positions`` rows while
    the config is still being checked)."""
    return holds_a_table((name,))


def text_encodings() -> list[str]:
    """The registered encodings whose positions are token indices (``position_axes`` 1): every
    one but the multi-axis RoPEs (mrope, axial_rope), which on text, every axis equal, are
    RoPE with another frequency order (M-RoPE exactly RoPE) and add no row of their own."""
    sizes = LMConfig().encoding_sizes()
    return [name for name in REGISTRY if create_for_model(name, **sizes).position_axes == 1]


def train_flops(config: ExtrapolationConfig, parameters: int) -> float:
    """Training FLOPs of one run: (6 N + 6 n_layers L d) per token times steps x batch x L
    tokens, N the model's parameter count (``parameters``), L the training length, d the width:
    6 N for the matrix products forward and backward (Kaplan et al. 2020, section 2.1), and
    6 n_layers L d for causal attention's two products (PaLM's 12 n_layers L d, Chowdhery et
    al. 2022, appendix B, halved by the causal mask)."""
    model, train = config.model, config.train
    per_token = 6 * parameters + 6 * model.num_layers * train.seq_len * model.d_model
    return per_token * train.steps * train.batch_size * train.seq_len


def paper_hours(config: ExtrapolationConfig, parameters: int, gpus: int = 1) -> float:
    """Hours to train every row of ``config`` once on ``gpus`` H100s at
    :data:`MODEL_FLOPS_UTILIZATION` (:func:`train_flops`; data-parallel scaling taken as perfect)."""
    seconds = train_flops(config, parameters) * len(config.encodings) * len(config.seeds) \
        / (H100_FLOPS * MODEL_FLOPS_UTILIZATION * gpus)
    return seconds / 3600


def check_gpu_preset(preset: str, config: ExtrapolationConfig, parameters: int) -> None:
    """Refuse a preset of :data:`GPU_PRESETS` on a CPU, with its estimate there and on GPUs.

    Raises:
        InvalidArgument: ``preset`` in :data:`GPU_PRESETS` and ``config.device`` a CPU.
    """
    if preset not in GPU_PRESETS or torch.device(config.device).type != "cpu":
        return
    cpu_days = train_flops(config, parameters) * len(config.encodings) * len(config.seeds) / CPU_FLOPS / 86400
    raise InvalidArgument(
        f"--preset {preset} trains {len(config.encodings)} x {parameters / 1e6:.0f}M-parameter models: about "
        f"{cpu_days:,.0f} days on a CPU at {CPU_FLOPS / 1e9:.0f} GFLOP/s; {paper_hours(config, parameters, 1):.0f} h on "
        f"one H100, {paper_hours(config, parameters, 8):.1f} h on 8 (at {MODEL_FLOPS_UTILIZATION:.0%} of bf16 peak): "
        "run it with --device cuda (torchrun --nproc-per-node N ... --parallel data for several GPUs)")


#: The preset's config with overrides (:meth:`ExtrapolationConfig.from_preset`).
preset_config = ExtrapolationConfig.from_preset
