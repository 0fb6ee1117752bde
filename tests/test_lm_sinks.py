"""gpt-oss's learned attention sinks in the lab's LM (issue 37, item 4): a plan part spelled
``ENCODING[@SPAN]+sinks`` gets a logit per head in its softmax's denominator
(:func:`posenc.attention`'s ``sinks=``, checked against transformers' gpt-oss in
tests/test_softcap_sinks.py); here the row's spelling, the model's sink parameters, what the
sinks do at their limits, training, the checkpoint and the CLI rows."""

from __future__ import annotations

import json

import torch

from posenc.lab.cli import main
from posenc.lab.experiments.frame import Row
from posenc.lab.experiments.lengthgen_config import LengthgenConfig
from posenc.lab.model import LMConfig, TransformerLM

CONFIG = LMConfig(d_model=32, num_layers=2, num_heads=4, max_positions=64)


def test_the_rows_spell_sinks_per_part():
    row = Row.parse("rope+sinks")
    assert row.plan is not None and row.plan.base.sinks and row.plan.base.encoding == "rope"
    plan = Row.parse("rope@sliding+sinks/rope+sinks:2").plan.build(CONFIG.encoding_sizes(), 16)
    assert [(layer.span, layer.sinks) for layer in plan] == [("sliding", True), ("full", True)]
    plan = Row.parse("rope/nope+sinks:2").plan.build(CONFIG.encoding_sizes(), 16)
    assert [(layer.encoding is None, layer.sinks) for layer in plan] == [(False, False), (True, True)]
    assert Row.parse("rope+sinks+rand").randomized  # a position suffix after the plan
    # lengthgen reads rope+<method> as an extension row, and rope+sinks as a plan
    config = LengthgenConfig(tasks=("copy",), encodings=("rope", "rope+yarn", "rope+sinks"))
    assert [r.extension for r in config.encodings] == [None, "yarn", None]


def _pair(sink: float):
    """A model with sinks on both layers set to ``sink``, and the same weights without sinks."""
    torch.manual_seed(0)
    with_sinks = TransformerLM(CONFIG, Row.parse("rope+sinks").plan.build(CONFIG.encoding_sizes(), 16))
    without = TransformerLM(CONFIG, Row.parse("rope@full").plan.build(CONFIG.encoding_sizes(), 16))
    without.load_state_dict({k: v for k, v in with_sinks.state_dict().items() if not k.endswith("attn.sinks")})
    with torch.no_grad():
        for block in with_sinks.blocks:
            block.attn.sinks.fill_(sink)
    return with_sinks, without


def test_sinks_at_their_limits():
    """A sink of -30 takes no probability: the model without sinks. A sink of +30 takes it all:
    the attention adds nothing, as with its output projection zeroed."""
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    low, plain = _pair(-30.0)
    assert [b.attn.sinks is not None for b in low.blocks] == [True, True]
    assert (low(tokens) - plain(tokens)).abs().max() < 1e-5
    high, plain = _pair(30.0)
    with torch.no_grad():
        for block in plain.blocks:
            block.attn.proj.weight.zero_()
    assert (high(tokens) - plain(tokens)).abs().max() < 1e-5
    middle, plain = _pair(0.0)  # and in between they matter
    assert (middle(tokens) - plain(tokens)).abs().max() > 1e-3


def test_sinks_train_and_survive_the_checkpoint(tmp_path):
    model, _ = _pair(0.0)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    assert all(block.attn.sinks.grad.abs().max() > 0 for block in model.blocks)
    with torch.no_grad():
        model.blocks[0].attn.sinks.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    model.save(tmp_path / "m.pt")
    again = TransformerLM.from_checkpoint(tmp_path / "m.pt")
    assert torch.equal(again.blocks[0].attn.sinks, model.blocks[0].attn.sinks)
    assert torch.equal(again(tokens), model(tokens))


def test_extrapolate_runs_a_row_with_sinks(tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"line {i}: x{i % 7} = {i * 5 % 89}\n" for i in range(300)))
    code = main(["extrapolate", "--encodings", "rope,rope+sinks", "--seeds", "0", "--d-model", "16", "--layers", "1",
                 "--heads", "2", "--batch-size", "4", "--train-len", "16", "--steps", "3", "--eval-factors", "1,2",
                 "--eval-tokens", "64", "--corpus", str(corpus), "--out", str(tmp_path / "x")])
    assert code == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "x" / "results.json").read_text())["results"]
    assert list(results) == ["rope", "rope+sinks"] and results["rope+sinks"]["eval"]
    assert results["rope+sinks"]["parameters"] == results["rope"]["parameters"] + 2  # a sink per head
