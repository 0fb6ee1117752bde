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
mqar            n pairs ``<2-letter key><digit>``, ``?``,   their values, in     Zoology (Arora et
                ceil(n/2) of the keys, then ``=``          query order          al. 2023)
parity          n bits, then ``=``                         ``1`` if the count   Deletang et al.
                                                           of 1s is odd, ``0``  2023
modular         n numbers 0-4 joined by n - 1 of ``+-*``,  the value mod 5      Deletang et al.
                then ``=``                                 (``*`` binds first)  2023
cycle           n moves ``l`` (-1), ``s`` (0), ``r`` (+1)  the final position   Deletang et al.
                from 0 on a cycle of 5, then ``=``         0-4                  2023
bucket_sort     n symbols 0-4, then ``=``                  them sorted          Deletang et al.
duplicate       n bits ``a``/``b``, then ``=``             them twice           Deletang et al.
missing         n bits ``a``/``b`` written twice, one of   the hidden bit       Deletang et al.
                the 2n replaced by ``_``, then ``=``
multikey        passkey's filler with 4 needles            that key's value     RULER (Hsieh et
                ``key <2 letters> <5 digits>.``, then                           al. 2024)
                ``key <one of the keys>?``
vartrack        filler with two chains of 4 assignments    the 4 variables of   RULER (Hsieh et
                (``ab=<5 digits>.``, ``cd=ab.``, ...),     that chain, in       al. 2024)
                then ``=<one chain's value>?``             order
counting        n symbols a-d, then ``?<one of a-d>=``     how many of the n    CoPE paper (Golovneva
                                                           are that symbol, 3   et al. 2024), simplest
                                                           digits: ``007``      form
==============  =========================================  ===================  =====================

The tasks from mqar on are in the catalogue (``posenc lengthgen --list``, ``--tasks``), not in
the default run.

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
    #: The largest size an instance can have (None: no bound), where distinct symbols run out.
    max_size: ClassVar[int | None] = None
    #: Whether :meth:`example` reads ``depth`` (evaluation then spreads instances over :data:`DEPTHS`).
    uses_depth: ClassVar[bool] = False

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
        if self.max_size is not None and size > self.max_size:
            raise InvalidArgument(f"size of a {self.name} instance must be at most {self.max_size}, got {size}")

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
    uses_depth = True
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


def _pairs_of_letters(count: int, rng: random.Random) -> list[str]:
    """``count`` distinct two-letter names (of the 676), in random order."""
    return [LETTERS[i // 26] + LETTERS[i % 26] for i in rng.sample(range(26 * 26), count)]


def _filler(size: int) -> str:
    """Passkey's filler cut at ``size`` bytes."""
    return (Passkey.FILLER * (size // len(Passkey.FILLER) + 1))[:size]


def _insert(filler: str, pieces: list[tuple[int, str]]) -> str:
    """``filler`` with each (cut, text) inserted at byte ``cut`` of it; pieces at one cut keep
    their order in ``pieces``."""
    out, last = [], 0
    for cut, text in sorted(pieces, key=lambda piece: piece[0]):  # stable: ties keep their order
        out += [filler[last:cut], text]
        last = cut
    return "".join(out) + filler[last:]


class MQAR(Task):
    """Multi-query associative recall (Arora et al. 2023, "Zoology: Measuring and Improving
    Recall in Efficient Language Models", arXiv 2312.04927): n key-value pairs, each a distinct
    two-letter key and a digit, then ``?``, ceil(n/2) distinct keys among them in random order,
    then ``=``; the answer is their values in query order: ``"ab3cd7ef1?cdab="`` -> ``"73"``.
    Size n = key-value pairs (at most 676, the two-letter keys); the prompt is 3n + 2 +
    2 ceil(n/2) bytes. Zoology writes the answers after each query and scatters the queries
    among noise tokens at power-law gaps; here the queries follow the pairs and the values come
    after all of them, so the gap between a pair and its query grows with n."""

    name, size_unit = "mqar", "key-value pairs"
    prompt_format = "n pairs '<2-letter key><digit>', '?', ceil(n/2) of the keys, then '='"
    answer_format = "their values, in query order"
    source = "Zoology (Arora et al. 2023)"
    max_size = 26 * 26

    def example(self, size, rng, depth=None):
        self._check_size(size)
        keys = _pairs_of_letters(size, rng)
        values = [rng.choice(string.digits) for _ in range(size)]
        asked = rng.sample(range(size), (size + 1) // 2)
        pairs = "".join(key + value for key, value in zip(keys, values))
        queries = "".join(keys[i] for i in asked)
        return Example(f"{pairs}?{queries}=", "".join(values[i] for i in asked))


class Parity(Task):
    """Parity check (Deletang et al. 2023, "Neural Networks and the Chomsky Hierarchy", arXiv
    2207.02098, a regular task): n bits, the answer ``1`` if an odd number of them are 1, else
    ``0``: ``"0110="`` -> ``"0"``. Size n = bits."""

    name, size_unit = "parity", "bits"
    prompt_format = "n bits 0/1, then '='"
    answer_format = "1 if the count of 1s is odd, else 0"
    source = "Deletang et al. 2023 (parity check)"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        bits = "".join(rng.choice("01") for _ in range(size))
        return Example(bits + "=", str(bits.count("1") % 2))


class ModularArithmetic(Task):
    """Modular arithmetic without brackets (Deletang et al. 2023, regular): n numbers in 0-4
    joined by n - 1 operators uniform in ``+ - *``, evaluated mod 5 with the usual precedence
    (``*`` before ``+`` and ``-``, left to right): ``"1+2*3="`` -> ``"2"``, ``"1-1-1="`` ->
    ``"4"``. Size n = numbers (Deletang et al. count the 2n - 1 symbols); the prompt is 2n bytes."""

    name, size_unit = "modular", "numbers"
    prompt_format = "n numbers 0-4 joined by n - 1 operators + - *, then '='"
    answer_format = "the value mod 5 (* before + and -)"
    source = "Deletang et al. 2023 (modular arithmetic)"
    MODULUS, OPERATORS = 5, "+-*"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        numbers = [rng.randrange(self.MODULUS) for _ in range(size)]
        operators = [rng.choice(self.OPERATORS) for _ in range(size - 1)]
        # sum of signed products: each + or - starts a new term, * extends the current one
        total, sign, term = 0, 1, numbers[0]
        for operator, number in zip(operators, numbers[1:]):
            if operator == "*":
                term *= number
            else:
                total, sign, term = total + sign * term, (1 if operator == "+" else -1), number
        total += sign * term
        text = str(numbers[0]) + "".join(op + str(x) for op, x in zip(operators, numbers[1:]))
        return Example(text + "=", str(total % self.MODULUS))


class CycleNavigation(Task):
    """Cycle navigation (Deletang et al. 2023, regular): n moves, each ``l`` (-1), ``s`` (stay)
    or ``r`` (+1), uniform, from position 0 on a cycle of 5; the answer is the final position:
    ``"rlsll="`` -> ``"3"`` (-2 mod 5). Size n = moves."""

    name, size_unit = "cycle", "moves"
    prompt_format = "n moves l (-1), s (0), r (+1) from 0 on a cycle of 5, then '='"
    answer_format = "the final position, 0-4"
    source = "Deletang et al. 2023 (cycle navigation)"
    CYCLE, STEP = 5, {"l": -1, "s": 0, "r": 1}

    def example(self, size, rng, depth=None):
        self._check_size(size)
        moves = "".join(rng.choice("lsr") for _ in range(size))
        return Example(moves + "=", str(sum(self.STEP[move] for move in moves) % self.CYCLE))


class BucketSort(Task):
    """Bucket sort (Deletang et al. 2023, context-sensitive): n symbols from a vocabulary of 5
    (the digits 0-4), the answer them sorted: ``"31402="`` -> ``"01234"``. Unlike ``sort`` (26
    letters) the few symbols repeat, so the answer is a count of each. Size n = symbols."""

    name, size_unit = "bucket_sort", "symbols"
    prompt_format = "n symbols 0-4, then '='"
    answer_format = "them sorted"
    source = "Deletang et al. 2023 (bucket sort)"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = "".join(rng.choice("01234") for _ in range(size))
        return Example(text + "=", "".join(sorted(text)))


class DuplicateString(Task):
    """Duplicate string (Deletang et al. 2023, context-sensitive): n symbols of a binary
    alphabet (``a``, ``b``, as in the paper), the answer them written twice: ``"abb="`` ->
    ``"abbabb"``. Size n = symbols of the input; the answer is 2n bytes."""

    name, size_unit = "duplicate", "symbols"
    prompt_format = "n symbols a/b, then '='"
    answer_format = "them twice (2n symbols)"
    source = "Deletang et al. 2023 (duplicate string)"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = "".join(rng.choice("ab") for _ in range(size))
        return Example(text + "=", text + text)


class MissingDuplicate(Task):
    """Missing duplicate (Deletang et al. 2023, context-sensitive): a binary string w of n
    symbols (``a``, ``b``) written twice, one of the 2n symbols, uniform, replaced by ``_``; the
    answer is the hidden symbol: ``"a_aaba="`` -> ``"b"`` (w = aba). Size n = symbols of w
    (Deletang et al. count the 2n); the prompt is 2n + 1 bytes."""

    name, size_unit = "missing", "symbols of w"
    prompt_format = "a string w of n symbols a/b written twice, one of the 2n replaced by '_', then '='"
    answer_format = "the hidden symbol"
    source = "Deletang et al. 2023 (missing duplicate)"

    def example(self, size, rng, depth=None):
        self._check_size(size)
        doubled = "".join(rng.choice("ab") for _ in range(size)) * 2
        hole = rng.randrange(2 * size)
        return Example(doubled[:hole] + "_" + doubled[hole + 1:] + "=", doubled[hole])


class MultiKeyNeedle(Task):
    """Multi-key needle in a haystack (RULER, Hsieh et al. 2024, arXiv 2404.06654, its
    ``niah_multikey``): passkey's filler of n bytes with :attr:`NEEDLES` needles ``key <2-letter
    key> <5 digits>.``, their keys distinct, then the question ``key <one of the keys>?``; the
    answer is that key's value: ``"... key ab 36937. ... key xq 11205. ... key xq? "`` ->
    ``"11205"``. The asked needle sits at byte ``round(depth * n)`` of the filler (``depth``
    uniform unless given, evaluation on :data:`DEPTHS`), the others at uniform bytes. RULER's
    needles are sentences with words or UUIDs as keys in a pretrained model's prompt; these are
    cut to fixed markers as passkey's are. Size n = filler bytes."""

    name, size_unit = "multikey", "filler bytes"
    prompt_format = "n bytes of filler, 4 needles 'key <2 letters> <5 digits>.' in it, then 'key <one key>?'"
    answer_format = "that key's 5-digit value"
    source = "RULER (Hsieh et al. 2024), niah_multikey"
    min_size = 0
    uses_depth = True
    NEEDLES, VALUE_DIGITS = 4, 5
    NEEDLE, QUESTION = " key {key} {value}. ", " key {key}? "

    def example(self, size, rng, depth=None):
        self._check_size(size)
        if depth is None:
            depth = rng.random()
        elif not 0 <= depth <= 1:
            raise InvalidArgument(f"depth must be in [0, 1], got {depth!r}")
        keys = _pairs_of_letters(self.NEEDLES, rng)
        values = ["".join(rng.choice(string.digits) for _ in range(self.VALUE_DIGITS)) for _ in keys]
        cuts = [round(depth * size), *(rng.randint(0, size) for _ in keys[1:])]  # the first key is asked
        needles = [(cut, self.NEEDLE.format(key=key, value=value)) for cut, key, value in zip(cuts, keys, values)]
        rng.shuffle(needles)  # at a shared cut, the asked needle is not always first
        prompt = _insert(_filler(size), needles) + self.QUESTION.format(key=keys[0])
        return Example(prompt, values[0], depth)


class VariableTracking(Task):
    """Variable tracking (RULER, Hsieh et al. 2024, its ``vt``): passkey's filler of n bytes
    with two chains of :attr:`HOPS` assignments, ``ab=36937.`` then ``cd=ab.``, ``ef=cd.``, ...
    (distinct two-letter names, each chain in order at uniform bytes, the chains interleaved),
    then the question ``=<one chain's value>?``; the answer is the names of that chain in
    assignment order: ``"... ab=36937. ... xq=50112. ... cd=ab. ... ef=xq. ... =36937? "`` ->
    ``"abcd"`` (with 2 hops). RULER asks for the variables in any order; ours are written in
    chain order, so exact match needs no set comparison. Size n = filler bytes."""

    name, size_unit = "vartrack", "filler bytes"
    prompt_format = "n bytes of filler, two chains of 4 assignments 'ab=<5 digits>.', 'cd=ab.', ..., then '=<a value>?'"
    answer_format = "the 4 names of that chain, in order"
    source = "RULER (Hsieh et al. 2024), variable tracking"
    min_size = 0
    HOPS, CHAINS, VALUE_DIGITS = 4, 2, 5
    QUESTION = " ={value}? "

    def example(self, size, rng, depth=None):
        self._check_size(size)
        names = _pairs_of_letters(self.HOPS * self.CHAINS, rng)
        values = rng.sample(range(10 ** (self.VALUE_DIGITS - 1), 10 ** self.VALUE_DIGITS), self.CHAINS)
        pieces = []
        for chain, value in enumerate(values):
            chain_names = names[chain * self.HOPS:(chain + 1) * self.HOPS]
            sources = [str(value), *chain_names[:-1]]
            cuts = sorted(rng.randint(0, size) for _ in chain_names)
            pieces += [(cut, f" {name}={source}. ") for cut, name, source in zip(cuts, chain_names, sources)]
        pieces.sort(key=lambda piece: piece[0])  # stable: a chain's own order survives ties
        asked = rng.randrange(self.CHAINS)
        prompt = _insert(_filler(size), pieces) + self.QUESTION.format(value=values[asked])
        return Example(prompt, "".join(names[asked * self.HOPS:(asked + 1) * self.HOPS]))


class Counting(Task):
    """Counting (after the CoPE paper's counting task, Golovneva et al. 2024, "Contextual
    Position Encoding: Learning to Count What's Important", arXiv 2405.18719): n symbols, each
    uniform in :attr:`SYMBOLS` (``a``-``d``), then ``?``, the queried symbol (uniform in the
    same four, so a count of 0 occurs) and ``=``; the answer is how many of the n symbols are
    the queried one, in decimal, zero-padded to :attr:`COUNT_DIGITS` digits:
    ``"abca?a="`` -> ``"002"``, ``"bbb?c="`` -> ``"000"``.

    The paper's own definition (its counting section) could not be read from this session's
    sources, so this is the simplest form of the task it names, counting the occurrences of a
    queried item, not necessarily the paper's exact format. The answer has a fixed width
    whatever n (every answer of every size is 3 digits) so that its format does not change
    with the size being tested, hence sizes up to 999. Size n = symbols counted over; the
    prompt is n + 3 bytes."""

    name, size_unit = "counting", "symbols"
    prompt_format = "n symbols a-d, then '?', one of a-d, then '='"
    answer_format = "how many of the n are that symbol, 3 digits zero-padded"
    source = "CoPE paper (Golovneva et al. 2024), counting (simplest form)"
    SYMBOLS, COUNT_DIGITS = "abcd", 3
    max_size = 10 ** COUNT_DIGITS - 1

    def example(self, size, rng, depth=None):
        self._check_size(size)
        text = "".join(rng.choice(self.SYMBOLS) for _ in range(size))
        asked = rng.choice(self.SYMBOLS)
        return Example(f"{text}?{asked}=", str(text.count(asked)).zfill(self.COUNT_DIGITS))


#: Passkey evaluation depths: instances of one size are spread evenly over these.
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

#: Every task by name, in table order.
TASKS: dict[str, Task] = {task.name: task for task in (
    Copy(), Reverse(), Sort(), Addition(), FlipFlop(), SelectiveCopy(), Passkey(),
    MQAR(), Parity(), ModularArithmetic(), CycleNavigation(), BucketSort(), DuplicateString(), MissingDuplicate(),
    MultiKeyNeedle(), VariableTracking(), Counting(),
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
    seed) alone, so every encoding is scored on the same instances. For a task that reads a
    depth (passkey, multikey), the i-th instance sits at depth ``DEPTHS[i % len(DEPTHS)]``."""
    rng = random.Random(f"eval/{task.name}/{size}/{seed}")
    if task.uses_depth:
        return [task.example(size, rng, DEPTHS[i % len(DEPTHS)]) for i in range(count)]
    return [task.example(size, rng) for _ in range(count)]


def exact_match(generated: str, example: Example) -> bool:
    """Whether ``generated`` (the continuation of the prompt) is the whole answer: its text up
    to and including the first :data:`END` must equal ``answer + END``. A prefix of the answer,
    an answer with extra bytes, or one without the end marker is wrong."""
    cut = generated.find(END)
    return cut >= 0 and generated[: cut + 1] == example.target


__all__ = [
    "DEPTHS", "END", "LETTERS", "MQAR", "TASKS", "Addition", "BucketSort", "Copy", "Counting", "CycleNavigation",
    "DuplicateString", "Example", "FlipFlop", "MissingDuplicate", "ModularArithmetic", "MultiKeyNeedle", "Parity",
    "Passkey", "Reverse", "SelectiveCopy", "Sort", "Task", "VariableTracking", "eval_examples", "exact_match", "get_task",
]
