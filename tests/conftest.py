import os

import pytest
import torch

# Two cores on CI: keep torch from oversubscribing when pytest-xdist is not used.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_encoding(name: str, *, d_model: int = 32, num_heads: int = 4, max_positions: int = 256, causal: bool = True):
    """Every registered encoding sized for a small transformer, via the model's own factory."""
    import posenc

    enc = posenc.create_for_model(
        name, d_model=d_model, num_heads=num_heads, head_dim=d_model // num_heads, max_positions=max_positions, causal=causal
    )
    # Learned tables start near zero; randomize them so tests see a real positional signal.
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    return enc.double()
