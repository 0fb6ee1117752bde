"""The position ids a ``posenc lengthgen`` row feeds its model: task-structured (``+coupled``,
``+abacus``) or randomized (``+rand``), through the explicit positions every encoding takes
(:meth:`posenc.lab.model.TransformerLM.forward`'s ``positions``).

A row ``<encoding>+<scheme>`` is the encoding trained and evaluated with these ids in place of
0, 1, 2, ... Each scheme gives every token of ``prompt + answer + END`` an integer id; training
feeds the ids of the inputs (every token but the last END), decoding those of the prompt and of
each generated token in turn.

**Slots.** Where a task has an alignment, every token of an instance has a *slot*
(:func:`layout`): a digit its significance (0 = units), a letter of copy or reverse the index
of the source letter it is or copies (0-based), and a separator a virtual slot next to the
segment it borders. The tasks write numbers least significant digit first (:class:`~posenc.lab.
experiments.tasks.Addition`), so significance is counted from the left of each number.

==========  ===========================================  ===========================================
task        tokens (size n)                              slots
==========  ===========================================  ===========================================
addition    a_0..a_{n-1} ``+`` b_0..b_{n-1} ``=``         0..n-1, -1, 0..n-1, -1, 0..n, n+1
            c_0..c_n END
copy        x_0..x_{n-1} ``=`` x_0..x_{n-1} END           0..n-1, -1, 0..n-1, n
reverse     x_0..x_{n-1} ``=`` x_{n-1}..x_0 END           0..n-1, n, n-1..0, -1
==========  ===========================================  ===========================================

Separators take the slot just before the segment that follows them in that segment's
direction (reverse's ``=`` sits past the last source letter, where its answer starts) and END
the slot just past the answer; END is never fed to the model (it is the last target), so its id
only bounds a learned table. Other tasks (sort, flip-flop, selective copy, passkey) have no
alignment that does not give the answer away (sort's order, selective copy's letter slots) or
none at all: a ``+coupled`` or ``+abacus`` row is refused there (:func:`check_task`).

**Schemes.**

- :class:`CoupledPositions` (position coupling, Cho et al. 2024, "Position Coupling: Improving
  Length Generalization of Arithmetic Transformers Using Task Structure", arXiv 2405.20671,
  section 3; their code's ``AdditionDatasetWithCoupledPositions``): id = offset + 1 + slot, so
  digits of equal significance in both operands and the answer share one id, and the
  separators sit one below the units. Training draws the offset per instance, uniform in
  ``0 .. R - 2 - max slot`` (the largest id stays below R); evaluation uses offset 0.
- :class:`AbacusPositions` (Abacus, McLeish et al. 2024, "Transformers Can Do Arithmetic with the
  Right Embeddings", arXiv 2405.17399, section 3.1; their ``abacus.py``): a digit's (letter's)
  id is its 1-based index within its number counted from the least significant digit, slot + 1,
  plus an offset k; every other token (``+``, ``=``, END) has id 0. Training draws k per
  instance uniform in [0, 100) (their code draws one k per batch, from 0 to ``max_k`` = 99);
  evaluation uses k = 0.
- :class:`RandomizedPositions` (Ruoss et al. 2023, "Randomized Positional Encodings Boost
  Length Generalization of Transformers", arXiv 2305.16843, section 3): each sequence's ids a
  sample of distinct integers from [0, L_max), sorted, in training (drawn by the training loop,
  :func:`posenc.lab.train.random_positions`) and at test (:meth:`RandomizedPositions.test_ids`).

With an absolute encoding (learned, sinusoidal) the ids index the table; a ``learned`` table
under ``+coupled`` or ``+abacus`` ids starts at the token embeddings' scale, N(0, 1)
(:data:`TASK_TABLE_INIT_STD`, :meth:`PositionScheme.encoding_options`), as in both papers' code,
not at the table's own default 0.02; with a relative one
(RoPE, T5, ALiBi, ...) only their differences count, so the training offset changes nothing
there and the coupling is what remains: an answer digit's query sees the operand digits it needs
at a fixed id distance whatever n is. Relative encodings that assume keys before the query (ALiBi,
Kerple, T5's causal buckets) see coupled ids of later slots as negative distances; that is what
the scheme gives them, not a bug.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.errors import InvalidArgument
from posenc.lab.experiments.tasks import Example, Task
from posenc.lab.generation import KVCache

#: The schemes with a task structure, by suffix name, and the tasks that have one.
TASK_SCHEMES = ("coupled", "abacus")
#: Tasks whose instances have an alignment (:func:`layout`).
ALIGNED_TASKS = ("addition", "copy", "reverse")
#: Abacus's training offset k is uniform in [0, ABACUS_MAX_OFFSET) (McLeish et al. 2024: 100).
ABACUS_MAX_OFFSET = 100
#: Ruoss et al. (2023) sample from L_max = 2048 for test lengths up to 500: about four times the
#: longest test sequence, the default range of a ``+rand`` row in ``posenc lengthgen``.
RANDOMIZED_RANGE_FACTOR = 4
#: The initial standard deviation of a learned table (``learned+coupled``, ``learned+abacus``)
#: that task-structured ids index: the token embeddings' (N(0, 1) in :class:`posenc.lab.model.
#: TransformerLM`), as in both papers' code (Cho et al.'s ``wpe`` is initialised at
#: ``initializer_factor * 1.0``, the scale of their T5 token embeddings; McLeish et al.'s Abacus
#: table is a default ``nn.Embedding``, N(0, 1)). The table's own default, 0.02 (GPT-2), sits 50x
#: below the tokens here: the ids then barely move the residual stream and addition stalls at
#: 1.4 nats per answer token (docs/results.md, issue 23).
TASK_TABLE_INIT_STD = 1.0
#: Position coupling's default range R: this many times the largest id of an instance of the
#: largest size trained or evaluated (Cho et al. train with max_pos 202 for 100-digit tests).
COUPLED_RANGE_FACTOR = 2


@dataclass(frozen=True)
class Layout:
    """Per token of ``prompt + answer + END``: its ``slot`` (see the module docstring) and
    whether it is a digit or letter of a number or string (``symbol``; False for separators
    and END)."""

    slots: tuple[int, ...]
    symbols: tuple[bool, ...]


def check_task(scheme: str, task: str, row: str | None = None) -> None:
    """Raise unless the task-structured ``scheme`` (``coupled``, ``abacus``) has a meaning for ``task``.

    Raises:
        InvalidArgument: ``task`` has no alignment; the message names the row, the task, the
            suffix and the tasks that have one.
    """
    if task not in ALIGNED_TASKS:
        where = f"row {row!r}: " if row else ""
        raise InvalidArgument(
            f"encodings: {where}+{scheme} positions have no meaning for the task {task!r} (its tokens have no "
            f"alignment between prompt and answer); +{scheme} is defined for {', '.join(ALIGNED_TASKS)}"
        )


def _n(task: str, example: Example) -> int:
    """The size of an instance of an aligned task, read from its prompt."""
    return (len(example.prompt) - 2) // 2 if task == "addition" else len(example.prompt) - 1


def layout(task: str, example: Example) -> Layout:
    """The slots of every token of ``example.prompt + example.target`` (table in the module docstring).

    Raises:
        InvalidArgument: ``task`` has no alignment (:func:`check_task`).
    """
    if task not in ALIGNED_TASKS:
        raise InvalidArgument(f"task {task!r} has no alignment of prompt and answer; aligned: {', '.join(ALIGNED_TASKS)}")
    n = _n(task, example)
    source = list(range(n))
    if task == "addition":
        slots = [*source, -1, *source, -1, *range(n + 1), n + 1]
        symbols = [True] * n + [False] + [True] * n + [False] + [True] * (n + 1) + [False]
    elif task == "copy":
        slots = [*source, -1, *source, n]
        symbols = [True] * n + [False] + [True] * n + [False]
    else:  # reverse
        slots = [*source, n, *reversed(source), -1]
        symbols = [True] * n + [False] + [True] * n + [False]
    if len(slots) != len(example.prompt) + len(example.target):
        raise InvalidArgument(f"an instance of {task} does not have the layout of size {n}: {example.prompt!r}")
    return Layout(tuple(slots), tuple(symbols))


class PositionScheme:
    """The ids of one row's tokens. Subclasses set ``name`` and implement the methods."""

    name: ClassVar[str]

    def train_ids(self, task: str, example: Example, rng: random.Random) -> list[int] | None:
        """Ids of every token of a training instance (prompt + target), drawn with ``rng``;
        None where the training loop draws them (``+rand``)."""
        raise NotImplementedError

    def test_ids(self, task: str, example: Example, rng: random.Random) -> list[int]:
        """Ids of every token of an evaluation instance (prompt + target)."""
        raise NotImplementedError

    def largest_test_id(self, task: Task, size: int) -> int:
        """The largest id an evaluation instance of ``size`` may use."""
        raise NotImplementedError

    def largest_train_id(self, task: Task, train_size: int) -> int:
        """The largest id a training instance of size <= ``train_size`` may use."""
        raise NotImplementedError

    def describe(self) -> dict:
        """The scheme as plain data (run fingerprints, results.json)."""
        raise NotImplementedError

    def encoding_options(self, encoding: str) -> dict:
        """Options the row's ``encoding`` is built with (:func:`posenc.create_for_model`): for a
        task-structured scheme on ``learned``, the table at the tokens' scale
        (``init_std`` = :data:`TASK_TABLE_INIT_STD`); none otherwise."""
        std = getattr(self, "table_init_std", None)
        return {"init_std": std} if std is not None and encoding == "learned" else {}


def _largest_slot(task: Task, size: int) -> int:
    return max(layout(task.name, task.example(size, random.Random(0))).slots)


@dataclass(frozen=True)
class CoupledPositions(PositionScheme):
    """Position coupling (Cho et al. 2024): id = offset + 1 + slot; the training offset uniform
    in ``0 .. range - 2 - max slot`` per instance, 0 at test. ``range`` is R: every training id
    is < R."""

    range: int
    table_init_std: float = TASK_TABLE_INIT_STD
    name: ClassVar[str] = "coupled"

    def ids(self, task: str, example: Example, offset: int) -> list[int]:
        return [offset + 1 + slot for slot in layout(task, example).slots]

    def train_ids(self, task, example, rng):
        largest = max(layout(task, example).slots)
        if self.range - 2 - largest < 0:
            raise InvalidArgument(f"coupled positions: range {self.range} holds no offset for an instance whose "
                                  f"largest slot is {largest} (needs >= {largest + 2})")
        return self.ids(task, example, rng.randint(0, self.range - 2 - largest))

    def test_ids(self, task, example, rng):
        return self.ids(task, example, 0)

    def largest_test_id(self, task, size):
        return 1 + _largest_slot(task, size)

    def largest_train_id(self, task, train_size):
        return self.range - 1

    def describe(self):
        return {"scheme": self.name, "range": self.range, "test_offset": 0}


@dataclass(frozen=True)
class AbacusPositions(PositionScheme):
    """Abacus (McLeish et al. 2024): a digit's or letter's id slot + 1 + k, every other token 0;
    k uniform in ``[0, max_offset)`` per training instance, 0 at test."""

    max_offset: int = ABACUS_MAX_OFFSET
    table_init_std: float = TASK_TABLE_INIT_STD
    name: ClassVar[str] = "abacus"

    def ids(self, task: str, example: Example, offset: int) -> list[int]:
        found = layout(task, example)
        return [offset + 1 + slot if symbol else 0 for slot, symbol in zip(found.slots, found.symbols)]

    def train_ids(self, task, example, rng):
        return self.ids(task, example, rng.randrange(self.max_offset))

    def test_ids(self, task, example, rng):
        return self.ids(task, example, 0)

    def _largest_symbol_slot(self, task: Task, size: int) -> int:
        found = layout(task.name, task.example(size, random.Random(0)))
        return max(slot for slot, symbol in zip(found.slots, found.symbols) if symbol)

    def largest_test_id(self, task, size):
        return 1 + self._largest_symbol_slot(task, size)

    def largest_train_id(self, task, train_size):
        return self.max_offset + self._largest_symbol_slot(task, train_size)

    def describe(self):
        return {"scheme": self.name, "max_offset": self.max_offset, "test_offset": 0}


@dataclass(frozen=True)
class RandomizedPositions(PositionScheme):
    """Randomized positions (Ruoss et al. 2023): a sorted sample of distinct ids from
    ``[0, range)`` per sequence, in training (drawn by :func:`posenc.lab.train.random_positions`,
    from ``TrainConfig.randomized_positions``) and at test."""

    range: int
    name: ClassVar[str] = "rand"

    def train_ids(self, task, example, rng):
        return None

    def test_ids(self, task, example, rng):
        length = len(example.prompt) + len(example.target)
        if length > self.range:
            raise InvalidArgument(f"randomized positions: {length} tokens do not fit [0, {self.range})")
        return sorted(rng.sample(range(self.range), length))

    def largest_test_id(self, task, size):
        return self.range - 1

    def largest_train_id(self, task, train_size):
        return self.range - 1

    def fits(self, task: Task, size: int) -> bool:
        """Whether an instance of ``size`` has no more tokens than the range has ids."""
        return task.sequence_length(size) <= self.range

    def describe(self):
        return {"scheme": self.name, "range": self.range, "at_test": "sampled"}


def positions_tensor(ids: Sequence[Sequence[int]], width: int) -> Tensor:
    """Rows of ids as an int64 (B, width) tensor, each cut at ``width`` or right-padded with 0
    (a padded slot is never read: causal attention keeps it from every real token)."""
    out = torch.zeros(len(ids), width, dtype=torch.long)
    for row, values in enumerate(ids):
        values = list(values)[:width]
        out[row, : len(values)] = torch.tensor(values, dtype=torch.long)
    return out


@torch.no_grad()
def greedy_decode(model, tokens: Tensor, positions: Tensor, steps: int) -> Tensor:
    """Greedily continue ``tokens`` (B, P) by ``steps`` tokens, the t-th new token placed at
    ``positions[:, P + t]`` (``positions``: int64 (B, P + steps) or more). Uses a
    :class:`~posenc.lab.generation.KVCache` when ``model.call_invariant``, else re-runs the
    whole sequence each step. Returns the new tokens, int64 (B, steps); ties go to the first
    maximum (``argmax``), as :meth:`~posenc.lab.model.TransformerLM.generate` does.

    Raises:
        InvalidArgument: fewer positions than P + steps - 1 (the last token is never fed back).
    """
    prompt = tokens.shape[1]
    if positions.shape[1] < prompt + steps - 1:
        raise InvalidArgument(f"positions: need {prompt + steps - 1} per row, got {positions.shape[1]}")
    cache = KVCache(model.config.num_layers) if model.call_invariant else None
    logits = model(tokens, positions[:, :prompt], cache=cache)[:, -1]
    generated = []
    for step in range(steps):
        generated.append(logits.argmax(dim=-1))
        if step + 1 == steps:
            break
        if cache is not None:
            at = prompt + step
            logits = model(generated[-1][:, None], positions[:, at : at + 1], cache=cache)[:, -1]
        else:
            sequence = torch.cat((tokens, torch.stack(generated, dim=1)), dim=1)
            logits = model(sequence, positions[:, : sequence.shape[1]])[:, -1]
    return torch.stack(generated, dim=1)


__all__ = [
    "ABACUS_MAX_OFFSET", "ALIGNED_TASKS", "COUPLED_RANGE_FACTOR", "RANDOMIZED_RANGE_FACTOR", "TASK_SCHEMES",
    "TASK_TABLE_INIT_STD",
    "AbacusPositions", "CoupledPositions", "Layout", "PositionScheme", "RandomizedPositions", "check_task",
    "greedy_decode", "layout", "positions_tensor",
]
