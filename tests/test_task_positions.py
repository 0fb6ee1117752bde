"""The position ids of `posenc lengthgen`'s +coupled, +abacus and +rand rows
(posenc.lab.experiments.task_positions): each scheme against hand-worked instances, the range
of its training offsets, its refusal where a task has no alignment, the rows' parsing, the
batches and the decoding that carry the ids, and a tiny end-to-end run."""

from __future__ import annotations

import json
import random

import pytest
import torch

from posenc.errors import InvalidArgument
from posenc.lab.cli import main
from posenc.lab.experiments.extrapolation import ExtrapolationConfig
from posenc.lab.experiments.frame import Row
from posenc.lab.experiments.lengthgen import LengthgenConfig, fingerprint, task_batches
from posenc.lab.experiments.task_positions import (
    AbacusPositions,
    CoupledPositions,
    RandomizedPositions,
    greedy_decode,
)
from posenc.lab.experiments.tasks import END, Example, get_task
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import TrainConfig, train_lm

# 472 + 915 = 1387, every number least significant digit first, as the addition task writes it
ADDITION = Example("274+519=", "7831")
COPY = Example("qhxa=", "qhxa")
REVERSE = Example("qhxa=", "axhq")


def tokens_of(example):
    return list(example.prompt + example.target)


def test_addition_ids_by_hand():
    assert tokens_of(ADDITION) == ["2", "7", "4", "+", "5", "1", "9", "=", "7", "8", "3", "1", END]
    # coupled: units (2, 5, 7) share id 1, tens (7, 1, 8) id 2, hundreds (4, 9, 3) id 3, the
    # carry out 4; "+" and "=" sit one below the units (0), END past the answer (5)
    coupled = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    assert CoupledPositions(range=30).test_ids("addition", ADDITION, random.Random(0)) == coupled
    # abacus: each digit's 1-based index in its number from the least significant digit;
    # "+", "=" and END are not digits: 0
    abacus = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0]
    assert AbacusPositions().test_ids("addition", ADDITION, random.Random(0)) == abacus


def test_copy_and_reverse_ids_by_hand():
    # copy "qhxa=" -> "qhxa.": answer letter i shares the id of source letter i
    assert CoupledPositions(range=30).test_ids("copy", COPY, None) == [1, 2, 3, 4, 0, 1, 2, 3, 4, 5]
    assert AbacusPositions().test_ids("copy", COPY, None) == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    # reverse "qhxa=" -> "axhq.": answer "a" copies source "a" (id 4), ...; "=" sits past the
    # last source letter, where the answer starts (5); END past the answer's end (0)
    assert CoupledPositions(range=30).test_ids("reverse", REVERSE, None) == [1, 2, 3, 4, 5, 4, 3, 2, 1, 0]
    assert AbacusPositions().test_ids("reverse", REVERSE, None) == [1, 2, 3, 4, 0, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("name", ["addition", "copy", "reverse"])
def test_aligned_tokens_share_an_id_on_every_instance(name):
    """Property: the digit or letter an answer token is (or copies) has the answer token's id."""
    task, rng = get_task(name), random.Random(1)
    for size in (1, 2, 7, 20):
        example = task.example(size, rng)
        text, ids = tokens_of(example), CoupledPositions(range=200).test_ids(name, example, rng)
        prompt = len(example.prompt)
        for i, answer_id in enumerate(ids[prompt : prompt + len(example.answer)]):
            if name == "addition":
                source = [j for j in range(size) if ids[j] == answer_id]  # operand a's digit of equal significance
                assert source == ([i] if i < size else [])
                if i < size:
                    assert ids[size + 1 + i] == answer_id  # operand b's digit
            else:
                source = i if name == "copy" else size - 1 - i
                assert ids[source] == answer_id and text[source] == example.answer[i]


def test_coupled_training_offset_keeps_every_id_below_the_range():
    scheme, rng = CoupledPositions(range=20), random.Random(0)
    base = scheme.test_ids("addition", ADDITION, rng)
    offsets = set()
    for _ in range(3000):
        ids = scheme.train_ids("addition", ADDITION, rng)
        shift = {a - b for a, b in zip(ids, base)}
        assert len(shift) == 1  # one offset for every token, separators included
        offsets |= shift
        assert min(ids) >= 0 and max(ids) <= 19
    # the largest id at offset 0 is 5 (END): offsets 0 .. 20 - 1 - 5 = 14, each drawn
    assert offsets == set(range(15))
    with pytest.raises(InvalidArgument, match="range 5 holds no offset"):
        CoupledPositions(range=5).train_ids("addition", ADDITION, rng)


def test_abacus_training_offset_is_uniform_in_0_to_99_on_digits_only():
    scheme, rng = AbacusPositions(), random.Random(0)
    offsets = set()
    for _ in range(5000):
        ids = scheme.train_ids("addition", ADDITION, rng)
        assert ids[3] == ids[7] == ids[12] == 0  # "+", "=", END
        k = ids[0] - 1
        assert ids == [k + 1, k + 2, k + 3, 0, k + 1, k + 2, k + 3, 0, k + 1, k + 2, k + 3, k + 4, 0]
        offsets.add(k)
    assert offsets == set(range(100))


def test_randomized_test_ids_are_sorted_distinct_and_in_range():
    scheme = RandomizedPositions(range=50)
    first = scheme.test_ids("copy", COPY, random.Random("a"))
    assert first == scheme.test_ids("copy", COPY, random.Random("a"))  # a pure function of the generator
    assert len(first) == 10 and first == sorted(set(first)) and 0 <= first[0] and first[-1] < 50
    draws = [scheme.test_ids("copy", COPY, random.Random(seed)) for seed in range(300)]
    assert len({tuple(d) for d in draws}) == 300  # sampled, not a fixed pattern
    assert max(d[-1] for d in draws) > 45 and min(d[0] for d in draws) == 0  # the whole range is used
    with pytest.raises(InvalidArgument, match="10 tokens do not fit"):
        RandomizedPositions(range=9).test_ids("copy", COPY, random.Random(0))


def test_rows_parse_every_suffix_and_refuse_two():
    assert Row.parse("rope+coupled") == Row("rope", task_positions="coupled")
    assert Row.parse("learned+abacus").positions == "abacus" and Row.parse("learned+abacus").name == "learned+abacus"
    assert Row.parse("rope+rand").positions == "rand" and Row.parse("rope").positions is None
    with pytest.raises(InvalidArgument, match="one position suffix per row"):
        Row.parse("rope+coupled+rand")


@pytest.mark.parametrize("task, row", [("flipflop", "rope+coupled"), ("passkey", "alibi+abacus"),
                                       ("sort", "rope+coupled"), ("selective_copy", "learned+abacus")])
def test_task_positions_are_refused_where_the_task_has_no_alignment(task, row):
    with pytest.raises(InvalidArgument) as caught:
        LengthgenConfig(tasks=("addition", task), encodings=("rope", row))
    message = str(caught.value)
    suffix = row.split("+")[1]
    assert f"+{suffix} positions have no meaning for the task {task!r}" in message and repr(row) in message
    assert "defined for addition, copy, reverse" in message


def test_other_refusals():
    with pytest.raises(InvalidArgument, match="only posenc lengthgen has such rows"):
        ExtrapolationConfig(encodings=("rope+coupled",))
    with pytest.raises(InvalidArgument, match="a plan row takes no position suffix"):
        LengthgenConfig(tasks=("copy",), encodings=("rope/nope:3+coupled",))


def test_config_sizes_the_tables_and_ranges_by_hand():
    config = LengthgenConfig(tasks=("addition",), encodings=("rope", "rope+coupled", "learned+abacus"))
    # N = 3, evaluation up to 12 digits: the largest coupled id at offset 0 is 1 + 13 = 14, R = 2 x 15
    assert config.coupled_range("addition") == 30
    assert config.position_scheme("addition", "rope+coupled") == CoupledPositions(30)
    assert config.model_config("addition", "rope+coupled").max_positions == 40  # the 12-digit sequence: 40 tokens > 30
    # abacus trains up to k = 99 on a 3-digit instance: 99 + 1 + 3 (the carry digit) = 103
    assert config.model_config("addition", "learned+abacus").max_positions == 104
    assert config.model_config("addition", "rope").max_positions == 40 and config.position_scheme("addition", "rope") is None
    # a named +rand row: L_max = 4 x the longest evaluation sequence (copy at 32 letters: 66 tokens)
    named = LengthgenConfig(tasks=("copy",), encodings=("rope", "rope+rand"))
    assert named.randomized_positions == 264 and named.rows == ["rope", "rope+rand"]
    assert named.row_run("copy", "rope+rand", 0)[1].randomized_positions == 264
    # the option still adds a +rand row per encoding, not to rows that have a suffix
    option = LengthgenConfig(tasks=("copy",), encodings=("rope", "rope+coupled"), randomized_positions=100)
    assert option.rows == ["rope", "rope+coupled", "rope+rand"]


def test_plain_rows_fingerprints_do_not_depend_on_scheme_rows():
    alone = LengthgenConfig(tasks=("copy",), encodings=("rope",))
    beside = LengthgenConfig(tasks=("copy",), encodings=("rope", "rope+coupled", "rope+abacus"))
    assert fingerprint(alone, "copy", "rope", 0) == fingerprint(beside, "copy", "rope", 0)
    assert "positions" not in fingerprint(beside, "copy", "rope", 0)
    # copy at N = 8, evaluated up to 32 letters: END of a 32-letter answer has id 1 + 32, R = 2 x 34
    assert fingerprint(beside, "copy", "rope+coupled", 0)["positions"] == {"scheme": "coupled", "range": 68,
                                                                          "test_offset": 0}


def test_training_batches_carry_the_coupled_ids():
    task = get_task("addition")
    inputs, _, positions = task_batches(task, 4, CoupledPositions(40))(64, torch.Generator().manual_seed(0))
    assert positions.shape == inputs.shape and positions.dtype == torch.long
    for row in range(64):
        text = bytes(inputs[row].tolist()).decode()
        n = text.index("+")
        ids = positions[row].tolist()
        offset = ids[n]  # "+" sits one below the units
        assert ids[:n] == [offset + 1 + i for i in range(n)] == ids[n + 1 : 2 * n + 1]
        assert ids[2 * n + 1] == offset and ids[2 * n + 2 : 3 * n + 3] == [offset + 1 + i for i in range(n + 1)]
        assert 0 <= offset and max(ids) < 40
    # plain rows and +rand rows get (inputs, targets): the training loop draws +rand's ids
    assert len(task_batches(task, 4)(2, torch.Generator().manual_seed(0))) == 2
    assert len(task_batches(task, 4, RandomizedPositions(64))(2, torch.Generator().manual_seed(0))) == 2


class Recorder(TransformerLM):
    seen: list

    def forward(self, tokens, positions=None, **kwargs):
        self.seen.append(positions)
        return super().forward(tokens, positions, **kwargs)


def test_train_lm_feeds_the_batches_positions():
    model = Recorder(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=64), "learned")
    model.seen = []
    batches = task_batches(get_task("copy"), 3, CoupledPositions(30))
    train_lm(model, batches, TrainConfig(steps=2, batch_size=4, seq_len=8))
    assert len(model.seen) == 2 and all(p is not None and p.shape[0] == 4 for p in model.seen)
    expected = batches(4, torch.Generator().manual_seed(0))[2]  # the loop's first draw from seed 0
    assert torch.equal(model.seen[0], expected)
    with pytest.raises(InvalidArgument, match="carry their own positions"):
        train_lm(model, batches, TrainConfig(steps=1, batch_size=4, seq_len=8, randomized_positions=30))


class NoCache(TransformerLM):
    @property
    def call_invariant(self):
        return False


@pytest.mark.parametrize("encoding", ["rope", "learned", "alibi"])
def test_greedy_decode_at_ordinary_positions_is_generate(encoding):
    torch.manual_seed(0)
    config = LMConfig(d_model=32, num_layers=2, num_heads=4, max_positions=64)
    model = TransformerLM(config, encoding).eval()
    tokens = torch.randint(0, 256, (3, 7))
    reference = model.generate(tokens, 9)[:, 7:]
    ordinary = torch.arange(16).expand(3, -1)
    assert torch.equal(greedy_decode(model, tokens, ordinary, 9), reference)
    rerun = NoCache(config, encoding).eval()
    rerun.load_state_dict(model.state_dict())
    assert torch.equal(greedy_decode(rerun, tokens, ordinary, 9), reference)
    # at other positions too, the cached decode is the re-run one
    shifted = ordinary * 3 + 1
    assert torch.equal(greedy_decode(rerun, tokens, shifted, 9), greedy_decode(model, tokens, shifted, 9))


def test_tiny_lengthgen_run_with_every_suffix(tmp_path, capsys):
    out = tmp_path / "out"
    tiny = ["--steps", "2", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
            "--eval-instances", "3", "--train-size", "4", "--threads", "1", "--workers", "1"]
    args = ["lengthgen", "--tasks", "addition,reverse", "--encodings", "rope+coupled,learned+abacus,nope+rand,alibi",
            *tiny, "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((out / "results.json").read_text())
    for task in ("addition", "reverse"):
        rows = summary["results"][task]
        assert list(rows) == ["rope+coupled", "learned+abacus", "nope+rand", "alibi"]
        assert rows["rope+coupled"]["positions"]["scheme"] == "coupled"
        assert rows["learned+abacus"]["positions"] == {"scheme": "abacus", "max_offset": 100, "test_offset": 0}
        assert rows["nope+rand"]["positions"]["range"] == summary["config"]["randomized_positions"]
        assert "positions" not in rows["alibi"]
        assert all(len(res["eval"]) == 6 for res in rows.values())
    # an explicit range too short for the longer sizes: those are not applicable to +rand rows
    capsys.readouterr()
    code = main(["lengthgen", "--tasks", "copy", "--encodings", "rope", "--randomized-positions", "20", *tiny,
                 "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    rand = json.loads((tmp_path / "r" / "results.json").read_text())["results"]["copy"]["rope+rand"]
    # copy at N = 4: sizes 2, 4, 6, 8 have 6, 10, 14, 18 tokens; 12 and 16 have 26 and 34 > 20
    assert list(rand["eval"]) == ["2", "4", "6", "8"] and set(rand["not_applicable"]) == {"12", "16"}


def test_bad_suffix_rows_exit_2_in_one_line(capsys):
    code = main(["lengthgen", "--tasks", "flipflop", "--encodings", "rope+coupled"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'flipflop'" in err and "+coupled" in err
