"""The context-extension rows of ``posenc lengthgen``: ``rope+<method>``, the trained ``rope``
model of a task run at every test size with a RoPE scaling or a branch-merge map, no training.

The synthetic-task counterpart of ``posenc extrapolate``'s inference rows
(:mod:`posenc.lab.experiments.rope_extension`): the same methods, reaching the model through the
same function (:func:`~posenc.lab.experiments.extension_methods._extension_encoding`), so the
two comparisons differ only in what they score (exact match on a task against loss on text).

- ``rope+m`` for m a RoPE scaling of :data:`posenc.rope.EXTENSION_METHODS` (linear, ntk,
  dynamic, yarn, dynamic_yarn, llama3): at size n the model's RoPE is replaced by one with
  scaling m at factor s = max(1, T(n) / T(N)) and L0 = T(N) (:func:`posenc.rope.extension_scaling`),
  T(n) the tokens of an instance of size n (prompt + answer + END) and N the task's training
  size: the factor the context needs, in positions, as a user sets it for a target length. At
  n <= N, s = 1 and every scaling is the plain RoPE: the row's scores there are the ``rope``
  row's, bit for bit.
- ``rope+m`` for m a branch-merge map of
  :data:`~posenc.lab.experiments.extension_methods.BRANCH_METHODS` (self_extend, rerope,
  leaky_rerope, dca, string, lm_infinite, streaming_llm): the trained RoPE with that map at
  every size, its windows the reference's scaled to L0 = T(N)
  (:func:`~posenc.lab.experiments.extension_methods.branch_defaults`). A map is plain RoPE only
  inside its window: LM-Infinite (local branch L0) everywhere up to N, DCA up to its chunk
  (3 L0 / 4); Self-Extend, ReRoPE, Leaky ReRoPE, STRING and StreamingLLM change distances past
  L0 / 4, L0 / 8, L0 / 8, int(0.33 L0) and 4 + L0 / 8 already inside the training length, and
  STRING also multiplies every logit by its attention factor squared (1.1386), as in
  ``posenc extrapolate``.

A row is named in ``--encodings`` (every task) or ``--task-rows`` (one task) like any row; it
needs the plain ``rope`` row among that task's rows (its trained model is the one extended).
Each (task, row, seed) is a record of the sweep's run store, its fingerprint the ``rope`` run's
plus the extension's settings, so it resumes; its model is the ``rope`` run's final training
checkpoint. The model is never told which method it runs: its ``encoding`` module is swapped
(RoPE holds no parameters, so the weights are untouched).

Not a row provider (:mod:`posenc.lab.experiments.rows`) as ``extrapolate``'s are: there the
rows come from options (``--rope-scaling``) and run on rank 0 once the sweep is done; here they
are rows like any other, named per task, so the sweep runs them itself, as a second pass of
the same run store after every trained run (:func:`posenc.lab.experiments.lengthgen.run_lengthgen`),
split across ranks and worker processes as the trained runs are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posenc.encodings.base import PositionalEncoding
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument
from posenc.lab.experiments.extension_methods import (
    BRANCH_METHODS,
    _extension_encoding,
    branch_defaults,
)
from posenc.lab.experiments.frame import Row
from posenc.rope import EXTENSION_METHODS

__all__ = ["BASE", "EXTENSIONS", "METHODS", "check_extension_row", "check_extension_spelling", "encoding_at", "extension_method", "extension_rows",
           "extension_settings", "inference_factor"]

#: The row whose trained model every extension row runs.
BASE = "rope"

#: Every method a row ``rope+<method>`` may name: the RoPE scalings, then the branch-merge maps.
METHODS: tuple[str, ...] = (*EXTENSION_METHODS, *BRANCH_METHODS)
#: The extension rows as :meth:`Row.parse <posenc.lab.experiments.frame.Row.parse>` reads them:
#: ``rope+<method>``.
EXTENSIONS: dict[str, tuple[str, ...]] = {BASE: METHODS}


def extension_rows() -> list[str]:
    """Every extension row, in table order: ``rope+<m>`` for m in :data:`METHODS`."""
    return [f"{BASE}+{method}" for method in METHODS]


def extension_method(row: str) -> str | None:
    """The method of an extension row (``"rope+yarn"`` -> ``"yarn"``); None for any other row
    (``rope``, ``rope+rand``, ``alibi``, ...) or a spelling no row has (``rope+yaml``). A
    :class:`~posenc.lab.experiments.frame.Row` states it (``Row.extension``); a spelling is read
    by the one parser of rows, :meth:`Row.parse <posenc.lab.experiments.frame.Row.parse>`."""
    if isinstance(row, Row):
        return row.extension
    try:
        return Row.parse(row, extensions=EXTENSIONS).extension
    except InvalidArgument:
        return None


def inference_factor(length: int, train_length: int) -> float:
    """s of a RoPE-scaling row on a sequence of ``length`` tokens: max(1, length / L0)."""
    return max(1.0, length / train_length)


def encoding_at(rope: RoPE, method: str, train_length: int) -> Callable[[int], PositionalEncoding]:
    """The encoding the trained model runs with on a sequence of ``length`` tokens, as a
    function of ``length``: ``rope`` with ``method`` at factor :func:`inference_factor` and
    L0 = ``train_length`` (a branch map ignores the factor)."""
    def at(length: int) -> PositionalEncoding:
        return _extension_encoding(rope, method, {
            "factor": inference_factor(length, train_length), "original_max_position_embeddings": train_length})

    return at


def extension_settings(method: str, train_length: int) -> dict[str, Any]:
    """What an extension row's result depends on beyond the ``rope`` run: its method, how the
    factor is set, L0 and (a branch map) the map's parameters. Part of its fingerprint."""
    settings: dict[str, Any] = {"base": BASE, "method": method, "original_max_position_embeddings": train_length}
    if method in BRANCH_METHODS:
        settings["parameters"] = branch_defaults(method, train_length)
    if method in BRANCH_METHODS and "factor" in settings["parameters"]:
        settings["parameters"]["factor"] = "max(1, sequence_length / original_max_position_embeddings)"
    elif method not in BRANCH_METHODS:
        settings["factor"] = "max(1, sequence_length / original_max_position_embeddings)"
    return settings


def check_extension_row(row: Row, task: str, rows: list[str], head_dim: int, train_length: int) -> None:
    """Raise unless extension ``row`` can run on ``task``: the ``rope`` row among the task's
    ``rows`` (its trained model is the one extended), and the method buildable for a model of
    ``head_dim`` trained on sequences of ``train_length`` tokens (a branch map's windows,
    scaled to it, must be valid: STRING needs L0 >= 7, DCA and ReRoPE L0 >= 2).

    Raises:
        InvalidArgument: the ``rope`` row missing, or the method refused at this L0; the
            message names the row, the task and what to change.
    """
    method = row.extension
    if BASE not in rows:
        raise InvalidArgument(
            f"encodings/task_rows: row {row!r} on {task} runs the trained {BASE} model of that task at test time, "
            f"but {BASE} is not among {task}'s rows {rows}: add {BASE} to --encodings (or {task}={BASE} to --task-rows)")
    try:
        _extension_encoding(RoPE(head_dim), method, {"factor": 2.0, "original_max_position_embeddings": train_length})
    except InvalidArgument as err:
        raise InvalidArgument(
            f"encodings/task_rows: row {row!r} cannot run on {task}: its training sequences are {train_length} tokens, "
            f"and {method} at that length is refused ({err}); raise --train-size or drop the row") from None


def check_extension_spelling(row: str) -> None:
    """Raise for a ``rope+<name>`` row whose name is neither a position suffix nor a method
    (a typo such as ``rope+yaml``), listing the methods.

    Raises:
        InvalidArgument: as said.
    """
    Row.parse(row, extensions=EXTENSIONS)
