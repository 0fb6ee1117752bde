"""Synthetic length-generalization tasks: one small generator per task, bytes as tokens.

Every instance is a ``prompt`` and an ``answer`` of ASCII text; the model reads the prompt
and must produce ``answer + END``. Each task has a **size** n (what "train at size <= N, test
at 4N" counts), defined per task below, and ``example(n, rng)`` draws one instance of size n
from a :class:`random.Random`, so an instance is a pure function of (task, n, seed).

The answer is always closed by the end marker :data:`END` (``"."``, which no answer holds
before its end): with bytes as tokens and greedy decoding the model itself must say where the
answer stops, and exact match (:func:`exact_match`) takes the continuation up to and including
its first END: "the whole answer right" means every answer byte and the END right after it,
so a truncated answer, an overlong one, or one that never stops are all wrong. Every answer
of one size has the same length (see the table), and so has every prompt: an evaluation
batch of one size needs no padding, and decoding runs ``len(answer) + 1`` steps.

==============  =========================================  ===================  =====================
task            prompt (size n)                            answer               source
==============  =========================================  ===================  =====================
copy            n letters a-z, then ``=``                  the same letters     NoPE paper, Ruoss
reverse         n letters a-z, then ``=``                  them reversed        NoPE paper, Ruoss
sort            n letters a-z, then ``=``                  them sorted (ASCII)  NoPE paper, Ruoss
addition        two n-digit numbers, least significant     their sum, n + 1     NoPE paper
                digit first: ``a+b=``                      digits, LSB first
flipflop        n instructions ``w<bit>``, ``i<bit>``,     the last written     Liu et al. 2023
                ``r<bit>``; the n-th is a bare ``r``       bit
selective_copy  n letters among n blanks ``_`` (2n         the n letters, in    CoPE paper (after
                bytes, blanks at random), then ``=``       order                Mamba's task)
passkey         n bytes of filler, ``key <5 digits>.`` at  the key              PI, Landmark
                a random depth in it, then ``key?``
==============  =========================================  ===================  =====================

Training draws sizes uniformly from ``min_size .. N`` (:meth:`Task.train_example`);
evaluation draws fresh instances of exactly one size.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import ClassVar
from posenc.errors import InvalidArgument

#: Closes every answer; the model must emit it (see the module docstring).
END = "."
#: The symbols of copy, reverse, sort and selective copy.
LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class Example:
    """One instance: the model reads ``prompt`` and must write ``answer + END``.

    ``depth`` is where a passkey sits in its filler (0 = start, 1 = end); None for other tasks.
    """

    prompt: str
    answer: str
    depth: float | None = None

    @property
    def target(self) -> str:
        """What the model must generate: the answer and the end marker."""
        return self.answer + END


class Task:
    """A generator of instances of one task. Subclasses set ``name``, ``size_unit``,
    ``min_size``, ``prompt_format``, ``answer_format`` and ``source`` and implement :meth:`example`."""

    name: ClassVar[str]
    #: What the size counts, for tables and figures.
    size_unit: ClassVar[str]
    #: The prompt and the answer of an instance of size n, in words (``posenc lengthgen --list``).
    prompt_format: ClassVar[str] = ""
    answer_format: ClassVar[str] = ""
    #: Where the task comes from.
    source: ClassVar[str] = ""
    #: The smallest size an instance can have.
    min_size: ClassVar[int] = 1

    def example(self, size: int, rng: random.Random, depth: float | None = None) -> Example:
        """One instance of ``size``, drawn with ``rng``. ``depth`` is read by passkey only.

        Raises:
            ValueError: size below :attr:`min_size`.
        """
        raise NotImplementedError

    def train_example(self, max_size: int, rng: random.Random) -> Example:
        """A training instance: its size uniform in ``min_size .. max_size``."""
        return self.example(rng.randint(self.min_size, max_size), rng)

    def prompt_length(self, size: int) -> int:
        """Bytes of every prompt of ``size`` (the same for all instances of one size)."""
        return len(self.example(size, random.Random(0)).prompt)

    def sequence_length(self, size: int) -> int:
        """Bytes of prompt + answer + END at ``size``: the positions a model needs."""
        example = self.example(size, random.Random(0))
        return len(example.prompt) + len(example.target)

    def _check_size(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < self.min_size:
            raise InvalidArgument(f"size of a {self.name} instance must be an integer >= {self.min_size}, got {size!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _letters(size: int, rng: random.Random) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(size))


class Copy(Task):
    """``"qhxa=" -> "qhxa"``: size n = number of letters (uniform over a-z)."""

    name, size_unit = "copy", "letters"
    prompt_format = "n letters a-z, then '='"
    answer_format = "the same letters"
    source = "NoPE paper (Kazemnejad et al. 2023); Ruoss et al. 2023"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = _letters(size, rng)
        return Example(text + "=", text)


class Reverse(Task):
    """``"qhxa=" -> "axhq"``: size n = number of letters."""

    name, size_unit = "reverse", "letters"
    prompt_format = "n letters a-z, then '='"
    answer_format = "them reversed"
    source = "NoPE paper (Kazemnejad et al. 2023); Ruoss et al. 2023"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = _letters(size, rng)
        return Example(text + "=", text[::-1])


class Sort(Task):
    """``"qhxa=" -> "ahqx"``: size n = number of letters (repeats kept)."""

    name, size_unit = "sort", "letters"
    prompt_format = "n letters a-z, then '='"
    answer_format = "them sorted (ASCII)"
    source = "NoPE paper (Kazemnejad et al. 2023); Ruoss et al. 2023"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = _letters(size, rng)
        return Example(text + "=", "".join(sorted(text)))


class Addition(Task):
    """Two n-digit numbers and their sum, every number written least significant digit first
    (as most length-generalization papers do, so that each answer digit needs only the
    digits already seen and the carry): 472 + 915 = 1387 is ``"274+519="`` -> ``"7831"``.
    Operands may start with zeros (every digit uniform); the answer always has n + 1 digits,
    its last (the carry out) possibly 0. Size n = digits per operand."""

    name, size_unit = "addition", "digits per operand"
    prompt_format = "two n-digit numbers, least significant digit first: 'a+b='"
    answer_format = "their sum, n + 1 digits, least significant first"
    source = "NoPE paper (Kazemnejad et al. 2023)"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        a = [rng.randrange(10) for _ in range(size)]  # least significant digit first
        b = [rng.randrange(10) for _ in range(size)]
        digits, carry = [], 0
        for x, y in zip(a, b):
            carry, digit = divmod(x + y + carry, 10)
            digits.append(digit)
        digits.append(carry)
        as_text = lambda ds: "".join(map(str, ds))  # noqa: E731
        return Example(f"{as_text(a)}+{as_text(b)}=", as_text(digits))


class FlipFlop(Task):
    """Flip-flop language (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop
    Language Modeling", arXiv 2306.00946): a string of n instructions, each an
    opcode and a bit, ``w`` (write the bit), ``i`` (ignore it), ``r`` (read: the bit is the
    last one written). The first is a write, the last a read whose bit is the answer:
    ``"w1i0r1i1w0i1r"`` -> ``"0"``. Opcodes in between are drawn as in their FFL(0.8):
    write 0.1, ignore 0.8, read 0.1; earlier reads carry their (right) bit. Size n = number
    of instructions (>= 2); the prompt is 2n - 1 bytes."""

    name, size_unit = "flipflop", "instructions"
    prompt_format = "n instructions w<bit>, i<bit>, r<bit>; the n-th a bare 'r'"
    answer_format = "the last written bit"
    source = "Liu et al. 2023 (flip-flop language)"
    min_size = 2
    P_WRITE, P_IGNORE = 0.1, 0.8

    def example(self, size, rng, depth=None):
        self._check_size(size)
        memory = rng.choice("01")
        parts = ["w" + memory]
        for _ in range(size - 2):
            draw = rng.random()
            if draw < self.P_WRITE:
                memory = rng.choice("01")
                parts.append("w" + memory)
            elif draw < self.P_WRITE + self.P_IGNORE:
                parts.append("i" + rng.choice("01"))
            else:
                parts.append("r" + memory)
        return Example("".join(parts) + "r", memory)


class SelectiveCopy(Task):
    """Copy the letters, skip the blanks (the CoPE paper's selective copy, Golovneva et al.
    2024, arXiv 2405.18719, after Gu and Dao's Mamba; their in-distribution split has as many
    blanks as letters, as here): n letters among n blanks ``_``, their places random:
    ``"_q__hx_a="`` -> ``"qhxa"``. Size n = letters to copy; the prompt is 2n + 1 bytes."""

    name, size_unit = "selective_copy", "letters"
    prompt_format = "n letters among n blanks '_', then '='"
    answer_format = "the n letters, in order"
    source = "CoPE paper (Golovneva et al. 2024), after Mamba"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = _letters(size, rng)
        slots = sorted(rng.sample(range(2 * size), size))
        cells = ["_"] * (2 * size)
        for slot, letter in zip(slots, text):
            cells[slot] = letter
        return Example("".join(cells) + "=", text)


class Passkey(Task):
    """Passkey retrieval (Chen et al. 2023, Position Interpolation, arXiv 2306.15595; Mohtashami
    and Jaggi 2023, Landmark Attention, arXiv 2305.16300): ``n`` bytes of the PI filler (its five
    sentences repeated, cut at n bytes), the sentence ``KEY_SENTENCE`` with a random 5-digit
    key inserted at byte ``round(depth * n)`` of it, then ``QUESTION``; the answer is the key:
    ``"The grass is green. key 36937. The sky is blue. key? "`` -> ``"36937"``.

    The papers' key sentence ("The pass key is 12345. Remember it. 12345 is the pass key.")
    and question ("What is the pass key? The pass key is") are instructions for a pretrained
    model; ours is trained on the format from scratch and needs only the marker ``key``, so
    both are cut to 18 bytes of fixed text. The filler then fills most of each prompt,
    and the task is learned in a third of the steps: with PI's wording (47 fixed bytes),
    RoPE had not learned it after 1,600 steps at N = 16; with this one it had by step 900.
    Size n = filler bytes (the prompt is n + 18 bytes). ``depth`` is uniform in [0, 1] unless
    given (evaluation uses a grid of depths, see :data:`DEPTHS`)."""

    name, size_unit = "passkey", "filler bytes"
    prompt_format = "n bytes of filler, 'key <5 digits>.' at a random depth in it, then 'key?'"
    answer_format = "the 5-digit key"
    source = "Position Interpolation (Chen et al. 2023); Landmark Attention"
    min_size = 0
    FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    KEY_SENTENCE = " key {key}. "
    QUESTION = " key? "
    KEY_DIGITS = 5

    def example(self, size, rng, depth=None):
        self._check_size(size)
        if depth is None:
            depth = rng.random()
        elif not 0 <= depth <= 1:
            raise InvalidArgument(f"depth must be in [0, 1], got {depth!r}")
        key = "".join(rng.choice(string.digits) for _ in range(self.KEY_DIGITS))
        filler = (self.FILLER * (size // len(self.FILLER) + 1))[:size]
        cut = round(depth * size)
        prompt = filler[:cut] + self.KEY_SENTENCE.format(key=key) + filler[cut:] + self.QUESTION
        return Example(prompt, key, depth)


#: Passkey evaluation depths: instances of one size are spread evenly over these.
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

#: Every task by name, in table order.
TASKS: dict[str, Task] = {task.name: task for task in (
    Copy(), Reverse(), Sort(), Addition(), FlipFlop(), SelectiveCopy(), Passkey()
)}


def get_task(name: str) -> Task:
    """The task called ``name``.

    Raises:
        ValueError: an unknown name (the message lists the tasks).
    """
    if name not in TASKS:
        raise InvalidArgument(f"unknown task {name!r}; available: {', '.join(TASKS)}")
    return TASKS[name]


def eval_examples(task: Task, size: int, count: int, seed: int) -> list[Example]:
    """``count`` fresh instances of exactly ``size``, from a generator seeded by (task, size,
    seed) alone, so every encoding is scored on the same instances. For passkey, the i-th
    instance sits at depth ``DEPTHS[i % len(DEPTHS)]``."""
    rng = random.Random(f"eval/{task.name}/{size}/{seed}")
    if isinstance(task, Passkey):
        return [task.example(size, rng, DEPTHS[i % len(DEPTHS)]) for i in range(count)]
    return [task.example(size, rng) for _ in range(count)]


def exact_match(generated: str, example: Example) -> bool:
    """Whether ``generated`` (the continuation of the prompt) is the whole answer: its text up
    to and including the first :data:`END` must equal ``answer + END``. A prefix of the answer,
    an answer with extra bytes, or one without the end marker is wrong."""
    cut = generated.find(END)
    return cut >= 0 and generated[: cut + 1] == example.target


__all__ = [
    "DEPTHS", "END", "LETTERS", "TASKS", "Addition", "Copy", "Example", "FlipFlop", "Passkey", "Reverse",
    "SelectiveCopy", "Sort", "Task", "eval_examples", "exact_match", "get_task",
]
