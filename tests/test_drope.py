"""DroPE rows (issue 26, item 4): the QK-norm against the reference's RMSNorm written out in
float64, the dropped model keeps the trained weights and attends without rotation, and a tiny
sweep's rope+drope, rope+drope+qknorm and nope+long rows: trained the steps the recipe says,
evaluated as NoPE, resumed from the store, refused with other arguments."""

from __future__ import annotations

import math
import random

import pytest
import torch

from posenc.encodings.nope import NoPE
from posenc.errors import InvalidArgument
from posenc.lab.checkpoint import CheckpointMismatch
from posenc.lab.data import load_corpus
from posenc.lab.evaluate import evaluate_length
from posenc.lab.experiments.drope import DroPELM, QKNormNoPE, dropped_model
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, load_trained_base, run_extrapolation
from posenc.lab.experiments.runs import RunStore
from posenc.lab.model import LMConfig, TransformerLM

WORDS = "the of and to in is was for on that with as by at from it an be this which or are have".split()


# -- the QK-norm ---------------------------------------------------------------------------
def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference's order: (B, H, T, D) back to the projection's (B, T, H * D), RMSNorm there
    (torch.nn.RMSNorm's formula, float64), split into heads again."""
    b, h, t, d = x.shape
    flat = x.double().transpose(1, 2).reshape(b, t, h * d)
    normed = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + eps) * weight.double().reshape(h * d)
    return normed.reshape(b, t, h, d).transpose(1, 2)


def test_qk_norm_is_rmsnorm_over_every_head_of_a_token():
    torch.manual_seed(0)
    norm = QKNormNoPE(num_heads=4, num_kv_heads=2, head_dim=8)
    with torch.no_grad():
        norm.q_weight.uniform_(0.5, 1.5)
        norm.k_weight.uniform_(0.5, 1.5)
    q, k = torch.randn(2, 4, 5, 8) * 3, torch.randn(2, 2, 7, 8)
    positions = torch.arange(7)
    nq, nk = norm.rotate(q, k, positions[:5], positions)
    assert nq.dtype == q.dtype and nq.shape == q.shape and nk.shape == k.shape
    torch.testing.assert_close(nq.double(), reference_rms_norm(q, norm.q_weight, 1e-5), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(nk.double(), reference_rms_norm(k, norm.k_weight, 1e-5), rtol=1e-6, atol=1e-6)
    # position-free: the same token at another position is normalized the same
    again, _ = norm.rotate(q, k, positions[:5] + 100, positions)
    assert torch.equal(again, nq)
    with pytest.raises(InvalidArgument, match=r"q: expected \(B, 4, T, 8\)"):
        norm.rotate(torch.randn(1, 3, 5, 8), k, positions[:5], positions)


def test_qk_norm_has_its_own_weights_per_layer_in_the_model():
    config = LMConfig(d_model=16, num_layers=3, num_heads=2)
    model = DroPELM(config, QKNormNoPE(2, None, 8, num_layers=3))
    layers = [model.encoding.for_layer(i) for i in range(3)]
    assert len({id(layer.q_weight) for layer in layers}) == 3
    names = {name for name, _ in model.named_parameters() if name.startswith("encoding.")}
    assert len(names) == 6  # q and k weights of 3 layers: trained with the model
    assert model.encoding_spec() is None  # not a registered encoding: its checkpoints only resume


def test_dropped_model_keeps_weights_and_drops_the_rotation():
    torch.manual_seed(0)
    config = LMConfig(d_model=16, num_layers=2, num_heads=2, max_positions=64)
    trained = TransformerLM(config, "rope").eval()
    dropped = dropped_model(trained, NoPE()).eval()
    for name, value in trained.state_dict().items():
        if not name.startswith("encoding."):
            assert torch.equal(dropped.state_dict()[name], value)
    x = torch.randint(0, 256, (2, 12))
    nope = TransformerLM(config, "nope").eval()
    nope.load_state_dict({k: v for k, v in trained.state_dict().items() if not k.startswith("encoding.")})
    torch.testing.assert_close(dropped(x), nope(x), rtol=0, atol=0)
    assert not torch.allclose(dropped(x), trained(x))  # RoPE's rotation is gone


# -- the rows ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = random.Random(0)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(800))
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(text)
    return path


def tiny_config(**changes):
    values = dict(encodings=("rope",), train_len=8, eval_factors=(1, 2), steps=6, batch_size=4, lr=3e-3, d_model=16,
                  num_layers=2, num_heads=2, eval_tokens=256, drope_steps=3, drope_qk_norm=True)
    values.update(changes)
    return ExtrapolationConfig.from_options(**values)


@pytest.fixture(scope="module")
def sweep(corpus_file, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("drope")
    config, corpus = tiny_config(), load_corpus(corpus_file)
    return config, corpus, out, run_extrapolation(config, corpus, out)


def _checkpoint(out, row):
    return torch.load(out / "checkpoints" / f"{row}-seed0.pt", weights_only=False)


def test_rows_and_their_training(sweep):
    config, _, out, summary = sweep
    assert list(summary["results"]) == ["rope", "rope+drope", "rope+drope+qknorm", "nope+long"]
    for row in ("rope+drope", "rope+drope+qknorm", "nope+long"):
        for cell in summary["results"][row]["eval"].values():
            assert math.isfinite(cell["loss"]) and 0 < cell["loss"] < 10
    # the recalibrations ran drope_steps, at L, at train.lr / 3; the control steps + drope_steps from scratch
    for row in ("rope+drope", "rope+drope+qknorm"):
        assert _checkpoint(out, row)["step"] == 3
        finetune = summary["results"][row]["extension"]["finetune"]
        assert finetune["seq_len"] == 8 and finetune["lr"] == pytest.approx(3e-3 / 3)
    assert _checkpoint(out, "nope+long")["step"] == 6 + 3
    assert summary["results"]["rope+drope+qknorm"]["extension"]["qk_norm"] is True


def test_drope_row_is_the_recalibrated_weights_without_rotation(sweep):
    """The stored rope+drope cell at L, recomputed: its checkpoint's weights in a NoPE model."""
    config, corpus, out, summary = sweep
    weights = _checkpoint(out, "rope+drope")["model"]
    model = TransformerLM(config.model_config(), "nope")
    model.load_state_dict(weights)
    result = evaluate_length(model.eval(), corpus.val, 16, 8, max_tokens=config.eval_tokens)
    assert result.loss == pytest.approx(summary["results"]["rope+drope"]["eval"]["16"]["loss"], rel=1e-9)
    # the weights moved away from the trained rope model's
    trained = load_trained_base(config, corpus, RunStore(out), "rope", 0)
    assert not torch.equal(weights["blocks.0.attn.qkv.weight"], trained.state_dict()["blocks.0.attn.qkv.weight"])


def test_rerun_reuses_the_rows_and_refuses_other_arguments(sweep):
    config, corpus, out, summary = sweep
    assert run_extrapolation(config, corpus, out)["results"] == summary["results"]
    with pytest.raises(CheckpointMismatch, match=r"rope\+drope-seed0"):
        run_extrapolation(tiny_config(drope_steps=4), corpus, out)


@pytest.mark.parametrize("changes, message", [
    (dict(encodings=("alibi",)), "add rope to encodings"),
    (dict(drope_steps=-1), "drope_steps must be an integer >= 0"),
    (dict(drope_steps=0, drope_qk_norm=True), "set drope_steps > 0"),
    (dict(drope_lr=0.0), "drope_lr must be a finite number > 0"),
])
def test_bad_drope_arguments(changes, message):
    with pytest.raises(InvalidArgument, match=message):
        tiny_config(**changes)
