"""The LM consumes any encoding through its hooks; no module outside encodings/ names one."""

import math
import pathlib
import re

import pytest
import torch

import posenc
from posenc.lab.model import KVCache, LMConfig, TransformerLM

SRC = pathlib.Path(posenc.__file__).parent


@pytest.mark.parametrize("name", posenc.available())
def test_every_encoding_trains_in_the_model(name):
    config = LMConfig(d_model=32, num_layers=2, num_heads=4, max_positions=64)
    model = TransformerLM(config, name)
    tokens = torch.randint(0, 256, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 256) and logits.dtype == torch.float32
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens.reshape(-1))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_causality_future_tokens_do_not_change_past_logits():
    model = TransformerLM(LMConfig(d_model=32, num_layers=2, num_heads=4), "rope").eval()
    tokens = torch.randint(0, 256, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 256
    torch.testing.assert_close(model(tokens)[:, :8], model(changed)[:, :8])


def test_model_and_attention_never_name_an_encoding():
    names = "|".join(re.escape(n) for n in posenc.available() if n != "nope")
    pattern = re.compile(rf"""["']({names})["']""")
    attention = sorted(f"attention/{p.name}" for p in (SRC / "attention").glob("*.py"))  # the package
    for path in ("lab/model.py", "masks.py", "lab/generation.py", "lab/checkpoint.py", *attention, "lab/train.py", "lab/evaluate.py"):
        assert not pattern.search((SRC / path).read_text()), path


def test_learned_table_refuses_long_inputs():
    model = TransformerLM(LMConfig(d_model=32, num_layers=1, num_heads=4, max_positions=8), "learned")
    assert model.max_positions == 8
    with pytest.raises(ValueError, match="learned table holds positions 0..7"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_heads=0), "num_heads must be an integer >= 1"),
    (dict(d_model=30, num_heads=4), "divisible"),
    (dict(num_layers=0), "num_layers"),
    (dict(backend="fast"), "backend must be one of"),
])
def test_config_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LMConfig(**kwargs)


def test_unknown_encoding_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown encoding 'rotary'; available: nope, sinusoidal"):
        posenc.create("rotary")
    with pytest.raises(ValueError, match="available"):
        TransformerLM(LMConfig(), "rotary")


def test_odd_head_dim_is_refused_at_construction():
    with pytest.raises(ValueError, match="head_dim must be a positive even integer"):
        TransformerLM(LMConfig(d_model=36, num_heads=4), "rope")


def test_grouped_query_lm_trains_and_caches():
    """num_kv_heads < num_heads: a smaller qkv projection and cache, the same contract."""
    config = LMConfig(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=64)
    model = TransformerLM(config, "alibi").eval()
    assert model.blocks[0].attn.qkv.out_features == (4 + 2 * 2) * 8
    tokens = torch.randint(0, 256, (2, 12))
    full = model(tokens)
    cache = KVCache(config.num_layers)
    steps = [model(tokens[:, :7], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(7, 12)]
    assert cache.keys[0].shape == (2, 2, 12, 8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert LMConfig(num_heads=4).to_dict() == {k: v for k, v in LMConfig(num_heads=4, num_kv_heads=4).to_dict().items()
                                               if k != "num_kv_heads"}
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        LMConfig(num_heads=4, num_kv_heads=3)


def test_randomized_positions_training_samples_sorted_distinct_positions_per_row():
    """Ruoss et al. 2023: positions are a sorted sample of T distinct values from [0, N) per
    row, new every step; the model is then evaluated at ordinary positions."""
    from posenc.lab.train import TrainConfig, random_positions, train_lm

    g = torch.Generator().manual_seed(0)
    positions = random_positions(64, 16, 128, g)
    assert positions.shape == (64, 16) and positions.dtype == torch.int64
    assert bool((positions.diff(dim=-1) > 0).all()) and int(positions.min()) >= 0 and int(positions.max()) < 128
    assert len({tuple(row.tolist()) for row in positions}) == 64  # rows differ
    assert int(positions.max()) > 100  # the range is used, not just its start
    assert torch.equal(random_positions(3, 16, 16, g), torch.arange(16).expand(3, 16))  # N = T: 0..T-1

    seen = []
    model = TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=128), "rope")
    forward = model.forward
    model.forward = lambda tokens, positions=None, **kw: (seen.append(positions), forward(tokens, positions, **kw))[1]
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    config = TrainConfig(steps=3, batch_size=4, seq_len=8, randomized_positions=128)
    losses = train_lm(model, data, config)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert len(seen) == 3 and all(p.shape == (4, 8) for p in seen) and not torch.equal(seen[0], seen[1])
    assert TrainConfig().to_dict() == {k: v for k, v in TrainConfig(randomized_positions=None).to_dict().items()}
    assert "randomized_positions" not in TrainConfig().to_dict()
    with pytest.raises(ValueError, match="randomized_positions=4 must be >= seq_len=8"):
        TrainConfig(seq_len=8, randomized_positions=4)


def test_each_layer_runs_the_encoding_its_for_layer_names():
    """A layer schedule (for_layer) reaches every block: a toy schedule that rotates on even
    layers only equals a model whose odd layers were given no encoding (checked by hand)."""
    from posenc.encodings.nope import NoPE

    class EvenLayersRoPE(posenc.PositionalEncoding):
        name = "even_layers_rope"

        def __init__(self):
            super().__init__()
            self.rope, self.nope = posenc.create("rope", head_dim=16), NoPE()

        def for_layer(self, layer):
            return self.rope if layer % 2 == 0 else self.nope

    torch.manual_seed(0)
    config = LMConfig(d_model=32, num_heads=2, num_layers=3, max_positions=64)
    model = TransformerLM(config, EvenLayersRoPE()).eval()
    for block in model.blocks:  # sharp attention, so that where positions enter shows in the logits
        torch.nn.init.normal_(block.attn.qkv.weight, std=0.5)
        torch.nn.init.normal_(block.attn.proj.weight, std=0.5)
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        scheduled = model(tokens)
        x = model.token_embedding(tokens)
        positions = torch.arange(12)
        for layer, block in enumerate(model.blocks):
            encoding = model.encoding.rope if layer % 2 == 0 else None
            x = x + block.attn.proj(
                _attend(block.attn, block.ln_attn(x), positions, encoding)
            )
            x = x + block.mlp(block.ln_mlp(x))
        by_hand = model.head(model.ln_final(x))
    torch.testing.assert_close(scheduled, by_hand, rtol=1e-5, atol=1e-5)
    # and the schedule matters: all-RoPE differs
    model.encoding = posenc.create("rope", head_dim=16)
    with torch.no_grad():
        assert not torch.allclose(model(tokens), scheduled, atol=1e-3)


def _attend(attn, x, positions, encoding):
    batch, length, width = x.shape
    q, k, v = attn.qkv(x).split(width, dim=-1)
    q, k, v = (t.view(batch, length, attn.num_heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))
    if encoding is not None:
        q, k = posenc.create("rope", head_dim=attn.head_dim).rotate(q, k, positions, positions)
    scores = (q @ k.transpose(-1, -2)) / attn.head_dim**0.5
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, width)
