"""Pieces of the float64 loop references that the attention tests write out one query at a time."""

import math

import torch


def dot(a, b) -> float:
    """sum_d a_d b_d in Python floats (float64)."""
    return sum(float(x) * float(y) for x, y in zip(a, b))


def softmax_average(logits, values) -> torch.Tensor:
    """sum_j softmax(logits)_j values[j] in float64: one query's attention output over its
    visible keys (``logits`` and ``values`` in the same key order; values are 1-D tensors)."""
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return sum((w / total) * value.double() for w, value in zip(weights, values))
