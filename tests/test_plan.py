"""PositionPlan and LayerPlan as data: validation, grouping, descriptions."""

from __future__ import annotations

import pytest

import posenc
from posenc.errors import InvalidArgument, InvalidType
from posenc.hf_config.plan import LayerPlan, PositionPlan, layer_ranges


def test_layer_ranges_groups_consecutive_layers():
    assert layer_ranges([0, 1, 2, 4, 5, 6, 8]) == "0-2, 4-6, 8"
    assert layer_ranges([3]) == "3"
    assert layer_ranges([7, 3]) == "3, 7"


def test_describe_groups_layers_with_the_same_plan():
    rope = posenc.create("rope", head_dim=64, base=10000.0)
    layers = [LayerPlan(None) if i % 4 == 3 else LayerPlan(rope, "sliding", 4096) for i in range(8)]
    text = PositionPlan(tuple(layers)).describe()
    assert text.splitlines() == ["0-2, 4-6: rope theta 10000, rotary 64/64, half-split; sliding 4096", "3, 7: NoPE; full"]


@pytest.mark.parametrize("kwargs, error", [
    (dict(span="window"), InvalidArgument),
    (dict(span="sliding"), InvalidArgument),
    (dict(span="sliding", window=0), InvalidArgument),
    (dict(span="chunked", window=True), InvalidArgument),
    (dict(span="full", window=8), InvalidArgument),
    (dict(encoding="rope"), InvalidType),
    ({"softcap": 0.0}, InvalidArgument),
    ({"softcap": -50.0}, InvalidArgument),
    ({"softcap": float("nan")}, InvalidArgument),
    ({"softcap": True}, InvalidArgument),
    ({"softcap": "50"}, InvalidArgument),
])
def test_layer_plan_refuses_bad_values(kwargs, error):
    with pytest.raises(error):
        LayerPlan(**kwargs)


def test_plan_needs_layers_and_an_embed_encoding_for_its_embedding():
    with pytest.raises(InvalidArgument, match="layers"):
        PositionPlan(())
    with pytest.raises(InvalidArgument, match="embed hook"):
        PositionPlan((LayerPlan(),), embedding=posenc.create("alibi", num_heads=4))


def test_uniform_puts_an_embedding_at_the_embedding_and_a_schedule_per_layer():
    learned = posenc.create("learned", dim=16, num_positions=8)
    plan = PositionPlan.uniform(learned, 3)
    assert plan.embedding is learned and all(layer.encoding is None for layer in plan)
    irope = posenc.create_for_model("irope", d_model=32, num_heads=4, head_dim=8, max_positions=64, num_layers=4)
    plan = PositionPlan.uniform(irope, 4)
    assert [layer.encoding for layer in plan] == [irope.for_layer(i) for i in range(4)]
    assert len(plan) == 4 and plan[1] is plan.layers[1]


def test_softcap_is_described_and_recorded():
    rope = posenc.create("rope", head_dim=16)
    plan = PositionPlan((LayerPlan(rope, "sliding", 8, softcap=50.0), LayerPlan(rope)))
    assert plan.describe().splitlines() == ["0: rope theta 10000, rotary 16/16, half-split; sliding 8; softcap 50",
                                            "1: rope theta 10000, rotary 16/16, half-split; full"]
    data = plan.to_dict()
    assert [layer["softcap"] for layer in data["layers"]] == [50.0, None]
    back = PositionPlan.from_dict(data)
    assert [layer.softcap for layer in back] == [50.0, None] and back.describe() == plan.describe()
    for layer in data["layers"]:  # a plan saved before LayerPlan had a softcap still loads
        del layer["softcap"]
    assert [layer.softcap for layer in PositionPlan.from_dict(data)] == [None, None]


def test_the_old_import_path_is_the_library_module():
    import posenc.hf_config.plan as old
    import posenc.plan as new

    for name in old.__all__:
        assert getattr(old, name) is getattr(new, name), name
