"""The branch-merge methods' one record each (posenc.position_maps.MAP_METHODS): names, maps,
parameters and the references' defaults, checked against numbers written out here from the
reference code (cited per line), at Llama 2's L0 = 4096, at Llama 3.1's 131072 and at a small
lab model's 256."""

from __future__ import annotations

import math

import pytest

import posenc
from posenc.errors import InvalidArgument
from posenc.position_maps import MAP_METHODS, METHODS, position_map

#: (L0, method) -> the map's fields the reference gives, by hand.
REFERENCE = {
    4096: {
        "self_extend": {"group_size": 8, "neighbor_window": 1024},  # LongLM group_size_1=8, group_size_2=1024
        "rerope": {"window": 512, "training_length": 4096},  # bojone/rerope: window 512, the model's length
        "leaky_rerope": {"window": 512, "scaling_factor": 16, "training_length": 4096},
        "dca": {"chunk_size": 3072, "local_size": 256},  # ChunkLlama: 3/4 and 1/16 of the pretraining length
        "string": {"shifted_offset": 1351, "local_value": 128},  # STRING: int(0.33 * 4096), small_local_value 128
        "lm_infinite": {"local_branch": 4096, "global_branch": 100},  # LM-Infinite's Llama 2 scripts
        "streaming_llm": {"start_size": 4, "recent_size": 512},  # StartRecentKVCache(4, 512)
    },
    131072: {
        "self_extend": {"group_size": 8, "neighbor_window": 1024},
        "rerope": {"window": 512, "training_length": 131072},
        "leaky_rerope": {"window": 512, "scaling_factor": 16, "training_length": 131072},
        "dca": {"chunk_size": 98304, "local_size": 8192},
        "string": {"shifted_offset": 43253, "local_value": 128},  # int(0.33 * 131072) = int(43253.76)
        "lm_infinite": {"local_branch": 131072, "global_branch": 100},
        "streaming_llm": {"start_size": 4, "recent_size": 512},
    },
}


#: the parameters a method has no published default for (windowed_yarn's factor: s = N / L0 of a length no one named)
REQUIRED = {"windowed_yarn": {"factor": 2.0}}


def test_one_record_per_method_and_the_names_everywhere_are_its_keys():
    assert list(METHODS) == list(MAP_METHODS)
    assert set(posenc.encodings.BRANCHED_METHODS) == set(MAP_METHODS)
    from posenc.lab.experiments.extension_methods import BRANCH_METHODS
    assert BRANCH_METHODS == tuple(MAP_METHODS)
    for name, method in MAP_METHODS.items():
        assert method.name == name
        assert isinstance(position_map(name, **REQUIRED.get(name, {})), method.map_class)
        assert set(method.reference_defaults) <= set(method.parameters)
        assert set(method.proportional) <= set(method.lengths) <= set(method.reference_defaults)


@pytest.mark.parametrize("length", sorted(REFERENCE))
def test_defaults_are_the_references(length):
    for name, fields in REFERENCE[length].items():
        built = position_map(name, **MAP_METHODS[name].defaults(length))
        assert {field: getattr(built, field) for field in fields} == fields, name


def test_string_states_its_attention_factor_once():
    assert MAP_METHODS["string"].attention_factor == pytest.approx(0.1 * math.log(2) + 1)
    assert position_map("string").attention_factor == MAP_METHODS["string"].attention_factor
    assert all(m.attention_factor == 1.0 for name, m in MAP_METHODS.items() if name != "string")


def test_scaled_defaults_keep_the_references_proportions():
    """At L0 = 256 every length is 1/16 of the reference's (rounded), ratios and counts kept."""
    scaled = {name: m.scaled_defaults(256) for name, m in MAP_METHODS.items()}
    assert scaled == {
        "self_extend": {"group_size": 8, "neighbor_window": 64},
        "rerope": {"window": 32, "training_length": 256},
        "leaky_rerope": {"window": 32, "scaling_factor": 16, "training_length": 256},
        "dca": {"chunk_size": 192, "local_size": 16},
        "string": {"training_length": 256, "local_value": 8},
        "lm_infinite": {"local_branch": 256, "global_branch": 6},
        "streaming_llm": {"start_size": 4, "recent_size": 32},
        "windowed_yarn": {"factor": None, "window": 224, "training_length": 256, "beta_fast": 32.0,
                          "beta_slow": 1.0, "attention_factor": None},
    }


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_a_bad_training_length_is_named(bad):
    with pytest.raises(InvalidArgument, match="training_length"):
        MAP_METHODS["dca"].defaults(bad)
    with pytest.raises(InvalidArgument, match="training_length"):
        MAP_METHODS["dca"].scaled_defaults(bad)
