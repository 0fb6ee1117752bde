"""The checkpoint format (posenc.lab.checkpoint): one writer, one reader, plain data only.

Every checkpoint, a model's (TransformerLM.save) or a training run's (train_lm), loads with
torch.load(weights_only=True), names its config and encoding in its own keys (not only inside
an experiment's fingerprint) and rebuilds the same model. Resuming from such a checkpoint
continuing bit-identically is covered by test_resume.py.
"""

import pytest
import torch

import posenc
from posenc.lab.checkpoint import FORMAT, CheckpointMismatch, load_checkpoint, read_model
from posenc.encodings import RoPE
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import TrainConfig, train_lm

CONFIG = LMConfig(d_model=32, num_layers=1, num_heads=4, max_positions=64)

#: Options off their defaults, so that a spec which dropped one would rebuild another model.
OPTIONS = {
    "nope": {}, "sinusoidal": {"base": 500.0, "layout": "concat"}, "learned": {},
    "rope": {"base": 500.0, "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    "xpos": {"gamma": 0.3, "center": "call", "base": 1000.0}, "alibi": {}, "t5": {"num_buckets": 8, "max_distance": 32},
    "kerple": {"variant": "power"}, "fire": {"mlp_width": 8, "init_L": 100.0}, "shaw": {"max_relative_position": 4},
    "transformer_xl": {"base": 100.0}, "p_rope": {"partial_rotary_factor": 0.5, "base": 500.0},
    "mrope": {"mrope_section": [2, 1, 1], "mrope_interleaved": True, "base": 1e6},
    "axial_rope": {"axial_dims": [2, 4], "freqs_for": "pixel", "grid_size": [4, 8], "max_freq": 8.0, "interleaved": True},
    "irope": {"no_rope_layers": [0], "attention_chunk_size": 4, "floor_scale": 3, "attn_scale": 0.5,
              "rope_theta": 10000.0, "interleaved": False},
    "cope": {"npos_max": 9}, "fox": {}, "path": {"w_rank": 8, "forget_gate": True, "w_shortconv": True},
    "grape_additive": {"p_head_dim": 6, "base": 2.0},
    "grape_contextual": {"base": 500.0, "per_head_phase": True, "share_across_heads": False, "init_omega": 0.01,
                         "learnable": False},
    "fope": {"rope_theta": 500.0, "max_position_embeddings": 32, "fope_init_factor": 0.5, "learnable": True,
             "sin_pad_value": 0.0},
    "liere": {"num_key_value_heads": 2, "block_size": 4, "position_scale": 0.125, "init_range": 1.0},
    "comrope": {"num_key_value_heads": 4, "block_size": 2, "num_axes": 2, "variant": "ap", "init_std": 0.5,
                "learnable": False},
    "vo_rope": {"rotary_dim": 4, "base": 500.0, "interleaved": False, "rotary_slice": "first",
                "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                            "attention_factor": 1.0}},
    "videorope": {"mrope_section": [2, 1, 1], "base": 1e6, "interleaved": True},
    "mhrope": {"mrope_section": [1, 1, 1], "rotary_dim": 4, "base": 500.0},
    "grape": {"num_key_value_heads": 2, "base": 500.0, "learnable": False},
}


def test_options_cover_every_registered_encoding():
    assert sorted(OPTIONS) == sorted(posenc.available())


def same_logits(a, b):
    tokens = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(a.eval()(tokens), b.eval()(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("name", posenc.available())
def test_model_checkpoint_loads_weights_only_and_rebuilds_the_model(name, tmp_path):
    model = TransformerLM(CONFIG, name)
    model.save(tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert state["format"] == FORMAT and state["config"] == CONFIG.to_dict()
    assert state["encoding"] == {"name": name, "kwargs": {}}
    same_logits(TransformerLM.from_checkpoint(tmp_path / "m.pt"), model)


@pytest.mark.parametrize("name", posenc.available())
def test_a_model_built_from_an_instance_saves_its_options(name, tmp_path):
    encoding = posenc.create_for_model(name, **CONFIG.encoding_sizes(), **OPTIONS[name])
    model = TransformerLM(CONFIG, encoding)
    model.save(tmp_path / "m.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "m.pt")
    assert type(loaded.encoding) is type(encoding)
    assert {k: getattr(loaded.encoding, k) for k in OPTIONS[name] if hasattr(encoding, k)} == \
        {k: getattr(encoding, k) for k in OPTIONS[name] if hasattr(encoding, k)}
    same_logits(loaded, model)


def test_an_encoding_swapped_in_after_construction_is_the_one_saved(tmp_path):
    """The rope-extension fine-tunes replace a trained model's RoPE by a scaled one."""
    model = TransformerLM(CONFIG, "rope")
    scaling = {"rope_type": "linear", "factor": 2.0}
    model.encoding = RoPE(CONFIG.head_dim, scaling=scaling)
    model.save(tmp_path / "m.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "m.pt")
    assert loaded.encoding.scaling == scaling
    same_logits(loaded, model)


class Unregistered(posenc.PositionalEncoding):
    name = "unregistered"


@pytest.mark.parametrize("encoding, match", [
    (Unregistered(), "Unregistered is not a registered encoding class"),
    (posenc.create("rope", head_dim=4), "RoPE has options that cannot be read back"),  # not the model's head_dim
    (posenc.create("learned", num_positions=10, dim=32), "LearnedAbsolute has options that cannot be read back"),
])
def test_saving_an_encoding_that_cannot_be_rebuilt_is_a_clear_error(encoding, match, tmp_path):
    model = TransformerLM(CONFIG, encoding)
    with pytest.raises(ValueError, match=f"cannot save a model whose encoding cannot be rebuilt: {match}"):
        model.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()
    data = torch.zeros(100, dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot save a model whose encoding cannot be rebuilt"):  # before any step
        train_lm(model, data, TrainConfig(steps=2, batch_size=1, seq_len=8), checkpoint_path=tmp_path / "t.pt")
    assert not (tmp_path / "t.pt").exists()


def test_saving_leaves_the_global_rng_alone(tmp_path):
    model = TransformerLM(CONFIG, posenc.create_for_model("fire", **CONFIG.encoding_sizes()))
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    model.save(tmp_path / "m.pt")  # rebuilds the encoding to check the spec
    assert torch.equal(torch.rand(3), expected)


def test_training_checkpoint_loads_weights_only_without_the_fingerprint(tmp_path):
    """train_lm's checkpoint names the model in checkpoint.py's keys: loading it does not read
    the experiment's fingerprint, whatever that holds."""
    torch.manual_seed(0)
    model = TransformerLM(CONFIG, "alibi")
    data = torch.randint(0, 256, (500,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "train.pt"
    train_lm(model, data, TrainConfig(steps=3, batch_size=2, seq_len=8), checkpoint_path=path,
             checkpoint_every=2, fingerprint={"experiment": "anything"})
    state = torch.load(path, weights_only=True)
    assert state["format"] == FORMAT and state["step"] == 3 and len(state["losses"]) == 3
    assert state["config"] == CONFIG.to_dict() and state["encoding"] == {"name": "alibi", "kwargs": {}}
    assert state["generator"].dtype == torch.uint8  # torch.Generator.get_state()
    assert "model" not in state["fingerprint"]
    same_logits(TransformerLM.from_checkpoint(path), model)
    expected = {"train": TrainConfig(steps=3, batch_size=2, seq_len=8).to_dict(), "experiment": "anything"}
    assert load_checkpoint(path, expected)["step"] == 3
    with pytest.raises(CheckpointMismatch, match="other arguments"):
        load_checkpoint(path, {**expected, "experiment": "other"})


def test_a_newer_format_is_refused(tmp_path):
    model = TransformerLM(CONFIG, "nope")
    model.save(tmp_path / "m.pt")
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**state, "format": FORMAT + 1}, tmp_path / "m.pt")
    with pytest.raises(ValueError, match=f"format {FORMAT + 1}, newer than this posenc reads"):
        read_model(tmp_path / "m.pt")


def test_a_file_that_needs_unpickling_code_is_refused(tmp_path):
    """weights_only=True: an arbitrary pickled object is not loaded."""
    torch.save({"format": FORMAT, "config": CONFIG, "encoding": {"name": "nope", "kwargs": {}}, "model": {}},
               tmp_path / "m.pt")  # an LMConfig instance, not its fields
    with pytest.raises(ValueError, match="not a readable posenc checkpoint"):
        TransformerLM.from_checkpoint(tmp_path / "m.pt")
    with pytest.raises(CheckpointMismatch, match="corrupt or not a posenc checkpoint"):
        load_checkpoint(tmp_path / "m.pt", {})


def test_an_encoding_built_with_its_constructor_defaults_saves_them(tmp_path):
    """T5's constructor defaults to bidirectional buckets, a causal model's for_model to one-sided
    ones: the checkpoint keeps the constructor's choice, from the encoding's recorded config."""
    model = TransformerLM(CONFIG, posenc.create("t5", num_heads=CONFIG.num_heads))
    assert model.encoding_spec() == {"name": "t5", "kwargs": {"bidirectional": True}}
    model.save(tmp_path / "m.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "m.pt")
    assert loaded.encoding.bidirectional is True
    same_logits(loaded, model)


def test_older_checkpoints_still_load(tmp_path):
    """Files written by earlier versions: a format-1 checkpoint with the encoding's options, and a
    training checkpoint from before format 1 that named the model in its fingerprint only."""
    torch.manual_seed(0)
    model = TransformerLM(CONFIG, posenc.create_for_model("sinusoidal", **CONFIG.encoding_sizes(), base=500.0))
    torch.save({"format": 1, "config": CONFIG.to_dict(), "encoding": {"name": "sinusoidal", "kwargs": {"base": 500.0}},
                "model": model.state_dict()}, tmp_path / "format1.pt")
    same_logits(TransformerLM.from_checkpoint(tmp_path / "format1.pt"), model)
    plain = TransformerLM(CONFIG, "alibi")
    torch.save({"fingerprint": {"model": CONFIG.to_dict(), "encoding": "alibi"}, "model": plain.state_dict(),
                "step": 3}, tmp_path / "before_format1.pt")
    loaded = TransformerLM.from_checkpoint(tmp_path / "before_format1.pt")
    assert loaded.encoding_spec() == {"name": "alibi", "kwargs": {}}
    same_logits(loaded, plain)


@pytest.mark.parametrize("field, value", [("num_layers", 10**6), ("max_positions", 10**12)])
def test_a_checkpoint_asking_for_more_than_it_stores_is_refused_before_building(tmp_path, field, value):
    """A crafted config (issue 22): num_layers 10^6, or max_positions 10^12 with a learned
    table (256 TB), was built before anything compared it with the stored weights."""
    import posenc.lab.checkpoint as checkpoint
    from posenc.lab.model import LMConfig, TransformerLM

    path = tmp_path / "model.pt"
    TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=16), "learned").save(path)
    state = torch.load(path, weights_only=True)
    state["config"][field] = value
    checkpoint.atomic_save(path, state)
    with pytest.raises(ValueError, match="needs at least .* parameters, the file stores"):
        TransformerLM.from_checkpoint(path)
