"""The rope_type table (posenc.encodings.rope.scaling.ROPE_TYPES): every record is complete and
keeps its contracts, and RoPE follows the record, so a new rope_type needs no change to RoPE."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from rope_reference import ref_default

import posenc
from posenc.encodings.rope import scaling as rope_scaling
from posenc.encodings.rope.scaling import (
    LENGTH_DEPENDENT,
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    RopeType,
    compute_rope_parameters,
    extension_methods,
)
from posenc.rope import EXTENSION_METHODS, extension_scaling, from_hf_config

from rope_reference import L0, SAMPLES  # noqa: E402  (one valid dict per rope_type)

LENGTHS = [None, 1, L0 - 1, L0, L0 + 1, 3 * L0]


def f64(scaling, seq_len):
    return compute_rope_parameters(8, 10000.0, scaling, seq_len, dtype=torch.float64)


def test_every_rope_type_has_a_sample_and_a_complete_record():
    assert set(SAMPLES) == set(ROPE_TYPES)
    for name, record in ROPE_TYPES.items():
        assert isinstance(record, RopeType), name
        assert callable(record.inv_freq) and (record.of_length is None or callable(record.of_length)), name
        assert record.length_dependent is (record.of_length is not None), name
        assert record.hf_factor_from_context is None or callable(record.hf_factor_from_context), name
        assert record.extension is None or all(isinstance(k, str) for k in record.extension), name
        inv_freq, attention_factor = record.inv_freq(8, 10000.0, SAMPLES[name] or {}, None)
        assert inv_freq.dtype == torch.float64 and inv_freq.shape == (4,), name
        assert isinstance(attention_factor, float) and attention_factor > 0, name


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_frequencies_at_each_position_are_those_at_length_p_plus_one(name):
    """What RoPE's "frozen" mode rotates position p with: of_length(p + 1) for a length-dependent
    type, the one static inv_freq otherwise; either way inv_freq's frequencies at length p + 1."""
    record, scaling = ROPE_TYPES[name], SAMPLES[name]
    lengths = torch.arange(1, 3 * L0 + 1, dtype=torch.float64)
    if record.of_length is None:
        table = f64(scaling, None)[0].expand(len(lengths), -1)
    else:
        table = record.of_length(8, 10000.0, scaling)(lengths)
    assert table.shape == (3 * L0, 4) and table.dtype == torch.float64
    for p in range(3 * L0):
        torch.testing.assert_close(table[p], f64(scaling, p + 1)[0], rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", sorted(LENGTH_DEPENDENT))
def test_of_length_gives_the_frequencies_of_each_length(name):
    """RoPE computes a length-dependent type's frequencies from the record's of_length (tensor
    ops, any shape of lengths); they must be those of inv_freq at each length."""
    of_length = ROPE_TYPES[name].of_length(8, 10000.0, SAMPLES[name])
    lengths = [n for n in LENGTHS if n is not None] + [2**31]
    table = of_length(torch.tensor(lengths, dtype=torch.float64))
    assert table.shape == (len(lengths), 4) and table.dtype == torch.float64
    for row, n in enumerate(lengths):
        torch.testing.assert_close(table[row], f64(SAMPLES[name], n)[0], rtol=1e-15, atol=0)
    assert of_length(torch.tensor([[1.0, 3.0 * L0]], dtype=torch.float64)).shape == (1, 2, 4)


def test_derived_views_follow_the_table():
    assert list(ROPE_INIT_FUNCTIONS) == list(ROPE_TYPES)
    assert all(ROPE_INIT_FUNCTIONS[name] is record.inv_freq for name, record in ROPE_TYPES.items())
    assert set(LENGTH_DEPENDENT) == {name for name, record in ROPE_TYPES.items() if record.length_dependent}
    assert LENGTH_DEPENDENT == {"dynamic", "dynamic_yarn", "longrope"} and "linear" not in LENGTH_DEPENDENT
    assert EXTENSION_METHODS == extension_methods() == ("linear", "ntk", "dynamic", "yarn", "dynamic_yarn", "llama3",
                                                        "yarn_log", "theta_scale", "telechat3_yarn")
    with pytest.raises(TypeError):
        ROPE_INIT_FUNCTIONS["x"] = rope_scaling._default


@pytest.mark.parametrize("name", EXTENSION_METHODS)
def test_extension_scaling_is_the_record_defaults(name):
    record = ROPE_TYPES[name]
    scaling = extension_scaling(name, 2.0, L0)
    context = {"original_max_position_embeddings": L0} if record.needs_context else {}
    assert scaling == {"rope_type": name, "factor": 2.0, **context, **record.extension}
    f64(scaling, None)  # a valid dict


def test_no_rope_type_names_compared_outside_the_table():
    pattern = re.compile(r'rope_type(_of\([^)]*\))? ==|== "(longrope|dynamic|llama3|yarn|linear|ntk)"')
    src = Path(posenc.__file__).parent
    hits = [f"{path}:{n}" for path in src.rglob("*.py") for n, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


# -- a toy rope_type, registered for one test ------------------------------------------------------------
def _toy(dim, base, scaling, seq_len):
    """theta within L0; theta / factor past it; attention factor 1.25."""
    context_length = scaling["original_max_position_embeddings"]
    theta = rope_scaling.default_inv_freq_f64(dim, base)
    if seq_len is not None and seq_len > context_length:
        theta = theta / scaling["factor"]
    return theta, 1.25


def _toy_of_length(dim, base, scaling):
    context_length = scaling["original_max_position_embeddings"]
    theta = rope_scaling.default_inv_freq_f64(dim, base)

    def of_length(lengths):
        past = (lengths > context_length).unsqueeze(-1)
        return torch.where(past, theta.to(lengths.device) / scaling["factor"], theta.to(lengths.device))

    return of_length


TOY = RopeType(_toy, of_length=_toy_of_length, needs_context=True, extension={})


def toy_rotation(x, positions, length_of):
    """x (T, 8) float64, half-split, position t rotated with the toy's frequencies at length_of(t)."""
    out = torch.empty_like(x)
    for t, p in enumerate(positions):
        factor = 2.0 if length_of(t) > 6 else 1.0
        for i, theta in enumerate(ref_default(8, 10000.0)):
            c, s = math.cos(p * theta / factor) * 1.25, math.sin(p * theta / factor) * 1.25
            x1, x2 = float(x[t, i]), float(x[t, i + 4])
            out[t, i], out[t, i + 4] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def test_a_toy_rope_type_works_end_to_end_from_its_record_alone(monkeypatch):
    monkeypatch.setitem(ROPE_TYPES, "toy", TOY)
    scaling = {"rope_type": "toy", "factor": 2.0, "original_max_position_embeddings": 6}
    assert "toy" in LENGTH_DEPENDENT and ROPE_INIT_FUNCTIONS["toy"] is _toy and "toy" in extension_methods()
    assert extension_scaling("toy", 2.0, 6) == scaling
    inv_freq, attention_factor = posenc.rope_frequencies(8, scaling=scaling, seq_len=7)
    torch.testing.assert_close(inv_freq.double(), torch.tensor(ref_default(8, 10000.0), dtype=torch.float64) / 2, rtol=1.2e-7, atol=0)
    assert attention_factor == 1.25

    torch.manual_seed(0)
    x = torch.randn(1, 1, 10, 8, dtype=torch.float64)
    rope = posenc.RoPE(8, scaling=scaling)
    assert rope.length_dependent and not rope.call_invariant
    q, k = rope.rotate(x, x, torch.arange(10), torch.arange(10))  # length 10 > 6: halved everywhere
    want = toy_rotation(x[0, 0], range(10), lambda t: 10)
    torch.testing.assert_close(q[0, 0], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k[0, 0], want, rtol=1e-12, atol=1e-12)
    short, _ = rope.rotate(x[:, :, :5], x[:, :, :5], torch.arange(5), torch.arange(5))  # within L0
    torch.testing.assert_close(short[0, 0], toy_rotation(x[0, 0, :5], range(5), lambda t: 5), rtol=1e-12, atol=1e-12)

    frozen = posenc.RoPE(8, scaling=scaling, dynamic_cache="frozen")
    assert frozen.call_invariant
    q, _ = frozen.rotate(x, x, torch.arange(10), torch.arange(10))  # position p at length p + 1
    torch.testing.assert_close(q[0, 0], toy_rotation(x[0, 0], range(10), lambda t: t + 1), rtol=1e-12, atol=1e-12)

    config = {"head_dim": 8, "max_position_embeddings": 6, "rope_scaling": {"rope_type": "toy", "factor": 2.0}}
    assert from_hf_config(config).scaling == scaling  # L0 filled in from the config: needs_context

    monkeypatch.undo()
    assert "toy" not in LENGTH_DEPENDENT
    with pytest.raises(ValueError, match="unknown rope_type 'toy'"):
        posenc.RoPE(8, scaling=scaling)
