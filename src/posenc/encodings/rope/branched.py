"""RoPE whose attention is branch-merge attention: the training-free context extensions
(StreamingLLM, Self-Extend, ReRoPE, Leaky ReRoPE, LM-Infinite, DCA, STRING, windowed YaRN) as an encoding.

:class:`BranchedRoPE` wraps a :class:`~posenc.encodings.rope.RoPE` and one position map of
:mod:`posenc.position_maps`; it states its attention through the encoding protocol
(:attr:`~posenc.PositionalEncoding.branched` and
:meth:`~posenc.PositionalEncoding.attention_branches`), so :func:`posenc.attention` runs the
map at the call's positions on every backend that takes RoPE (eager, sdpa, blocked, flex) and
the lab model runs it with its KV cache (keys cached unrotated, positions explicit: a cached
step sees what the full pass sees), without either naming the method.

Built from (rope, method, parameters) by :func:`branched`, the one constructor the comparisons
use; not in the encoding registry (a registry row is trained from scratch by ``posenc
extrapolate``, and these are training-free changes of a trained RoPE model's attention).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from posenc.encodings.base import Hook, PositionalEncoding
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument, InvalidType
from posenc.position_maps import MAP_METHODS, position_map

__all__ = ["BranchedRoPE", "branched"]


class BranchedRoPE(PositionalEncoding):
    """RoPE with branch-merge attention by one position map (:data:`posenc.position_maps.MAP_METHODS`).

    Args:
        head_dim: D, even.
        method: a key of :data:`~posenc.position_maps.MAP_METHODS`, whose record states the
            method's map, its parameters (``MAP_METHODS[method].parameters``) and the
            reference's defaults.
        rope: the RoPE whose rotation each branch applies: a RoPE instance (head_dim must be
            ``head_dim``), or a mapping of RoPE's options (``{"base": 500000.0}``), or None
            (``RoPE(head_dim)``).
        **params: the method's parameters, named as its reference code names them (defaults:
            the reference's; :func:`posenc.position_maps.position_map`).

    The hook is ``rotate`` (``Hook.ROTATE``), evaluated per branch: :attr:`branched` is True,
    so :func:`posenc.attention` calls :meth:`attention_branches` instead of :meth:`rotate`.
    Each branch rotates q and k by the RoPE at the branch's positions; the queries are first
    multiplied by the map's query scale (ReRoPE's and Leaky ReRoPE's log-n scaling, 1 up to
    the training length) and their rotary dimensions by its logit factor (STRING's attention
    factor squared, 1.1386 by default; the reference multiplies cos and sin by 0.1 ln 2 + 1). Leaky ReRoPE's positions are in
    units of 1 / scaling_factor: its branches use the RoPE linearly scaled by scaling_factor
    (a ``rope`` with its own ``scaling`` is refused for it). A branch with a scaling of its own
    (the map's ``branch_scalings``: windowed_yarn's far branch, YaRN) rotates with ``rope``'s
    geometry and that scaling (also refused on a scaled ``rope``).

    Inside the map's window (every distance below it, and below ReRoPE's training length) the
    attention is plain RoPE's: bit for bit but for Leaky ReRoPE (float rounding of s i theta/s)
    and STRING (its logit factor).

    Raises:
        InvalidArgument: an unknown method or parameter (the message lists the allowed), a bad
            parameter value (the map's check), a RoPE of another head_dim, Leaky ReRoPE on a
            scaled RoPE. InvalidType: ``rope`` neither a RoPE, a mapping nor None.
    """

    name = "branched_rope"
    hooks = frozenset({Hook.ROTATE})
    model_sizes = ("head_dim",)
    branched = True

    def __init__(self, head_dim: int, method: str, *, rope: RoPE | Mapping[str, Any] | None = None, **params) -> None:
        super().__init__()
        self.map = position_map(method, **params)
        self.method = method
        if rope is None or isinstance(rope, Mapping):
            rope = RoPE(head_dim, **dict(rope or {}))
        elif not isinstance(rope, RoPE):
            raise InvalidType(f"rope must be a posenc RoPE, a mapping of RoPE options or None, got {type(rope).__name__}")
        if rope.head_dim != head_dim:
            raise InvalidArgument(f"rope has head_dim={rope.head_dim}, the encoding head_dim={head_dim}")
        self.rope = rope
        self.head_dim = head_dim
        self._rotary = self._branch_rope(rope, self.map.frequency_divisor)
        # a ModuleDict (keys: branch indices as str), so that .to(device) moves their tables
        self._branch_rotary = nn.ModuleDict({
            str(index): self._scaled_rope(rope, scaling, f"{method} rotates branch {index} with "
                                                         f"{scaling['rope_type']} scaling of the plain frequencies")
            for index, scaling in self.map.branch_scalings.items()})

    @staticmethod
    def _branch_rope(rope: RoPE, divisor: int) -> RoPE:
        """The RoPE the branches rotate with: ``rope`` itself, or for positions in units of
        1/divisor (Leaky ReRoPE) the same RoPE linearly scaled by divisor (frequencies / divisor)."""
        if divisor == 1:
            return rope
        return BranchedRoPE._scaled_rope(rope, {"rope_type": "linear", "factor": float(divisor)},
                                         f"leaky_rerope rotates with RoPE linearly scaled by scaling_factor={divisor}")

    @staticmethod
    def _scaled_rope(rope: RoPE, scaling: dict, what: str) -> RoPE:
        """``rope``'s geometry with ``scaling`` (Leaky ReRoPE's linear one, windowed_yarn's far
        YaRN); refused, saying ``what`` needs it, on a RoPE already scaled (a scaling of a
        scaling is not defined)."""
        if rope.scaling is not None:
            raise InvalidArgument(f"{what}; the rope already has scaling {rope.scaling!r}")
        return type(rope)(**{**rope.config(), "scaling": dict(scaling)})

    @property
    def call_invariant(self) -> bool:
        """The RoPE's: every map is a function of (query position, key position) alone."""
        return self.rope.call_invariant

    def rotate(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """Plain RoPE at the given positions (the wrapped RoPE's :meth:`~RoPE.rotate`); the
        attention uses :meth:`attention_branches` instead."""
        return self.rope.rotate(q, k, q_positions, k_positions)

    def scale_queries(self, q: Tensor, q_positions: Tensor) -> Tensor:
        """q times the map's query scale at q_positions (cast to q's dtype first, as the
        reference casts ReRoPE's scale), and its rotary part (the first ``rotary_dim``
        dimensions) times the map's logit factor: STRING's reference multiplies the cos and sin
        tables, which reach the rotary dimensions only (a partial RoPE: Phi-3, GPT-NeoX); q
        itself when both are 1 (no scale)."""
        scale = self.map.query_scale_at(q_positions)
        if scale is not None:
            scale = scale.to(q.dtype)
            q = q * (scale.unsqueeze(-1) if scale.dim() == 1 else scale.unsqueeze(1).unsqueeze(-1))  # (Tq, 1) / (B, 1, Tq, 1)
        factor = self.map.logit_factor
        if factor == 1.0:
            return q
        width = self.rope.rotary_dim
        if width == q.shape[-1]:
            return q * factor
        return torch.cat((q[..., :width] * factor, q[..., width:]), dim=-1)

    def attention_branches(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor):
        """Per branch: (q, k) rotated at the branch's positions (q scaled first:
        :meth:`scale_queries`) and its key rule; :meth:`PositionalEncoding.attention_branches`."""
        q = self.scale_queries(q, q_positions)
        out = []
        for index, (q_pos, k_pos) in enumerate(self.map.branch_positions(q_positions, k_positions)):
            q_rot, k_rot = self._rotary_of(index).rotate(q, k, q_pos, k_pos)
            out.append((q_rot, k_rot, self.map.key_rule(index)))
        return out

    def _rotary_of(self, index: int) -> RoPE:
        """The RoPE branch ``index`` rotates with: its own scaling's, else the map's one."""
        key = str(index)
        return self._branch_rotary[key] if key in self._branch_rotary else self._rotary  # noqa: SIM401 (a ModuleDict has no get)

    def branch_key_masks(self, q_positions: Tensor, k_positions: Tensor, rules) -> list[Tensor]:
        """Every branch's key mask from one evaluation of the map (each ``key_rule`` alone
        would evaluate all of them: a (Tq, Tk) int64 distance grid per branch per layer)."""
        i, j = q_positions.unsqueeze(-1), k_positions.unsqueeze(-2)
        return [branch.key_mask for branch in self.map.rules(i, j)]

    def extra_repr(self) -> str:
        return f"method={self.method!r}, map={self.map!r}"


def branched(rope: RoPE | None, method: str, **params) -> BranchedRoPE:
    """``rope`` with ``method``'s branch-merge attention: the one construction of the
    training-free extensions, e.g. ``branched(RoPE(64), "self_extend", group_size=8,
    neighbor_window=1024)``; ``rope`` None is ``RoPE(64)``-like plain RoPE of head_dim given as
    ``head_dim=`` in params. Methods and parameters: :data:`posenc.position_maps.METHODS`,
    :class:`BranchedRoPE`.

    Raises:
        InvalidArgument / InvalidType: as :class:`BranchedRoPE`; rope None without head_dim.
    """
    if rope is None:
        if "head_dim" not in params:
            raise InvalidArgument("branched: give a RoPE, or rope=None with head_dim=")
        head_dim = params.pop("head_dim")
        return BranchedRoPE(head_dim, method, **params)
    if not isinstance(rope, RoPE):
        raise InvalidType(f"rope must be a posenc RoPE, got {type(rope).__name__}")
    return BranchedRoPE(rope.head_dim, method, rope=rope, **params)


#: The method names :func:`branched` takes (those of :data:`posenc.position_maps.MAP_METHODS`).
BRANCHED_METHODS = tuple(MAP_METHODS)
