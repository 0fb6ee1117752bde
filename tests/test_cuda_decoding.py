"""On a CUDA device (skipped without one): KV-cache decoding of every encoding, on each backend
it runs on, equals the full forward pass, and greedy generation with the cache equals the
argmax of full passes (tests/test_positions_contract.py and tests/test_generate.py check the
same on the CPU)."""

from __future__ import annotations

import pytest
import torch
from test_generate import greedy_without_cache
from test_positions_contract import NAMES, backends_for, decode_with_cache, tiny_lm


if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

DEVICE = torch.device("cuda")
# float32 on CUDA: a one-row query and the full pass reduce in different orders (cuBLAS picks
# its split by shape; SDPA's kernels tile by length), about 1e-6 at these sizes; TF32 is off
# (torch's default for float32 matmul), so 1e-4 is two orders above that noise and far below
# the O(1) change of a position read wrongly (weights std 0.3, tiny_lm).
TOL = {"atol": 1e-4, "rtol": 1e-4}
CASES = [(name, backend) for name in NAMES for backend in [*backends_for(name), "auto"]]


@pytest.mark.parametrize("name, backend", CASES)
def test_cached_decoding_equals_the_full_pass_on_cuda(name, backend):
    torch.manual_seed(0)
    model = tiny_lm(name, backend).to(DEVICE)
    tokens = torch.randint(0, 256, (2, 20), device=DEVICE)
    with torch.no_grad():
        full = model(tokens)
        stepped = decode_with_cache(model, tokens, 3)
    torch.testing.assert_close(stepped, full, **TOL)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generate_on_cuda_equals_argmax_of_full_passes(name):
    torch.manual_seed(0)
    model = tiny_lm(name).to(DEVICE)
    prompt = torch.randint(0, 256, (2, 5), device=DEVICE)
    with torch.no_grad():
        expected = greedy_without_cache(model, prompt, 12)
    assert torch.equal(model.generate(prompt, 12), expected)
