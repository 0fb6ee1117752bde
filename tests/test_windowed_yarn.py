"""windowed_yarn: plain RoPE within a local window, YaRN (Peng et al. 2023) past it (issue 36, item 5).

References, none of them posenc's RoPE: the attention written out in float64 from the formulas
(RoPE's relative rotation q . R((i - j) theta) k in half-split pairs; YaRN's NTK-by-parts
frequencies and attention factor from the paper's sec. 3.2-3.4, as Hugging Face's
``_compute_yarn_parameters`` states them); transformers' own YaRN model, which windowed_yarn
with a window of 1 and attention factor 1 is; and transformers' plain model inside the window.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.encodings import RoPE, branched
from posenc.errors import InvalidArgument
from posenc.hf_config.extension import fit_to_length, method_defaults
from posenc.position_maps import MAP_METHODS, position_map

D, BASE = 16, 10000.0


def yarn_inv_freq(factor: float, l0: int, beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """YaRN sec. 3.2 in float64: pair i keeps theta_i where its wavelength is short (more than
    beta_fast rotations over L0), takes theta_i / s where it is long (fewer than beta_slow), a
    linear ramp between; the bounds floored / ceiled as Hugging Face does."""
    theta = BASE ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)

    def dim_of(rotations: float) -> float:
        return D * math.log(l0 / (rotations * 2 * math.pi)) / (2 * math.log(BASE))

    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), D - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return theta / factor * ramp + theta * (1 - ramp)


def reference(q, k, v, *, window: int, factor: float, training_length: int, attention_factor: float | None = None):
    """The map written out: logits q_i . R(d theta) k_j, d = i - j, theta plain for d < window,
    YaRN's past it with the logit times attention_factor ** 2 (default (0.1 ln s + 1) ** 2);
    one causal softmax over all keys; float64."""
    t = q.shape[-2]
    d = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).to(torch.float64)  # (T, T)
    mscale = (0.1 * math.log(factor) + 1) if attention_factor is None else attention_factor

    def logits(inv_freq):
        angle = d[..., None] * inv_freq  # (T, T, D/2)
        qa, qb = q[..., : D // 2], q[..., D // 2:]
        ka, kb = k[..., : D // 2], k[..., D // 2:]
        same = torch.einsum("bhif,bhjf,ijf->bhij", qa, ka, angle.cos()) + torch.einsum(
            "bhif,bhjf,ijf->bhij", qb, kb, angle.cos())
        cross = torch.einsum("bhif,bhjf,ijf->bhij", qa, kb, angle.sin()) - torch.einsum(
            "bhif,bhjf,ijf->bhij", qb, ka, angle.sin())
        return (same + cross) / math.sqrt(D)

    theta = BASE ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    scores = torch.where(d < window, logits(theta), logits(yarn_inv_freq(factor, training_length)) * mscale ** 2)
    scores = scores.masked_fill(d < 0, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def qkv(t: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, t, D, generator=g, dtype=torch.float64) for _ in range(3))


PARAMS = {"factor": 2.5, "window": 12, "training_length": 16}


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
@pytest.mark.parametrize("attention_factor", [None, 1.0])
def test_windowed_yarn_equals_the_formula_in_float64(backend, attention_factor):
    q, k, v = qkv()
    encoding = branched(RoPE(D), "windowed_yarn", **PARAMS, attention_factor=attention_factor)
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding, backend=backend)
    want = reference(q, k, v, **PARAMS, attention_factor=attention_factor)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("wrong", [{"window": 13}, {"factor": 2.0}, {"attention_factor": 1.0}, {"training_length": 32}])
def test_the_formula_check_fails_on_a_wrong_map(wrong):
    """The reference tells each parameter apart (else the test above could not fail)."""
    q, k, v = qkv()
    with torch.no_grad():
        got = posenc.attention(q, k, v, branched(RoPE(D), "windowed_yarn", **PARAMS), backend="eager")
    assert (got - reference(q, k, v, **{**PARAMS, **wrong})).abs().max() > 1e-4


def test_at_factor_one_it_is_plain_rope_everywhere():
    q, k, v = qkv()
    with torch.no_grad():
        got = posenc.attention(q, k, v, branched(RoPE(D), "windowed_yarn", factor=1.0, window=3, training_length=8))
        want = posenc.attention(q, k, v, RoPE(D), backend="eager")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_a_cached_step_sees_what_the_full_pass_sees():
    q, k, v = qkv()
    encoding = branched(RoPE(D), "windowed_yarn", **PARAMS)
    positions = torch.arange(40)
    with torch.no_grad():
        full = posenc.attention(q, k, v, encoding)
        last = posenc.attention(q[:, :, 33:], k, v, encoding, q_positions=positions[33:], k_positions=positions)
    torch.testing.assert_close(last, full[:, :, 33:], atol=1e-12, rtol=0)


def test_refusals_name_the_argument():
    with pytest.raises(InvalidArgument, match="factor: windowed_yarn needs"):
        position_map("windowed_yarn")
    with pytest.raises(InvalidArgument, match="factor must be"):
        position_map("windowed_yarn", factor=0.5)
    with pytest.raises(InvalidArgument, match="window"):
        position_map("windowed_yarn", factor=2.0, window=0)
    with pytest.raises(InvalidArgument, match="beta_fast must be >= beta_slow"):
        position_map("windowed_yarn", factor=2.0, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(InvalidArgument, match="attention_factor"):
        position_map("windowed_yarn", factor=2.0, attention_factor=0.0)
    with pytest.raises(InvalidArgument, match="already has scaling"):
        branched(RoPE(D, scaling={"rope_type": "linear", "factor": 2.0}), "windowed_yarn", factor=2.0)


def test_defaults_and_the_length_rule():
    assert MAP_METHODS["windowed_yarn"].defaults(8192) == {
        "factor": None, "window": 7168, "training_length": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
        "attention_factor": None}
    assert method_defaults("windowed_yarn", {"max_position_embeddings": 8192})["window"] == 7 * 8192 // 8
    fit = fit_to_length("windowed_yarn", 12288, 8192)
    assert fit.factor is None and fit.params["factor"] == 1.5 and fit.params["window"] == 7168
    assert fit.params["training_length"] == 8192 and "N / L0" in fit.rule
    assert fit_to_length("windowed_yarn", 12288, 8192, {"window": 4096}).params["window"] == 4096
    with pytest.raises(InvalidArgument, match="short of the target length"):
        fit_to_length("windowed_yarn", 12288, 8192, {"factor": 1.25})


# -- in a Hugging Face model --------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def _llama(rope_parameters=None, attn="eager"):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                      rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": BASE})
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def _logits(model, x):
    with torch.no_grad():
        return model(x).logits


X = torch.randint(3, 64, (2, 40), generator=torch.Generator().manual_seed(1))
YARN = {"rope_type": "yarn", "rope_theta": BASE, "factor": 2.5, "original_max_position_embeddings": 16,
        "attention_factor": 1.0}


def _tolerance(rope_parameters=None) -> float:
    """4 x transformers' own float32 noise on these tokens: its eager vs sdpa attention."""
    noise = (_logits(_llama(rope_parameters, "eager"), X) - _logits(_llama(rope_parameters, "sdpa"), X)).abs().max()
    return max(1e-5, 4 * noise.item())


def test_in_llama_a_window_of_one_is_transformers_yarn():
    """d = 0 is the only near distance, its angle 0 in both: with attention factor 1 the map is YaRN."""
    from posenc.integrations.transformers import extend_context

    mapped = extend_context(_llama(), "windowed_yarn", 2.5, window=1, attention_factor=1.0)
    assert mapped.config.posenc_context_extension["params"]["factor"] == 2.5
    want, tol = _logits(_llama(YARN), X), _tolerance(YARN)
    assert (want - _logits(_llama(), X)).abs().max() > 100 * tol  # YaRN moves the logits
    assert (_logits(mapped, X) - want).abs().max() <= tol
    wider = extend_context(_llama(), "windowed_yarn", 2.5, window=2, attention_factor=1.0)
    assert (_logits(wider, X) - want).abs().max() > 100 * tol  # a wrong window is seen


def test_in_llama_inside_the_window_is_the_plain_model_and_target_length_fits(capsys):
    from posenc.integrations.transformers import extend_context

    mapped = extend_context(_llama(), "windowed_yarn", target_length=40, window=40)
    assert "windowed_yarn: factor=2.5, window=40" in capsys.readouterr().err
    assert (_logits(mapped, X) - _logits(_llama(), X)).abs().max() <= _tolerance()
    with pytest.raises(InvalidArgument, match="factor: windowed_yarn needs"):
        extend_context(_llama(), "windowed_yarn")
    with pytest.raises(InvalidArgument, match="takes no factor"):
        extend_context(_llama(), "self_extend", 2.0)


def test_saved_and_loaded_by_posenc_it_runs_the_same_map(tmp_path):
    from posenc.integrations.transformers import extend_context, from_pretrained

    mapped = extend_context(_llama(), "windowed_yarn", target_length=40, window=8)
    mapped.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert loaded.config.posenc_context_extension == mapped.config.posenc_context_extension
    torch.testing.assert_close(_logits(loaded, X), _logits(mapped, X), atol=0, rtol=0)
    assert (_logits(mapped, X) - _logits(_llama(), X)).abs().max() > 1e-2  # the map moved the logits
