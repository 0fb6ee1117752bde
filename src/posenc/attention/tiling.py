"""How the attention layer evaluates a score bias: the encoding states b(h, i, j), this
module decides where and in what shape it is computed.

An encoding gives only its math (:meth:`~posenc.PositionalEncoding.bias`, elementwise on
(query position, key position, head), and ``translation_invariant``). From it:

- :func:`bias_tile` evaluates b over a grid of query and key positions. A translation-invariant
  bias is evaluated once per distinct distance j - i and laid out from those values: for
  consecutive positions it is a Toeplitz matrix, and with the queries in descending order a
  Hankel one, ``values.unfold(-1, Tk, 1)``, a strided view of its Tq + Tk - 1 values (no
  (H, Tq, Tk) memory); for other positions the distinct distances are gathered.
- :func:`query_blocks` cuts a causal attention into query blocks, each with its own bias tile
  (memory O(T), not O(T^2)), skips the keys wholly in a block's future, folds the causal mask
  into the tile as -inf, and asks for descending queries where that makes the tile a view.
- :func:`gate_tile` evaluates a ``gate`` encoding's bias (FoX) on a block of query rows from
  the state :meth:`~posenc.PositionalEncoding.prepare_gates` made once per call; it is added
  to the score bias tile, if any, and is always per batch row.

The tensors returned here are this module's: an encoding's result is never written into.
Shapes: H heads, Tq queries, Tk keys, B batch rows of (B, T) positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from posenc.encodings.base import Hook, PositionalEncoding
from posenc._validation import broadcast_shape
from posenc.attention.masks import as_4d, causal_mask, finite_in

#: Query blocks are sized so that one bias tile, B_bias * H * block * Tk, holds at most this
#: many float32 entries (16 MiB): memory stays O(T), not O(T^2).
BLOCKED_TILE_ELEMENTS = 1 << 22

#: Query rows per block once the bias tiles are strided views costing no memory (a
#: translation-invariant bias with the causal mask folded in): few enough that the future
#: keys computed and masked inside a block's diagonal stay a small fraction (rows / T),
#: enough that per-call overhead is amortized (chosen by timing: docs/results.md,
#: "Measurements behind the code").
BLOCKED_VIEW_ROWS = 256


def run_step(positions: Tensor) -> int | None:
    """+1 for a 1-D run p0, p0 + 1, ..., -1 for p0, p0 - 1, ..., else None (padding, packing,
    gaps, per-batch positions, no position). A single position counts as ascending."""
    if positions.dim() != 1 or positions.numel() == 0:
        return None
    if positions.numel() == 1:
        return 1
    step = positions.diff()
    first = int(step[0])
    return first if first in (1, -1) and bool((step == first).all()) else None


def queries_are_last_keys(q_positions: Tensor, k_positions: Tensor) -> bool:
    """True when the positional causal mask (key position <= query position) is the index one
    (j <= i + Tk - Tq): 1-D positions, keys strictly increasing, and the queries' positions
    those of the last Tq keys (default positions, a KV cache)."""
    if q_positions.dim() != 1 or k_positions.dim() != 1:
        return False
    num_queries, num_keys = q_positions.shape[0], k_positions.shape[0]
    if num_keys > 1 and not bool((k_positions.diff() > 0).all()):
        return False
    return bool(torch.equal(q_positions, k_positions[num_keys - num_queries:]))


def _grid(q_positions: Tensor, k_positions: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """(..., 1, Tq, 1) queries, (..., 1, 1, Tk) keys, (H, 1, 1) heads: broadcast to (..., H, Tq, Tk)."""
    q = q_positions.unsqueeze(-1).unsqueeze(-3)
    k = k_positions.unsqueeze(-2).unsqueeze(-3)
    head = torch.arange(num_heads, device=q_positions.device).view(-1, 1, 1)
    return q, k, head


def _over_distances(encoding: PositionalEncoding, low: int, count: int, num_heads: int, device,
                    causal: bool) -> tuple[Tensor, Tensor]:
    """(distances (N,), values (H, N)): b at key - query = low, low + 1, ..., causal -inf on d > 0."""
    distances = torch.arange(low, low + count, device=device)
    head = torch.arange(num_heads, device=device).unsqueeze(-1)
    values = encoding.bias(torch.zeros_like(distances), distances, head).expand(num_heads, count)
    if causal:
        values = values.masked_fill(distances > 0, float("-inf"))
    return distances, values


def bias_tile(encoding: PositionalEncoding, q_positions: Tensor, k_positions: Tensor, num_heads: int, *,
              causal: bool = False, buffer: Tensor | None = None) -> tuple[Tensor, bool]:
    """b(h, i, j) for every query and key position, float32: (Tq,), (Tk,) -> (H, Tq, Tk); with a
    (B, T) side -> (B, H, Tq, Tk). ``causal=True`` folds the causal mask in: -inf where the key
    position is after the query position.

    Returns ``(tile, owned)``. ``owned``: the tile is a dense tensor made here, which the caller
    may write into; otherwise it is read-only (a strided view that overlaps itself, or the
    encoding's own result). A translation-invariant bias of consecutive positions comes from
    its Tq + Tk - 1 distinct values, as a view for descending queries (q, q - 1, ...), copied
    row by row for ascending ones; of other positions, from the distinct distances between
    the extreme positions, gathered, when they are fewer than the entries. Any other bias is
    :meth:`~posenc.PositionalEncoding.bias` on the grid; with ``causal`` it is copied (into
    ``buffer``, a flat float32 tensor at least the tile's size, when given and outside
    autograd) and the -inf written into the copy.
    """
    if encoding.translation_invariant and not torch.compiler.is_compiling():
        # the strided and gathered layouts are chosen from the positions' values: under
        # torch.compile the elementwise grid below keeps one graph for every call
        q_step = run_step(q_positions)
        if q_step is not None and run_step(k_positions) == 1:
            return _toeplitz(encoding, q_positions, k_positions, num_heads, causal=causal, descending=q_step == -1)
        gathered = _gathered(encoding, q_positions, k_positions, num_heads, causal=causal)
        if gathered is not None:
            return gathered, True
    q, k, head = _grid(q_positions, k_positions, num_heads)
    shape = broadcast_shape(q.shape, k.shape, head.shape)
    written = None
    into = getattr(encoding, "bias_into", None)  # an encoding that can write its tile where we say
    if (causal and into is not None and buffer is not None and buffer.numel() >= shape.numel()
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling()):
        written = into(q, k, head, buffer[:shape.numel()].view(shape))
    tile = written if written is not None else encoding.bias(q, k, head)
    if not causal:
        return tile, False
    if (torch.is_grad_enabled() and tile.requires_grad) or torch.compiler.is_compiling():
        return tile.masked_fill(k > q, float("-inf")), True
    # The encoding's tensor is not ours to write: copy it, then mask only the columns some
    # query may not see (the block's diagonal slab when the queries are the last keys).
    reusable = buffer is not None and buffer.numel() >= shape.numel() and buffer.dtype == tile.dtype
    if written is not None:
        owned = written
    elif reusable and not torch.is_grad_enabled():  # autograd may keep the previous tile: no reuse there
        owned = buffer[:shape.numel()].view(shape).copy_(tile)
    else:
        owned = tile.expand(shape).clone(memory_format=torch.contiguous_format)
    first = 0 if torch.compiler.is_compiling() else first_future_key(q_positions, k_positions)
    owned[..., first:].masked_fill_(k[..., first:] > q, float("-inf"))
    return owned, True


def first_future_key(q_positions: Tensor, k_positions: Tensor) -> int:
    """The first key index that may be after some query (0 unless the keys are a 1-D
    consecutive run): only columns from there on can need the causal -inf."""
    if q_positions.dim() != 1 or run_step(k_positions) != 1 or q_positions.numel() == 0:
        return 0
    return min(k_positions.numel(), max(0, int(q_positions.min()) - int(k_positions[0]) + 1))


def _toeplitz(encoding, q_positions, k_positions, num_heads, *, causal, descending) -> tuple[Tensor, bool]:
    """Row r of ``values.unfold`` holds the distances of the r-th largest query position: the
    answer itself for descending queries (Hankel strides (1, 1), a view), its row reversal for
    ascending ones."""
    num_queries, num_keys = q_positions.shape[-1], k_positions.shape[-1]
    low = int(k_positions[0]) - int(q_positions.max())
    _, values = _over_distances(encoding, low, num_queries + num_keys - 1, num_heads, q_positions.device, causal)
    rows = values.unfold(-1, num_keys, 1)  # (H, Tq, Tk), descending queries
    if descending or num_queries == 1:
        return rows, False
    if torch.is_grad_enabled() and values.requires_grad:
        return rows.flip(-2).contiguous(), True  # one differentiable op
    # Row by row, each a contiguous slice: torch.flip's strided gather is several times slower.
    out = values.new_empty(num_heads, num_queries, num_keys)
    for i in range(num_queries):
        out[:, i] = rows[:, num_queries - 1 - i]
    return out, True


def _gathered(encoding, q_positions, k_positions, num_heads, *, causal) -> Tensor | None:
    """A translation-invariant bias of any positions from its values over the distances
    between the extreme positions, or None when those outnumber the entries (far-apart
    positions: a key at 0 and a query at a million) or there are none."""
    q, k, head = _grid(q_positions, k_positions, num_heads)
    relative = k - q  # (..., 1, Tq, Tk)
    if relative.numel() == 0:
        return None
    low = int(k_positions.min()) - int(q_positions.max())
    count = int(k_positions.max()) - int(q_positions.min()) - low + 1
    if count > relative.numel():
        return None
    _, values = _over_distances(encoding, low, count, num_heads, q_positions.device, causal)
    shape = relative.shape[:-3] + (num_heads,) + relative.shape[-2:]
    per_entry = values[:, None, None, :].expand(*shape, count)  # a view: (..., N) per entry
    index = (relative - low).expand(shape).unsqueeze(-1)
    return per_entry.gather(-1, index).squeeze(-1)


def dense_bias(encoding: PositionalEncoding | None, q_positions: Tensor, k_positions: Tensor, *, num_heads: int,
               batch: int) -> Tensor | None:
    """The whole bias for the backends that take it materialized (eager, sdpa): (H, Tq, Tk),
    or (B, H, Tq, Tk) for (B, T) positions, read-only; None without a ``score_bias`` hook."""
    if encoding is None or Hook.SCORE_BIAS not in encoding.hooks:
        return None
    bias, _ = bias_tile(encoding, q_positions, k_positions, num_heads)
    if bias.dim() == 4 and bias.shape[0] == 1 and batch != 1:
        bias = bias.expand(batch, -1, -1, -1)
    return bias


def gate_tile(encoding: PositionalEncoding, gate_state: object, start: int, stop: int, num_queries: int,
              num_keys: int, *, causal: bool, device: torch.device, key_end: int | None = None) -> Tensor:
    """The gate bias of query rows start:stop against keys 0 .. key_end - 1 (default: all):
    (B, H, rows, key_end). Query row r is the token of key r + Tk - Tq (the queries are the
    last keys)."""
    offset = num_keys - num_queries
    q_index = torch.arange(start + offset, stop + offset, device=device)
    k_index = torch.arange(num_keys if key_end is None else key_end, device=device)
    return encoding.gate_bias(gate_state, q_index, k_index, causal=causal)


def dense_gate_bias(encoding: PositionalEncoding | None, gate_state: object, num_queries: int, num_keys: int, *,
                    causal: bool, device: torch.device) -> Tensor | None:
    """The whole gate bias (B, H, Tq, Tk) for the backends that take it materialized (eager,
    sdpa), or None without a gate state."""
    if gate_state is None:
        return None
    return gate_tile(encoding, gate_state, 0, num_queries, num_queries, num_keys, causal=causal, device=device)


class Block(NamedTuple):
    """Query rows ``start:stop`` attend keys ``:key_end`` with ``mask`` (a 4-D float or boolean
    SDPA mask, or None). ``descending``: the mask's rows are for the block's queries in reverse
    order, so the block's rows of q go in flipped and its output comes out flipped."""

    start: int
    stop: int
    key_end: int
    descending: bool
    mask: Tensor | None


def query_blocks(encoding: PositionalEncoding | None, q_positions: Tensor, k_positions: Tensor, *, num_heads: int,
                 batch: int, causal: bool, mask: Tensor | None, dtype: torch.dtype,
                 gated: PositionalEncoding | None = None, gate_state: object = None) -> Iterator[Block]:
    """The query blocks of one attention call, each with its SDPA mask: the bias tile of the
    encoding (None: no bias) on that block's positions, plus the gate bias of ``gated`` (its
    ``gate_state``; None: no gate bias) on that block's rows, plus the causal or user mask.

    Under a causal mask a block's queries see only keys ``< block end + Tk - Tq``: later key
    blocks are skipped. When the queries are the last keys (default positions, a KV cache) the
    causal mask is folded into the tile as -inf, and the block's queries go in descending order
    for a translation-invariant bias: its tile is then a strided view of Tq + Tk - 1 values and
    blocks grow to ``BLOCKED_VIEW_ROWS``. Otherwise the block's diagonal slab gets the -inf mask.
    ``mask`` (4-D boolean, the causal mask already in it) is sliced per block.

    One tile is alive at a time as long as the caller drops each block before asking for the next.
    """
    num_queries, num_keys = q_positions.shape[-1], k_positions.shape[-1]
    offset = num_keys - num_queries
    has_gate = gated is not None and gate_state is not None
    bias_rows = batch if (q_positions.dim() == 2 or k_positions.dim() == 2 or has_gate) else 1
    has_bias = encoding is not None
    # Under torch.compile the layout is decided from shapes only (folding and descending
    # views read the positions' values): plain tiles, the causal mask per block.
    compiling = torch.compiler.is_compiling()
    fold = has_bias and causal and mask is None and not compiling and queries_are_last_keys(q_positions, k_positions)
    descending = (has_bias and encoding.translation_invariant and mask is None and q_positions.dim() == 1
                  and (fold or not causal) and not compiling and not has_gate)
    # A materialized tile the causal mask is folded into is the encoding's result copied into
    # a buffer of ours: two tiles alive at once, so each gets half the budget (not when the
    # encoding writes its tile into the buffer itself: bias_into, outside autograd).
    writes_into = hasattr(encoding, "bias_into") and not torch.is_grad_enabled()
    copied = fold and not encoding.translation_invariant
    budget = BLOCKED_TILE_ELEMENTS // (2 if copied and not writes_into else 1)
    # at least 2 rows, so that a strided (overlapping) tile can show itself: see _is_compact
    block = min(num_queries, max(2, budget // max(1, bias_rows * num_heads * num_keys)))
    buffer = None
    if copied:
        buffer = torch.empty(bias_rows * num_heads * block * num_keys, device=q_positions.device)
    start = 0
    while start < num_queries:
        stop = min(num_queries, start + block)
        key_end = stop + offset if causal else num_keys
        q_pos = q_positions[..., start:stop]
        tile, owned = None, False
        if has_bias:
            tile, owned = bias_tile(encoding, q_pos.flip(-1) if descending else q_pos, k_positions[..., :key_end],
                                    num_heads, causal=fold, buffer=buffer)
        if has_gate:
            gates = gate_tile(gated, gate_state, start, stop, num_queries, num_keys, causal=causal,
                              device=q_positions.device, key_end=key_end)
            tile, owned = (gates if tile is None else tile + gates), True
        block_mask = _block_mask(tile, owned, start, stop, key_end, causal=causal and not fold, user_mask=mask,
                                 dtype=dtype, device=q_positions.device)
        if tile is not None and not compiling and _is_compact(block_mask):
            block = max(block, BLOCKED_VIEW_ROWS)  # the tile costs no memory: fewer, larger calls
        del tile  # before the next block's tile is made
        yield Block(start, stop, key_end, descending, block_mask)
        del block_mask
        start = stop


def _block_mask(tile, owned, start, stop, key_end, *, causal, user_mask, dtype, device) -> Tensor | None:
    """The SDPA mask of query rows start:stop from their bias tile (or None): user mask or
    causal -inf added, finite in ``dtype``, 4-D."""
    if user_mask is not None:
        allowed = (user_mask if user_mask.shape[-2] == 1 else user_mask[..., start:stop, :])[..., :key_end]
        if tile is None:
            return allowed
        return as_4d(finite_in(tile, dtype).masked_fill(~allowed, float("-inf")).to(dtype))
    if tile is None:
        return causal_mask(stop - start, key_end, device) if causal else None
    clamped = finite_in(tile, dtype)
    owned = owned or clamped is not tile
    if causal:
        clamped = _mask_future(clamped, stop - start, key_end, in_place=owned)
    return as_4d(clamped.to(dtype))


def _is_compact(tile: Tensor) -> bool:
    """A tile held in less memory than its size: its entries overlap (a strided view of the
    distinct values of a Toeplitz bias) or broadcast, so more rows cost no more memory."""
    return tile.untyped_storage().nbytes() < tile.numel() * tile.element_size()


def _mask_future(tile: Tensor, rows: int, key_end: int, *, in_place: bool) -> Tensor:
    """-inf on a block's future keys (bottom-right alignment): only the last ``rows`` keys.
    In place into a tile of this module's outside autograd; otherwise out of place."""
    first = key_end - rows  # keys before ``first`` are visible to every query of the block
    future = torch.arange(rows, device=tile.device) > torch.arange(rows, device=tile.device).unsqueeze(-1)
    if in_place and tile.shape[-2:] == (rows, key_end) and not (torch.is_grad_enabled() and tile.requires_grad):
        tile[..., first:].masked_fill_(future, float("-inf"))
        return tile
    full = torch.zeros(rows, key_end, dtype=torch.bool, device=tile.device)
    full[:, first:] = future
    return tile.masked_fill(full, float("-inf"))
