"""A row is parsed once, where it enters (a config built from the command line, a preset or a
results file), and travels as a :class:`Row`: the config's rows are Row objects equal to their
spellings, so every stored form (fingerprints, records, results.json) is the spelling itself;
nothing further in parses a row again; one parser reads every spelling, ``rope+<method>``
included."""

from __future__ import annotations

import copy
import io
import json
import pickle

import pytest
import torch

from posenc.errors import InvalidArgument
from posenc.lab.data import Corpus
from posenc.lab.experiments import frame
from posenc.lab.experiments.extrapolation import ExtrapolationConfig
from posenc.lab.experiments.extrapolation import (
    fingerprint as extrapolation_fingerprint,
)
from posenc.lab.experiments.frame import Row
from posenc.lab.experiments.lengthgen import (
    LengthgenConfig,
    extension_fingerprint,
    fingerprint,
)
from posenc.lab.experiments.lengthgen_extension import (
    EXTENSIONS,
    METHODS,
    extension_method,
)

CORPUS = Corpus(torch.zeros(0), torch.zeros(0),
                {"name": "test", "bytes": 0, "train_bytes": 0, "val_bytes": 0})


def lengthgen_config() -> LengthgenConfig:
    return LengthgenConfig(encodings=("rope", "rope+yarn", "rope+self_extend", "alibi+rand", "rope/nope:3"),
                           tasks=("copy", "addition"), task_rows=("addition=rope+coupled",), randomized_positions=None)


@pytest.mark.parametrize("spelling, parts", [
    ("rope", ("rope", False, None, None)),
    ("rope+rand", ("rope", True, None, None)),
    ("learned+abacus", ("learned", False, "abacus", None)),
    ("rope+yarn", ("rope", False, None, "yarn")),
    ("rope+self_extend", ("rope", False, None, "self_extend")),
    ("rope/nope:4+rand", ("rope/nope:4", True, None, None)),
])
def test_one_parser_reads_every_spelling_and_the_row_is_its_spelling(spelling, parts):
    row = Row.parse(spelling, extensions=EXTENSIONS)
    assert (row.encoding, row.randomized, row.task_positions, row.extension) == parts
    assert row == spelling and row.name == spelling and type(row.name) is str and type(row.encoding) is str
    assert hash(row) == hash(spelling) and {spelling: 1}[row] == 1 and repr(row) == repr(spelling)
    assert (row.plan is not None) == ("/" in spelling)
    for copied in (pickle.loads(pickle.dumps(row)), copy.deepcopy(row)):
        assert type(copied) is Row and copied == row and copied.extension == row.extension and copied.plan == row.plan
    assert json.dumps({row: [row]}) == json.dumps({spelling: [spelling]})
    with pytest.raises(AttributeError):
        row.randomized = not row.randomized


def test_the_parser_reads_extension_rows_only_where_the_experiment_has_them():
    assert Row.parse("rope+yarn").extension is None  # extrapolate names no such row
    assert Row.parse("rope+yarn", extensions=EXTENSIONS) == Row("rope", extension="yarn")
    assert Row.parse("alibi+yarn", extensions=EXTENSIONS).extension is None  # only rope is extended
    with pytest.raises(InvalidArgument, match=r"row 'rope\+yaml': rope\+<method> .* method must be one of"):
        Row.parse("rope+yaml", extensions=EXTENSIONS)
    assert [extension_method(r) for r in ("rope+yarn", "rope+rand", "rope+yaml")] == ["yarn", None, None]
    assert {Row.parse(f"rope+{m}", extensions=EXTENSIONS).extension for m in METHODS} == set(METHODS)


def test_a_config_holds_parsed_rows_and_nothing_further_in_parses_one_again(monkeypatch):
    config = lengthgen_config()
    assert all(type(row) is Row for row in config.encodings) and config.encodings[1].extension == "yarn"
    assert [type(row) for _, row in config.jobs()] == [Row] * len(config.jobs())
    assert config.task_row_pairs() == [("addition", "rope+coupled")]
    assert config.task_row_pairs()[0][1].task_positions == "coupled"
    extrapolation = ExtrapolationConfig.from_options(encodings=("rope/nope:4", "alibi"), train_len=8, eval_factors=(1,),
                                        randomized_positions=16)
    assert [type(row) for row in extrapolation.rows] == [Row] * 4

    def no_parse(*args, **kwargs):
        raise AssertionError(f"a row parsed again inward: Row.parse{args}")

    monkeypatch.setattr(frame.Row, "parse", classmethod(no_parse))
    for task, row in config.jobs():
        if config.derived_row(row):
            extension_fingerprint(config, task, row, 0)
        else:
            fingerprint(config, task, row, 0)
            config.row_model(row, config.model_config(task, row), config.train_sequence_length(task))
    assert config.holds_a_table() is False and config.workloads()
    for row in extrapolation.rows:
        extrapolation_fingerprint(extrapolation, CORPUS, row, 0)
        extrapolation.encoding(row)
    assert extrapolation.holds_a_table() is False


def test_fingerprints_and_results_hold_plain_spellings_a_checkpoint_can_load():
    """A checkpoint holds its run's fingerprint and is read with weights_only=True, which
    refuses any class but plain data: rows enter fingerprints as plain str."""
    config = lengthgen_config()
    prints = [fingerprint(config, "addition", "rope+coupled", 0), extension_fingerprint(config, "copy", "rope+yarn", 0),
              extrapolation_fingerprint(ExtrapolationConfig.from_options(encodings=("alibi",), train_len=8, eval_factors=(1,)),
                                        CORPUS, "alibi", 0)]
    buffer = io.BytesIO()
    torch.save(prints, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == prints
    assert frame.plain_strings({Row("rope", randomized=True): (Row("t5"),)}) == {"rope+rand": ("t5",)}
    assert type(next(iter(frame.plain_strings({Row("t5"): 1})))) is str
    assert json.loads(json.dumps(config.to_dict()))["encodings"] == [
        "rope", "rope+yarn", "rope+self_extend", "alibi+rand", "rope/nope:3"]  # results.json's config: the spellings
    # why: a Row itself would not load back from a checkpoint
    buffer = io.BytesIO()
    torch.save({"row": Row("t5")}, buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buffer, weights_only=True)
