"""What an encoding hands the fused attention kernel (:mod:`posenc.attention.bias_attention_triton`):
the form of its bias and the few tensors it is computed from. Torch only: encodings import it
without Triton.

====================== ================================================ ==========================
form                   bias b(h, i, j), d = q_pos - k_pos                tensors
====================== ================================================ ==========================
``linear``             -m_h d (``symmetric``: -m_h |d|)                  slopes (H,): ALiBi
``kerple_log``         -p_h log(1 + a_h |d|)                             p, a (H,)
``kerple_power``       -a_h |d|^p_h                                      p, a (H,)
``buckets``            W[bucket_map[clamp(-d, -R, R) + R], h]            weight (num_buckets, H),
                                                                         bucket_map (2R + 1,) int
``gate``               c_i - c_j (key indices; c = hi + lo)              hi, lo (B, H, Tk): FoX
``log_distance_mlp``   f(x)_h, x = psi(d) / (psi(max(i, L)) + eps),      w1, b1 (U,), w2 (H, U),
                       psi(z) = log(|c z| + 1), f = w2 relu(w1 x + b1)   b2 (H,), c, threshold L
                       + b2, i the query position                        (1,): FIRE
====================== ================================================ ==========================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from posenc.errors import InvalidArgument

#: The bias forms, by name (the kernel numbers them itself: its ``KINDS``).
FORMS = {"none": 0, "linear": 1, "kerple_log": 2, "kerple_power": 3, "buckets": 4, "gate": 5, "log_distance_mlp": 6}


@dataclass(frozen=True)
class FusedBias:
    """A bias the fused kernel computes in registers: ``form`` (a key of :data:`FORMS`) and its
    tensors by the names of this module's table; ``radius`` is R of ``buckets``, ``eps`` FIRE's. Gradients flow
    to every floating tensor but ``lo`` (FoX's low-order part, which carries none)."""

    form: str
    tensors: dict = field(default_factory=dict)
    symmetric: bool = False
    radius: int = 0
    eps: float = 0.0

    def __post_init__(self):
        if self.form not in FORMS:
            raise InvalidArgument(f"form must be one of {sorted(FORMS)}, got {self.form!r}")


def relu_pieces(w1: Tensor, b1: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The pieces of a one-input ReLU layer relu(w1 x + b1) (FIRE's MLP): unit u bends at
    x = -b1_u / w1_u, so between consecutive sorted bends the same units are on.

    w1, b1 (U,). Returns ``(bends (S - 1,), on (S, U), rising (S - 1,))``, without autograd: the
    sorted bends (float64) of the units with w1_u != 0; per segment s (x with s bends <= x) 1.0
    for the units on there, read at a point inside it (float64); and per bend whether its unit
    turns on there going up (w1_u > 0). At a bend itself the unit is off (relu'(0) = 0): the
    segment below a rising unit's bend, above a falling one's."""
    with torch.no_grad():
        w1, b1 = w1.detach().double(), b1.detach().double()
        bends, order = torch.sort(-b1[w1 != 0] / w1[w1 != 0])
        if bends.numel():
            inside = torch.cat((bends[:1] - 1, (bends[:-1] + bends[1:]) / 2, bends[-1:] + 1))
        else:
            inside = torch.zeros(1, dtype=torch.float64, device=w1.device)
        return bends, (inside.unsqueeze(-1) * w1 + b1 > 0).double(), w1[w1 != 0][order] > 0
