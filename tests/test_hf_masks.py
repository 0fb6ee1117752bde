"""posenc.integrations.hf_masks: transformers' masks <-> posenc's booleans, against transformers'
own mask builders (the boolean sdpa mask and the additive eager mask of the same inputs)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.integrations.hf_masks import additive_mask, boolean_mask


def _padding():
    return torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]).bool()


def test_boolean_mask_reads_transformers_additive_mask_as_its_boolean_one():
    from transformers.masking_utils import eager_mask, sdpa_mask

    padding = _padding()
    allowed = sdpa_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=padding,
                        allow_is_causal_skip=False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        additive = eager_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=padding,
                              dtype=dtype)
        assert additive.dtype == dtype and not bool((additive == 0).all())
        assert torch.equal(boolean_mask(additive), allowed)
    # a bias folded into the allowed entries (Falcon's ALiBi) stays allowed
    biased = torch.where(allowed, -torch.rand(allowed.shape) * 30, torch.finfo(torch.float32).min)
    assert torch.equal(boolean_mask(biased), allowed)
    assert boolean_mask(allowed) is allowed
    assert torch.equal(boolean_mask(~allowed, true_masks=True), allowed)  # MPT: True = masked
    assert boolean_mask(None) is None


def test_additive_mask_is_transformers_eager_mask():
    from transformers.masking_utils import eager_mask, sdpa_mask

    padding = _padding()
    # four queries, the last of six keys (a cache)
    allowed = sdpa_mask(batch_size=2, q_length=4, q_offset=2, kv_length=6, attention_mask=padding,
                        allow_is_causal_skip=False)
    expected = eager_mask(batch_size=2, q_length=4, q_offset=2, kv_length=6, attention_mask=padding,
                          dtype=torch.float16)
    query, key = torch.zeros(2, 1, 4, 8, dtype=torch.float16), torch.zeros(2, 1, 6, 8, dtype=torch.float16)
    assert torch.equal(additive_mask(allowed, query, key, causal=True), expected)
    # None: plain causal, the queries the last keys (what sdpa_mask leaves to SDPA's is_causal)
    causal = eager_mask(batch_size=1, q_length=4, q_offset=2, kv_length=6, dtype=torch.float16)
    assert torch.equal(additive_mask(None, query, key, causal=True), causal)
    assert additive_mask(None, query, key, causal=False) is None
    assert additive_mask(expected, query, key, causal=True) is expected
