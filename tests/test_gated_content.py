"""What the encodings with a gate and a content term share (PaTH, additive GRAPE, contextual
GRAPE): the backends that take content terms serve them and the others refuse by name; their
float32 error is plain attention's while one token's gate changed is far above it; gradients of
q, k, v and the gates against finite differences (float64). Each
encoding's own reference checks are in its test file (tests/test_path.py,
tests/test_grape_additive.py, tests/test_grape_contextual.py), whose inputs these reuse."""

import pytest
import test_grape_additive
import test_grape_contextual
import test_path
import torch

import posenc
from posenc.errors import InvalidArgument


def _flip_beta(gates):
    gates[:, :, 300, -1] = 2 - gates[:, :, 300, -1]  # PaTH: one token's beta


def _negate_p(gates):
    gates[:, :, 300] = -gates[:, :, 300]  # additive GRAPE: one token's p


def _advance_phase(gates):
    gates[:, :, 300] += 1.0  # contextual GRAPE: one token's phase increment


#: name -> (the test file's inputs: (encoding, x, q, k, v), a wrong gate written in place)
CASES = {
    "path": (test_path._inputs, _flip_beta),
    "grape_additive": (test_grape_additive._inputs, _negate_p),
    "grape_contextual": (test_grape_contextual._inputs, _advance_phase),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_noise_is_small_and_a_wrong_gate_is_not(name):
    """float32 against float64 at 512 tokens stays at plain attention's noise (PaTH: 2e-7 on
    the output at 64-2048 tokens); one token's gate changed moves the output by 1e3 x that."""
    inputs, spoil = CASES[name]
    enc, x, q, k, v = inputs(batch=1, heads=2, length=512, seed=1)
    gates = enc.gate(x)
    ref = posenc.attention(q, k, v, enc, gates=gates)
    out = posenc.attention(q.float(), k.float(), v.float(), enc.float(), gates=gates.float())
    assert (out.double() - ref).abs().max() < 1e-5
    wrong = gates.detach().clone()
    spoil(wrong)
    assert (posenc.attention(q, k, v, enc.double(), gates=wrong) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_serves_it_and_the_others_refuse(name):
    inputs, _ = CASES[name]
    enc, x, q, k, v = inputs(length=7)
    gates = enc.gate(x)
    eager = posenc.attention(q, k, v, enc, gates=gates, backend="eager")
    assert (posenc.attention(q, k, v, enc, gates=gates, backend="sdpa") - eager).abs().max() < 1e-12
    for backend in ("blocked", "flex"):
        with pytest.raises(InvalidArgument, match="content"):
            posenc.attention(q, k, v, enc, gates=gates, backend=backend)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_against_finite_differences(name):
    inputs, _ = CASES[name]
    enc, x, q, k, v = inputs(batch=1, heads=2, length=6)
    gates = enc.gate(x).detach()
    tensors = tuple(t.clone().requires_grad_() for t in (q, k, v, gates))
    assert torch.autograd.gradcheck(lambda q, k, v, g: posenc.attention(q, k, v, enc, gates=g), tensors)
