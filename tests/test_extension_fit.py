"""Parameters fitted to a target length (issue 36, item 4): ``fit_to_length`` and
``extend_context(model, method, target_length=N)``.

Checked against what the rules are about, not the fitting code's own formula: each fitted map's
farthest rotation distance for the last of N tokens, read from the map itself
(``relative_positions`` of :mod:`posenc.position_maps`, golden-tested there), is at most L0 - 1,
and one step less (group_size - 1, ...) passes it; the Self-Extend README's worked example
(L0 4096, w 1024, N 15,800: "the group size can be set to 5", "positions 1,025 to 3,979").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.errors import InvalidArgument
from posenc.hf_config.extension import fit_to_length
from posenc.position_maps import position_map


def farthest(method: str, params: dict, n: int) -> float:
    """The largest rotation distance the map gives the last of n tokens (in positions)."""
    rel, covered = position_map(method, **params).relative_positions(1, n)
    return rel[covered].max().item()


def test_self_extend_reproduces_the_readme_example():
    fit = fit_to_length("self_extend", 15800, 4096, {"neighbor_window": 1024})
    assert fit.params == {"group_size": 5, "neighbor_window": 1024}
    assert farthest("self_extend", fit.params, 15800) == 3979  # "uses positions 1,025 to 3,979"


@settings(max_examples=40, deadline=None)
@given(l0=st.integers(64, 1024), extra=st.integers(1, 3000))
def test_each_fitted_map_keeps_its_farthest_position_below_l0_and_is_the_tightest(l0, extra):
    n = l0 + extra
    se = fit_to_length("self_extend", n, l0).params
    assert farthest("self_extend", se, n) <= l0 - 1
    if se["group_size"] > 2:
        assert farthest("self_extend", {**se, "group_size": se["group_size"] - 1}, n) > l0 - 1
    leaky = fit_to_length("leaky_rerope", n, l0, {"window": l0 // 8}).params
    assert farthest("leaky_rerope", leaky, n) <= l0 - 1
    if leaky["scaling_factor"] > 1:
        assert farthest("leaky_rerope", {**leaky, "scaling_factor": leaky["scaling_factor"] - 1}, n) > l0 - 1
    if n > 2 * l0 - l0 // 16:  # past STRING's reach: the unshifted distances alone pass L0 - 1
        with pytest.raises(InvalidArgument, match="STRING keeps every distance below L0 only up to"):
            fit_to_length("string", n, l0, {"local_value": l0 // 16})
        return
    string = fit_to_length("string", n, l0, {"local_value": l0 // 16}).params
    assert farthest("string", string, n) <= l0 - 1
    if string["shifted_offset"] > int(0.33 * l0):
        assert farthest("string", {**string, "shifted_offset": string["shifted_offset"] - 1}, n) > l0 - 1


@pytest.mark.parametrize("method", ["rerope", "dca", "lm_infinite", "streaming_llm"])
def test_length_free_maps_keep_their_defaults_and_stay_below_l0(method):
    from posenc.hf_config.extension import method_defaults

    fit = fit_to_length(method, 6000, 2048)
    assert fit.factor is None and fit.params == method_defaults(method, {"max_position_embeddings": 2048})
    if method != "streaming_llm":  # StreamingLLM's positions are the cache's slots, not a distance map
        # LM-Infinite's cap is L0 itself (its reference passes the training length as the local branch)
        assert farthest(method, fit.params, 6000) <= 2048 - 1 + (method == "lm_infinite")


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "yarn", "dynamic_yarn"])
def test_scalings_take_factor_target_over_training_length(method):
    fit = fit_to_length(method, 12288, 8192, {"beta_fast": 16})
    assert fit.factor == 1.5 and fit.params == {"beta_fast": 16} and "12288 / 8192" in fit.rule


@pytest.mark.parametrize("method,n,l0,params,match", [
    ("yarn", 8192, 8192, {}, "target_length must be an int > the training length L0 = 8192"),
    ("yarn", 9000.0, 8192, {}, "target_length must be an int"),
    ("llama3", 16384, 8192, {}, "llama3 has no published rule"),
    ("self_extend", 15800, 4096, {"group_size": 4, "neighbor_window": 1024}, "group_size: 4 .* smallest that fits is 5"),
    ("leaky_rerope", 16384, 4096, {"scaling_factor": 2}, "scaling_factor: 2 .* smallest that fits is 5"),
    ("string", 6144, 4096, {"shifted_offset": 2000}, "shifted_offset: 2000 .* those that fit are 2176 to 4096"),
    ("string", 6144, 4096, {"shifted_offset": 4097}, "shifted_offset: 4097 .* those that fit are 2176 to 4096"),
    ("string", 8192, 4096, {}, "STRING keeps every distance below L0 only up to 2 L0 - local_value = 8064"),
    ("self_extend", 9000, 4096, {"neighbor_window": 4096}, "neighbor_window must be an int in"),
    ("nope", 9000, 4096, {}, "method must be one of"),
])
def test_refusals_name_the_argument(method, n, l0, params, match):
    with pytest.raises(InvalidArgument, match=match):
        fit_to_length(method, n, l0, params)


def test_given_parameters_that_fit_are_kept():
    assert fit_to_length("self_extend", 15800, 4096, {"group_size": 8, "neighbor_window": 1024}).params == {
        "group_size": 8, "neighbor_window": 1024}


# -- through extend_context, on a tiny Llama ------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _llama():
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


def test_extend_context_with_target_length_is_the_fitted_call_and_prints_it(capsys):
    from posenc.integrations.transformers import extend_context

    fitted = extend_context(_llama(), "yarn", target_length=640)
    assert "extend_context: yarn: factor = N / L0 = 640 / 256 = 2.5" in capsys.readouterr().err
    assert fitted.config.rope_parameters == extend_context(_llama(), "yarn", 2.5).config.rope_parameters

    mapped = extend_context(_llama(), "self_extend", target_length=1000)
    err = capsys.readouterr().err
    assert "self_extend: group_size=5, neighbor_window=64" in err and "N = 1000, L0 = 256" in err
    assert mapped.config.posenc_context_extension["params"] == {"group_size": 5, "neighbor_window": 64}


def test_extend_context_refuses_factor_and_target_length_together():
    from posenc.integrations.transformers import extend_context

    model = _llama()
    with pytest.raises(InvalidArgument, match="factor: give factor or target_length, not both"):
        extend_context(model, "yarn", 2.0, target_length=512)
    assert model.config.rope_parameters.get("rope_type", "default") == "default"
