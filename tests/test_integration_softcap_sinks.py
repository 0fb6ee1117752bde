"""Gemma 2's logit soft-capping and gpt-oss's attention sinks on posenc's attention route.

Every layer that is not on the table route runs :func:`posenc.attention` with the soft-cap
(``softcap=``, Gemma 2's ``attn_logit_softcapping``) and the sinks (``s_aux=``, gpt-oss's
``module.sinks``) that transformers hands the attention function. Tiny random models of
tests/test_integration_families.py (std 0.2, float32); the reference is the unmodified
transformers model (its own eager attention: transformers refuses sdpa for both families, so
the model has no eager-vs-sdpa noise to read, and the tolerance is float32's 1e-5 on logits of
size ~10, as for the other eager-only families there).

The route is forced with :class:`RotatingRoPE`, the model's own RoPE whose ``rotate`` is
overridden (to RoPE's own): it computes the same rotation, but is not taken as the model's
tables, so posenc's attention rotates q and k and computes the softmax.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_integration_families import build, own_plan, tokens

import posenc
from posenc.hf_config.plan import LayerPlan, PositionPlan
from posenc.integrations import attention_function
from posenc.integrations.transformers import use_encoding

TOLERANCE = 1e-5


class RotatingRoPE(posenc.RoPE):
    """The same rotation as :class:`posenc.RoPE`, through an overridden ``rotate``: the routes
    send it to posenc's attention instead of the model's tables."""

    def rotate(self, q, k, q_positions, k_positions):
        return super().rotate(q, k, q_positions, k_positions)


def _rotating(plan: PositionPlan) -> PositionPlan:
    def forced(encoding):
        return RotatingRoPE(**encoding.config()) if type(encoding) is posenc.RoPE else encoding
    return PositionPlan(tuple(LayerPlan(forced(layer.encoding), layer.span, layer.window, layer.layer_type,
                                        layer.sinks) for layer in plan))


#: family -> config overrides: Gemma 2 with a soft-cap that bites at these logit sizes (|logit|
#: up to ~20 with std-0.2 weights; 50, the released value, moves them by ~1e-2 only)
CASES = {"gemma2": {"attn_logit_softcapping": 5.0}, "gpt_oss": {}}


def _models(family):
    reference = build(family, **CASES[family])
    model = use_encoding(build(family, **CASES[family]), _rotating(own_plan(reference)))
    layers = model.model.layers
    assert all(attention_function.ENCODING_ATTR in layer.self_attn.__dict__ for layer in layers), "not forced"
    return reference, model


def _logits(model, x, **kwargs):
    with torch.no_grad():
        return model(x, **kwargs).logits


@pytest.mark.parametrize("family", list(CASES))
def test_posenc_route_keeps_softcap_and_sinks(family):
    reference, model = _models(family)
    x = tokens()
    difference = (_logits(model, x) - _logits(reference, x)).abs().max().item()
    assert difference <= TOLERANCE, f"{family}: {difference}"
    # left padding: the padded row's real tokens as the unmodified model computes them
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    padded = (_logits(model, x, attention_mask=mask) - _logits(reference, x, attention_mask=mask))[:, 5:]
    assert padded.abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("family", list(CASES))
def test_posenc_route_generates_the_models_tokens_with_the_cache(family):
    reference, model = _models(family)
    prompt = tokens()[:, :8]
    options = {"max_new_tokens": 8, "do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    got, expected = model.generate(prompt, use_cache=True, **options), reference.generate(prompt, **options)
    assert torch.equal(got.sequences, expected.sequences)
    assert (torch.stack(got.logits) - torch.stack(expected.logits)).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("family", list(CASES))
def test_dropping_softcap_or_sinks_moves_the_logits(family, monkeypatch):
    """The check above can fail: without the soft-cap (Gemma 2) or the sinks (gpt-oss) passed on,
    the posenc route is off by far more than the tolerance."""
    reference, model = _models(family)
    x = tokens()
    monkeypatch.setattr(attention_function, "_softcap_and_sinks", lambda kwargs: {})
    assert (_logits(model, x) - _logits(reference, x)).abs().max().item() > 100 * TOLERANCE


def test_encodings_the_tables_cannot_carry_now_run_on_softcap_and_sink_layers():
    """What was refused (a non-rotary encoding on a soft-capped or sink layer) runs, trains and
    generates with the cache as without it."""
    for family, name in (("gpt_oss", "alibi"), ("gemma2", "t5")):
        model = use_encoding(build(family), name)
        model.train()
        batch = tokens(batch=4, length=12, seed=3)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(3):
            loss = model(batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], (family, losses)
        model.eval()
        prompt = batch[:2, :6]
        cached = model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True)
        assert torch.equal(cached, model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False))
