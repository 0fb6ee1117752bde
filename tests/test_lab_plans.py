"""Position plans in the lab (issue 21, item 6): the LM with one encoding and one span per layer,
the plan rows of ``posenc extrapolate`` / ``posenc lengthgen`` and plan checkpoints.

- a plan model's forward equals an independent float64 reference of the same layers (RoPE
  half-split, ALiBi's slopes, NoPE; sliding and chunked spans on positions), and a uniform
  plan equals the model of one encoding;
- a KV cache (token by token), a left-padded batch and a mask_mod give what the full pass gives;
- the row spelling parses, builds SmolLM3's and Cohere2's plans and refuses bad forms; plan
  rows' fingerprints are pinned;
- a plan checkpoint (``save`` and a training checkpoint) round-trips, shared encodings shared.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.errors import InvalidArgument
from posenc.hf_config.plan import LayerPlan, PositionPlan
from posenc.lab.data import Corpus
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, fingerprint as extrapolation_fingerprint
from posenc.lab.experiments.frame import PlanSpelling, Row, default_window
from posenc.lab.experiments.lengthgen import LengthgenConfig
from posenc.lab.experiments.runs import RunStore, file_stem
from posenc.lab.model import KVCache, LMConfig, TransformerLM, key_padding_mask, positions_from_padding_mask
from posenc.masks import key_padding_mask_mod

CONFIG = LMConfig(vocab_size=64, d_model=32, num_layers=4, num_heads=4, max_positions=128)
SIZES = CONFIG.encoding_sizes()
TOL = dict(atol=1e-5, rtol=1e-5)


def build(name: str, **kwargs):
    return posenc.create_for_model(name, **SIZES, **kwargs)


def sharpen(model: TransformerLM, seed: int = 0) -> TransformerLM:
    """Weights large enough that attention is sharp and a wrong position or span shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.normal_(0, 0.3)
            block.attn.proj.weight.normal_(0, 0.2)
        for encoding in (model.plan_encodings if model.plan is not None else [model.encoding]):
            for p in encoding.parameters():
                p.normal_(0, 0.5)  # learned biases (T5's table) start near zero
    return model.eval()


def mixed_plan() -> PositionPlan:
    """RoPE in a sliding window of 3, ALiBi in chunks of 4, NoPE with full attention, RoPE full."""
    rope, alibi = build("rope"), build("alibi")
    return PositionPlan((LayerPlan(rope, "sliding", 3), LayerPlan(alibi, "chunked", 4), LayerPlan(None),
                         LayerPlan(rope)))


# -- the forward against an independent float64 reference --------------------------------

def reference_logits(model: TransformerLM, tokens: torch.Tensor, positions: torch.Tensor, kinds, spans,
                     use_spans: bool = True) -> torch.Tensor:
    """The model's forward written out in float64 from its weights: pre-LN blocks, RoPE
    half-split (Su et al.; transformers' rotate_half) with base 10000, ALiBi with the slopes
    2^(-8 (h + 1) / H) (Press et al. 2022) added after the 1/sqrt(D) scale, causal mask and
    each layer's span on ``positions``: sliding W (p - p' < W), chunked C (p // C == p' // C)."""
    m = {k: v.double() for k, v in model.state_dict().items()}
    heads, width = CONFIG.num_heads, CONFIG.d_model
    dim = width // heads
    x = m["token_embedding.weight"][tokens]
    batch, length = tokens.shape
    qp, kp = positions[:, None].double(), positions[None, :].double()
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool))
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions.double()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)

    def rotate(t):
        half = t.shape[-1] // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin

    for i, (kind, (span, window)) in enumerate(zip(kinds, spans)):
        p = f"blocks.{i}."
        h = F.layer_norm(x, (width,), m[p + "ln_attn.weight"], m[p + "ln_attn.bias"])
        q, k, v = (h @ m[p + "attn.qkv.weight"].T).split(width, -1)
        q, k, v = (t.view(batch, length, heads, dim).transpose(1, 2) for t in (q, k, v))
        if kind == "rope":
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
        if kind == "alibi":
            slopes = torch.tensor([2.0 ** (-8.0 * (j + 1) / heads) for j in range(heads)], dtype=torch.float64)
            scores = scores - slopes[:, None, None] * (qp - kp)
        mask = allowed.clone()
        if use_spans and span == "sliding":
            mask &= (qp - kp) < window
        if use_spans and span == "chunked":
            mask &= torch.div(positions[:, None], window, rounding_mode="floor") == \
                torch.div(positions[None, :], window, rounding_mode="floor")
        attended = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        x = x + attended.transpose(1, 2).reshape(batch, length, width) @ m[p + "attn.proj.weight"].T
        h = F.layer_norm(x, (width,), m[p + "ln_mlp.weight"], m[p + "ln_mlp.bias"])
        h = F.gelu(h @ m[p + "mlp.fc.weight"].T + m[p + "mlp.fc.bias"])
        x = x + h @ m[p + "mlp.proj.weight"].T + m[p + "mlp.proj.bias"]
    x = F.layer_norm(x, (width,), m["ln_final.weight"], m["ln_final.bias"])
    return x @ m["head.weight"].T


KINDS = ("rope", "alibi", "nope", "rope")
SPANS = (("sliding", 3), ("chunked", 4), ("full", None), ("full", None))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("offset", [0, 5])
def test_plan_forward_equals_the_layers_built_by_hand(backend, offset):
    model = sharpen(TransformerLM(LMConfig(**{**CONFIG.to_dict(), "backend": backend}), mixed_plan()))
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 14), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(14) + offset  # chunks follow positions, not row indices
    with torch.no_grad():
        got = model(tokens, positions if offset else None).double()
    expected = reference_logits(model, tokens, positions, KINDS, SPANS)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    # the spans matter: without them the reference is far off
    assert (reference_logits(model, tokens, positions, KINDS, SPANS, use_spans=False) - expected).abs().max() > 1e-2


def test_a_uniform_plan_is_the_model_of_one_encoding():
    """The same weights: [rope] * 4 as a plan = the rope model; [irope] * 4 (each layer its
    for_layer(i)) = the irope model; a plan of names builds one instance per name."""
    for name in ("rope", "irope", "t5"):
        single = sharpen(TransformerLM(CONFIG, build(name, attention_chunk_size=4) if name == "irope" else name))
        encoding = single.encoding
        plan = TransformerLM(CONFIG, [encoding] * CONFIG.num_layers)
        plan.load_state_dict({k.replace("encoding.", "plan_encodings.0."): v for k, v in single.state_dict().items()})
        plan.eval()
        tokens = torch.randint(0, CONFIG.vocab_size, (2, 11))
        with torch.no_grad():
            torch.testing.assert_close(plan(tokens), single(tokens), **TOL)
    named = TransformerLM(CONFIG, ["t5", "rope", "t5", None])
    assert len(named.plan_encodings) == 2 and named.plan[0].encoding is named.plan[2].encoding


# -- cache, padding, mask_mod ----------------------------------------------------------------

PLANS = {
    "mixed": mixed_plan,
    "smollm3": lambda: PositionPlan((*(LayerPlan(build("rope")),) * 3, LayerPlan(None))),
    "cohere2": lambda: PositionPlan((*(LayerPlan(build("rope"), "sliding", 4),) * 3, LayerPlan(None))),
    "t5+fox": lambda: PositionPlan((LayerPlan(build("t5"), "chunked", 5), LayerPlan(build("fox"), "sliding", 3),
                                    LayerPlan(None, "sliding", 2), LayerPlan(build("xpos")))),
}


def decode_with_cache(model: TransformerLM, tokens: torch.Tensor, prefill: int) -> torch.Tensor:
    cache = KVCache(model.config.num_layers)
    outs = [model(tokens[:, :prefill], torch.arange(prefill), cache=cache)]
    for t in range(prefill, tokens.shape[1]):
        outs.append(model(tokens[:, t : t + 1], torch.tensor([t]), cache=cache))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(PLANS))
def test_cached_decoding_of_a_plan_equals_the_full_pass(name, backend):
    model = sharpen(TransformerLM(LMConfig(**{**CONFIG.to_dict(), "backend": backend}), PLANS[name]()))
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 13))
    with torch.no_grad():
        full = model(tokens)
        for prefill in (1, 6):
            torch.testing.assert_close(decode_with_cache(model, tokens, prefill), full, **TOL)


def test_a_left_padded_plan_batch_equals_each_row_alone_and_a_mask_mod_equals_the_tensor():
    model = sharpen(TransformerLM(CONFIG, PLANS["cohere2"]()))
    short, long = torch.randint(0, CONFIG.vocab_size, (1, 7)), torch.randint(0, CONFIG.vocab_size, (1, 12))
    tokens = torch.cat((torch.cat((torch.zeros(1, 5, dtype=torch.long), short), 1), long))
    real = torch.ones(2, 12, dtype=torch.bool)
    real[0, :5] = False
    positions = positions_from_padding_mask(real)
    with torch.no_grad():
        batch = model(tokens, positions, mask=key_padding_mask(real))
        torch.testing.assert_close(batch[0, 5:], model(short)[0], **TOL)
        torch.testing.assert_close(batch[1], model(long)[0], **TOL)
        torch.testing.assert_close(model(tokens, positions, mask=key_padding_mask_mod(real)), batch, **TOL)
        # generate() with padding continues each row as if alone
        both = model.generate(tokens, 4, padding_mask=real)
        torch.testing.assert_close(both[0, 5:], model.generate(short, 4)[0])


def test_plans_that_the_lm_cannot_run_are_refused():
    with pytest.raises(InvalidArgument, match="3 layers for a model of num_layers=4"):
        TransformerLM(CONFIG, ["rope"] * 3)
    # attention sinks are run since session 20 (tests/test_lm_sinks.py); a soft-cap is not
    with pytest.raises(InvalidArgument, match="soft-cap"):
        TransformerLM(CONFIG, ["rope"] * 3 + [LayerPlan(build("rope"), softcap=50.0)])
    with pytest.raises(InvalidArgument, match="embed hook"):
        TransformerLM(CONFIG, ["rope", "sinusoidal", "rope", "rope"])
    with pytest.raises(TypeError, match="LayerPlan"):
        TransformerLM(CONFIG, ["rope", 3, "rope", "rope"])


# -- the row spelling ------------------------------------------------------------------------

def test_the_hybrid_plans_parse_into_smollm3s_and_cohere2s_layers():
    smol = Row.parse("rope/nope:4").plan
    assert [smol.layer(i).encoding for i in range(8)] == ["rope"] * 3 + ["nope"] + ["rope"] * 3 + ["nope"]
    config = ExtrapolationConfig(encodings=("rope/nope:4", "rope@sliding/nope:4", "rope@chunked=8/alibi:2/nope:4+rand"))
    assert config.encoding("rope/nope:4").describe() == "0-2: rope theta 10000, rotary 16/16, half-split; full\n3: NoPE; full"
    cohere = config.encoding("rope@sliding/nope:4")
    assert [(layer.span, layer.window, layer.encoding is None) for layer in cohere] == \
        [("sliding", 16, False)] * 3 + [("full", None, True)]
    assert default_window(64) == 16 and default_window(3) == 1
    third = config.encoding("rope@chunked=8/alibi:2/nope:4")  # a later part wins: layer 3 is NoPE
    assert [(type(layer.encoding).__name__, layer.span, layer.window) for layer in third] == [
        ("RoPE", "chunked", 8), ("ALiBi", "full", None), ("RoPE", "chunked", 8), ("NoneType", "full", None)]
    assert Row.parse("rope/nope:4+rand") == Row("rope/nope:4", randomized=True)
    assert config.row_run("rope@chunked=8/alibi:2/nope:4+rand", 0)[1].randomized_positions == 1024
    built = TransformerLM(config.model_config(), config.encoding("rope@sliding/nope:4"))
    assert built.plan[0].window == config.train_len // 4


@pytest.mark.parametrize("row, problem", [
    ("rope/nope", "needs its interval"),
    ("rope/nope:0", "needs its interval"),
    ("rope/nope:x", "needs its interval"),
    ("rope@slid/nope:4", "unknown span 'slid'"),
    ("rope@full=8", "a window is a whole number"),
    ("rope@sliding=0", "a window is a whole number"),
    ("/nope:4", "does not start with an encoding name"),
    ("rope/nope:8", "names no layer of a 4-layer model"),
    ("sinusoidal/nope:4", "adds positions to the token embeddings"),
    ("rope/nothing:2", "unknown encoding 'nothing'"),
])
def test_bad_plan_rows_are_refused_naming_the_row_and_the_forms(row, problem):
    with pytest.raises(InvalidArgument, match=problem) as caught:
        ExtrapolationConfig(encodings=(row,))
    assert f"row {row!r}" in str(caught.value) and "a plan row is BASE" in str(caught.value)


def test_lengthgen_takes_plan_rows_and_its_full_preset_fits_its_three_layers():
    from posenc.lab.experiments.lengthgen import preset_config

    assert preset_config("full").encodings[-2:] == ("rope/nope:3", "rope@sliding/nope:3")
    config = LengthgenConfig(encodings=("rope@sliding/nope:3",), tasks=("copy",))
    plan = config.row_model("rope@sliding/nope:3", config.model_config("copy"), config.train_sequence_length("copy"))
    assert [layer.span for layer in plan] == ["sliding", "sliding", "full"]
    assert plan[0].window == config.train_sequence_length("copy") // 4
    with pytest.raises(InvalidArgument, match="names no layer of a 3-layer model"):
        LengthgenConfig(encodings=("rope/nope:4",))
    with pytest.raises(InvalidArgument, match="row 'rope/nope:3\\+rand'"):
        LengthgenConfig(encodings=("rope/nope:3+rand",))  # lengthgen names no +rand rows


CORPUS = Corpus(torch.zeros(0), torch.zeros(0), {"name": "pinned", "bytes": 1000, "train_bytes": 900, "val_bytes": 100,
                                                  "files": 3})


def test_plan_rows_fingerprints_are_pinned_and_leave_the_others_alone():
    config = ExtrapolationConfig(encodings=("rope", "rope/nope:4", "rope@sliding/nope:4", "irope/nope:4"))
    prints = {row: extrapolation_fingerprint(config, CORPUS, row, 0) for row in config.rows}
    assert prints["rope"] == extrapolation_fingerprint(ExtrapolationConfig(), CORPUS, "rope", 0)
    assert "encoding_options" not in prints["rope/nope:4"]
    assert prints["rope@sliding/nope:4"]["encoding_options"] == {"window": 16}
    assert prints["irope/nope:4"]["encoding_options"] == {"irope": {"attention_chunk_size": 16, "floor_scale": 16}}
    scrubbed = [{k: v for k, v in p.items() if k != "posenc_version"} for p in prints.values()]
    assert hashlib.sha256(json.dumps(scrubbed).encode()).hexdigest()[:16] == "3cf1a0629d198b94"


def test_plan_rows_are_stored_under_file_safe_names(tmp_path):
    assert file_stem("rope@sliding/nope:4") == "rope@sliding__nope-4" and file_stem("rope+rand") == "rope+rand"
    store = RunStore(tmp_path)
    assert store.record_path("rope/nope:4", 0).name == "rope__nope-4-seed0.json"
    assert store.checkpoint_path("copy-rope/nope:3", 1).parent == store.checkpoints
    assert PlanSpelling.parse("rope@sliding=3/nope:2").every[0][1] == 2


# -- checkpoints -----------------------------------------------------------------------------

def test_a_plan_checkpoint_round_trips(tmp_path):
    t5 = build("t5")
    plan = PositionPlan((LayerPlan(t5, "chunked", 4), LayerPlan(build("rope"), "sliding", 3, layer_type="sliding_attention"),
                         LayerPlan(t5), LayerPlan(None)))
    model = sharpen(TransformerLM(CONFIG, plan))
    model.save(tmp_path / "plan.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "plan.pt")
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
    assert loaded.plan.describe() == model.plan.describe() and loaded.plan[1].layer_type == "sliding_attention"
    assert loaded.plan[0].encoding is loaded.plan[2].encoding  # one T5 table, shared again
    assert loaded.num_parameters() == model.num_parameters()
    state = torch.load(tmp_path / "plan.pt", weights_only=True)
    assert state["format"] == 2 and [e["name"] for e in state["encoding"]["plan"]["encodings"]] == ["t5", "rope"]
    assert [layer["encoding"] for layer in state["encoding"]["plan"]["layers"]] == [0, 1, 0, None]


def test_a_plan_training_checkpoint_loads_as_a_model(tmp_path):
    from posenc.lab.train import TrainConfig, train_lm

    config = ExtrapolationConfig(encodings=("irope/nope:4",))
    model = TransformerLM(CONFIG, config.row_model("irope@sliding/nope:4", CONFIG, 32,
                                                   lambda name: posenc.REGISTRY[name].options_for_train_len(32)))
    data = torch.randint(0, CONFIG.vocab_size, (2000,), dtype=torch.uint8)
    train_lm(model, data, TrainConfig(steps=2, batch_size=2, seq_len=16), checkpoint_path=tmp_path / "run.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "run.pt")
    assert loaded.plan[0].encoding.attention_chunk_size == 8 and loaded.plan[0].window == 8
    tokens = torch.randint(0, CONFIG.vocab_size, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model.eval()(tokens), rtol=0, atol=0)


def test_a_plan_of_an_unregistered_layer_encoding_cannot_be_saved(tmp_path):
    """PositionPlan.uniform(irope) holds irope's per-layer pieces, which no registry name
    rebuilds: saving says so before writing anything."""
    model = TransformerLM(CONFIG, PositionPlan.uniform(build("irope"), CONFIG.num_layers))
    with pytest.raises(InvalidArgument, match="not a registered encoding class"):
        model.save(tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("command", ["extrapolate", "lengthgen"])
def test_the_cli_refuses_a_bad_plan_row_in_one_line_and_documents_the_spelling(command, capsys, tmp_path, monkeypatch):
    from posenc.lab.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([command, "--encodings", "rope,rope@window/nope:2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error:") and err.count("\n") == 1 and "row 'rope@window/nope:2'" in err, err
    monkeypatch.setenv("COLUMNS", "400")
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rope/nope:4: NoPE every 4th layer over RoPE" in out and "rope@sliding/nope:4" in out
