"""The encoding protocol: the hooks through which position enters attention.

Every positional encoding in posenc is a ``torch.nn.Module`` subclass of
:class:`PositionalEncoding` and overrides one or more of four hooks (DESIGN.md), a fifth,
``mask``, for encodings that restrict which keys a query sees, and a sixth, ``gate``, for
encodings that read the hidden state:

========== ============================================== ===============================
hook       contract                                       used by
========== ============================================== ===============================
embed      x (B, T, d_model), positions -> x'             sinusoidal, learned
rotate     q (B, H, Tq, D), k (B, H, Tk, D) -> q', k'     rope, xpos; vo_rope also turns
           (and, with ``rotates_values``, v at the keys'  v and the output
           positions and the output back at the queries')
score_bias b(h, i, j) added to the logits, fp32           alibi, t5, kerple, fire
content    query-dependent terms on scores and values     shaw, transformer_xl, cope
mask       allowed(q_pos, k_pos) -> bool, and'ed in       irope (chunked attention)
gate       per-token values from the layer's input x      fox
           (B, T, d_model) -> (B, H, T), kept with the
           keys; a bias from them on the logits
========== ============================================== ===============================

The ``gate`` hook is the one that sees the hidden state: the model calls :meth:`gate` on
each layer's input, keeps its output per key in the KV cache like k and v, and passes every
key's values to :func:`posenc.attention` as ``gates=``; the attention turns them into a bias
with :meth:`prepare_gates` (once per call) and :meth:`gate_bias` (per tile).

The class attribute :attr:`PositionalEncoding.hooks` names the hooks an encoding uses, a set
of :class:`Hook` members checked when the class is defined (a misspelt hook is an error, not a
hook that silently never runs), so the attention and the model consume any encoding without
knowing its name: ``Hook.ROTATE in encoding.hooks``.

An encoding is built for a transformer by :meth:`PositionalEncoding.for_model` from the sizes it
declares in :attr:`PositionalEncoding.model_sizes`, and remembers the arguments its constructor
was given (:meth:`PositionalEncoding.config`), which a checkpoint stores as plain data
(:meth:`PositionalEncoding.options_for_model` gives the part that is not the model's sizes).

A score bias is stated as math only: :meth:`PositionalEncoding.bias`, an elementwise function
of (query position, key position, head), and :attr:`PositionalEncoding.translation_invariant`.
How it is evaluated (materialized, in tiles, as strided views, inside FlexAttention) is the
attention layer's decision (``posenc.attention.tiling``); :meth:`score_bias` and
:meth:`score_mod` are the two forms a user calls directly.

A positional mask is stated the same way: :meth:`PositionalEncoding.attention_mask`, an
elementwise boolean function of (query position, key position), True where the query may
attend the key. :func:`posenc.attention` ands it with the causal mask and the user's ``mask``
on every backend (evaluated on the position grid, or as the FlexAttention ``mask_mod`` of
:meth:`PositionalEncoding.mask_mod`: the attention layer's choice). Because it reads
positions, not token indices, a KV-cache step, left padding and packed rows (positions
restarting per document) get the same mask as the rows alone.

Positions are always explicit integer tensors, shape (T,) shared by the batch or (B, T) per
row: query positions and key positions are separate, which gives KV-cache offsets, left
padding and packed sequences to every encoding without a special case. An encoding whose
positions have several coordinates (M-RoPE's temporal, height, width; axial RoPE's grid axes)
states it with :attr:`PositionalEncoding.position_axes` and accepts them through
:meth:`PositionalEncoding.check_positions`, which :func:`posenc.attention` calls on the
positions it is given; its hooks then see them axis-first, (A, B, T), the sequence axis last
as everywhere else. One-coordinate positions (T,) or (B, T) stay valid for every encoding.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from posenc._validation import check_sequence_positions
from posenc.errors import InvalidArgument
from posenc.mask_rules import MaskMod, ScoreMod, position_at

if TYPE_CHECKING:
    from posenc.kernels.fused_bias import FusedBias


class Hook(str, Enum):
    """The places where position enters attention (the table of this module's docstring).

    A ``str`` enum: ``Hook.ROTATE == "rotate"`` and it prints as ``rotate``, so a set of hooks
    reads and sorts as their names; checks are written ``Hook.ROTATE in encoding.hooks``, where
    a misspelt member is an AttributeError rather than a check that is always False.
    """

    EMBED = "embed"
    ROTATE = "rotate"
    SCORE_BIAS = "score_bias"
    CONTENT = "content"
    MASK = "mask"
    GATE = "gate"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


#: The sizes of a transformer that :meth:`PositionalEncoding.for_model` receives, in its order.
MODEL_SIZES = ("d_model", "num_heads", "head_dim", "max_positions", "causal", "num_layers")


def hook_set(hooks: Iterable[Hook | str], owner: str = "hooks") -> frozenset[Hook]:
    """``hooks`` as a frozenset of :class:`Hook`; a string is accepted if it is a hook's value.

    Raises:
        InvalidArgument: ``hooks`` is a string or not iterable, or holds something that is not a
            hook (the message names ``owner`` and the allowed values).
    """
    allowed = ", ".join(repr(h.value) for h in Hook)
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Iterable):
        raise InvalidArgument(f"{owner} must be a set of posenc Hook members ({allowed}), got {hooks!r}")
    members = []
    for hook in hooks:
        try:
            members.append(Hook(hook))
        except ValueError:
            raise InvalidArgument(f"{owner}: unknown hook {hook!r}; allowed: {allowed}") from None
    return frozenset(members)


def _size_map(model_sizes: Sequence[str] | Mapping[str, str], owner: str) -> dict[str, str]:
    """``model_sizes`` as {constructor argument: model size}: a sequence names sizes the
    constructor spells as the model does; a mapping renames them.

    Raises:
        InvalidArgument: not a sequence or mapping of strings, or a size not in :data:`MODEL_SIZES`.
    """
    if isinstance(model_sizes, Mapping):
        pairs = dict(model_sizes)
    elif isinstance(model_sizes, Sequence) and not isinstance(model_sizes, (str, bytes)):
        pairs = {size: size for size in model_sizes}
    else:
        raise InvalidArgument(f"{owner} must be a tuple of model sizes or a mapping "
                              f"{{constructor argument: model size}}, got {model_sizes!r}")
    for argument, size in pairs.items():
        if not isinstance(argument, str) or size not in MODEL_SIZES:
            raise InvalidArgument(f"{owner}: {argument!r}: {size!r} is not a model size; allowed: {', '.join(MODEL_SIZES)}")
    return pairs


#: Where an encoding keeps what its constructor was given (an instance attribute).
_RECORD = "_constructor_arguments"


def _records_arguments(init: Callable) -> Callable:
    """Wrap an encoding's ``__init__`` so that the outermost call (the constructor of the
    instance's own class) records its arguments by name, defaults filled in, and which of them
    the caller gave: the encoding's constructor config (:meth:`PositionalEncoding.config`).
    Arguments gathered by ``**kwargs`` (passed on to a parent's constructor) are flattened in."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if type(self).__init__ is not __init__:  # a parent's constructor, called by super()
            return
        bound = signature.bind(self, *args, **kwargs)  # cannot fail: init accepted them
        given = set(_flat_arguments(signature, bound.arguments) or ())
        bound.apply_defaults()
        arguments = _flat_arguments(signature, bound.arguments)
        self.__dict__[_RECORD] = None if arguments is None else (copy.deepcopy(arguments), frozenset(given))

    return __init__


def _flat_arguments(signature: inspect.Signature, arguments: Mapping[str, Any]) -> dict | None:
    """Bound arguments as {name: value} without ``self``, ``**kwargs`` merged in; None when
    positional ``*args`` were given (they have no names to rebuild from)."""
    flat: dict[str, Any] = {}
    itself = next(iter(signature.parameters))
    for name, value in arguments.items():
        kind = signature.parameters[name].kind
        if name == itself:
            continue
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None
        elif kind is inspect.Parameter.VAR_KEYWORD:
            flat.update(value)
        else:
            flat[name] = value
    return flat


class PositionalEncoding(nn.Module):
    """Base class: every hook is the identity, so an encoding overrides only what it uses.

    Subclasses set :attr:`name` (the registry name), :attr:`hooks` and :attr:`model_sizes`,
    and override the matching methods. :attr:`max_positions` is the number of positions an
    encoding can represent (``None``: unbounded); the evaluation reports longer lengths as not
    applicable instead of calling it.

    Defining a subclass checks its :attr:`hooks` and :attr:`model_sizes` and makes its
    constructor record the arguments it is given (:meth:`config`).

    Raises:
        InvalidArgument: (when a subclass is defined) a hook that is not a :class:`Hook`, or a
            :attr:`model_sizes` entry that is not a model size (:data:`MODEL_SIZES`) or names
            no argument of the constructor; the message names the allowed values.
    """

    name: ClassVar[str] = ""
    #: The hooks this encoding uses; strings are accepted when the class is defined and turned
    #: into :class:`Hook` members.
    hooks: ClassVar[frozenset[Hook]] = frozenset()
    #: The model sizes the constructor takes, which :meth:`for_model` passes: a tuple of
    #: :data:`MODEL_SIZES` spelt as the constructor does (``("head_dim",)``), or a mapping
    #: {constructor argument: model size} for those it spells otherwise
    #: (``{"dim": "d_model", "num_positions": "max_positions"}``). Read as that mapping.
    model_sizes: ClassVar[Mapping[str, str]] = {}
    #: For a ``content`` encoding: whether :meth:`content_values` adds to the output (Shaw) or
    #: only :meth:`content_scores` is used (Transformer-XL), which backends without access to
    #: the probabilities can still serve.
    content_on_values: ClassVar[bool] = True
    #: For a ``content`` encoding: whether :meth:`content_scores` is a term of q.k, multiplied by
    #: the attention's scale with it (True: Shaw, Transformer-XL, CoPE, PaTH), or a bias added
    #: after the scale like a score bias (False: additive GRAPE's path integral, whose bias
    #: reads the hidden state and the positions together).
    content_scaled: ClassVar[bool] = True
    #: For a ``score_bias`` encoding: True when b(h, i, j) depends on the distance j - i only
    #: (ALiBi, T5, Kerple; not FIRE, whose normalizer reads the absolute query position).
    #: A statement about the math that the attention layer may rely on: it then evaluates
    #: :meth:`bias` once per distinct distance.
    translation_invariant: ClassVar[bool] = False
    #: For a ``rotate`` encoding: True when its attention is branch-merge attention (the
    #: training-free context extensions: Self-Extend, ReRoPE, DCA, ...): the keys split into
    #: branches, each rotated at its own positions (:meth:`attention_branches`), one attention
    #: per branch merged by log-sum-exp. :func:`posenc.attention` then calls
    #: :meth:`attention_branches` instead of :meth:`rotate`.
    branched: ClassVar[bool] = False
    #: For a ``rotate`` encoding: True when the values are rotated too, at their keys'
    #: positions (:meth:`rotate_values`), and the attention's output rotated back at its
    #: query's (:meth:`rotate_output`), so that each value contributes R(theta (j - i)) v_j:
    #: a relative position in the value path (DeepSeek-V4, whose keys are its values).
    #: :func:`posenc.attention` calls both around any backend.
    rotates_values: ClassVar[bool] = False
    #: True for an encoding defined for causal attention only (PaTH: its transforms run from
    #: the key to the query): :func:`posenc.attention` refuses ``causal=False`` for it.
    causal_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "hooks" in cls.__dict__:
            cls.hooks = hook_set(cls.hooks, owner=f"{cls.__name__}.hooks")
        if "__init__" in cls.__dict__:
            cls.__init__ = _records_arguments(cls.__init__)
        if "model_sizes" in cls.__dict__ or "__init__" in cls.__dict__:
            cls.model_sizes = _size_map(cls.model_sizes, f"{cls.__name__}.model_sizes")
            parameters = inspect.signature(cls.__init__).parameters
            # a base that leaves its constructor to subclasses (MultiAxisRoPE) is checked in them
            has_constructor = cls.__init__ is not PositionalEncoding.__init__
            if has_constructor and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                for argument in cls.model_sizes:
                    if argument not in parameters:
                        raise InvalidArgument(f"{cls.__name__}.model_sizes: {argument!r} is not an argument of "
                                              f"its constructor ({', '.join(list(parameters)[1:])})")

    @_records_arguments
    def __init__(self) -> None:
        super().__init__()

    @property
    def max_positions(self) -> int | None:
        return None

    @property
    def call_invariant(self) -> bool:
        """True when the hooks' terms for a (query position, key position) pair do not depend
        on the other positions of the call. A token's hidden states then never change once
        computed, so a KV cache of them is exact (:class:`posenc.lab.model.KVCache`). False for an
        encoding that reads the whole call, e.g. dynamic NTK RoPE in "rerotate" mode (every
        token rotated with the frequencies of the call's length)."""
        return True

    @classmethod
    def for_model(
        cls,
        *,
        d_model: int,
        num_heads: int,
        head_dim: int,
        max_positions: int,
        causal: bool = True,
        num_layers: int = 1,
        **kwargs,
    ) -> PositionalEncoding:
        """Build the encoding for a transformer of the given size.

        The model calls this for whatever encoding it is given: the constructor receives the
        sizes the class declares in :attr:`model_sizes` (``head_dim`` for RoPE, ``num_heads``
        for ALiBi, ``num_layers`` for per-layer parameters, ...), the options
        :meth:`model_defaults` derives from the sizes, and ``kwargs``, the user's own options
        (which win over those defaults).

        Raises:
            TypeError: an option that is one of the declared sizes, or that the constructor
                does not take. The constructor's own errors.
        """
        sizes = dict(d_model=d_model, num_heads=num_heads, head_dim=head_dim, max_positions=max_positions,
                     causal=causal, num_layers=num_layers)
        sized = {argument: sizes[size] for argument, size in cls.model_sizes.items()}
        return cls(**sized, **{**cls.model_defaults(sizes), **kwargs})

    @classmethod
    def model_defaults(cls, sizes: Mapping[str, Any]) -> dict:
        """Options that :meth:`for_model` derives from the model's ``sizes`` (the keyword
        arguments of :meth:`for_model`) unless the user gives them, e.g. ALiBi's
        ``bidirectional = not causal``. Default: none, ``{}``."""
        return {}

    def config(self) -> dict:
        """The arguments this encoding's constructor was called with, by name, defaults
        included: ``type(encoding)(**encoding.config())`` builds the same encoding (fresh
        parameters). A copy; the values are what the caller passed (plain data for every
        built-in encoding).

        Raises:
            InvalidArgument: the constructor was given positional ``*args``, which have no names.
        """
        record = self.__dict__.get(_RECORD)
        if record is None:
            raise InvalidArgument(f"{type(self).__name__} was built with positional *args: its constructor config has no names")
        return copy.deepcopy(record[0])

    def options_for_model(self, **sizes: Any) -> dict:
        """The options that rebuild this encoding with :meth:`for_model` for a model of
        ``sizes`` (:meth:`for_model`'s keyword arguments): :meth:`config` without the
        :attr:`model_sizes` arguments and the :meth:`model_defaults` that match the model's,
        and of the other arguments only those the caller gave (the rest are the defaults).

        Raises:
            InvalidArgument: the encoding was built with a size other than the model's (the
                message names it), or :meth:`config`'s error.
        """
        sizes = {"causal": True, "num_layers": 1, **sizes}  # for_model's defaults
        arguments = self.config()
        given = self.__dict__[_RECORD][1]
        for argument, size in self.model_sizes.items():
            if arguments[argument] != sizes[size]:
                raise InvalidArgument(f"{type(self).__name__} was built with {argument}={arguments[argument]!r}, "
                                      f"the model has {size}={sizes[size]!r}")
        derived = self.model_defaults(sizes)
        return {
            argument: value for argument, value in arguments.items()
            if argument not in self.model_sizes
            and (value != derived[argument] if argument in derived else argument in given)
        }

    @classmethod
    def options_for_train_len(cls, train_len: int) -> dict:
        """Options of this encoding to pass to :meth:`for_model` for a model trained on windows
        of ``train_len`` tokens (``posenc extrapolate`` does): settings a model card states in
        tokens of its own training context, which a much shorter one must scale (iRoPE's
        chunk size and temperature step, 8192 in Llama 4). Default: none, ``{}``."""
        return {}

    def for_layer(self, layer: int) -> PositionalEncoding:
        """The encoding that attention layer ``layer`` (0-based) uses; default: ``self``, one
        encoding for every layer.

        The one hook of a layer schedule (iRoPE: RoPE layers and NoPE layers; an encoding
        with per-layer parameters such as FoX's forget gates): the model asks each layer's
        encoding here and calls that one's hooks, never branching on names. The ``embed``
        hook is the top-level encoding's (it acts once, before the first layer); so are
        :attr:`max_positions` and :attr:`call_invariant`, which a schedule must state for
        all its layers. Sub-encodings returned here should be submodules of ``self`` so
        that their parameters are the model's.
        """
        return self

    @property
    def position_axes(self) -> int:
        """How many coordinates a position has: 1 (a token index) for every encoding but the
        multi-axis ones (3 for M-RoPE's temporal, height, width; 2 or 3 for axial RoPE).

        Multi-axis positions reach the hooks **axis-first**, an integer tensor (A, B, T) with B
        1 or the batch, the sequence axis last as in every other form (Hugging Face's Qwen2-VL
        ``position_ids`` layout); :meth:`check_positions` turns the forms a user may give into
        it. Such an encoding's hooks also take one-coordinate positions (T,) or (B, T), meaning
        every axis equal (how Qwen2-VL positions text), so the LM, the KV cache, packing and
        padding work unchanged. The attention backends read only the last axis (T) of
        positions they do not pass to a hook; a multi-axis encoding has no ``score_bias`` or
        ``content`` hook, whose tiling assumes (T,) or (B, T).
        """
        return 1

    def check_positions(self, positions: Tensor, *, length: int, batch: int, argname: str = "positions") -> Tensor:
        """The positions a user gave one attention call of ``length`` tokens and ``batch`` rows,
        checked and in the form this encoding's hooks take; :func:`posenc.attention` calls it
        on ``q_positions`` and ``k_positions`` (moving the result to q's device).

        Default: an integer tensor (T,) or (B, T), B in {1, batch}, of values >= 0, returned
        unchanged. A multi-axis encoding (:attr:`position_axes` > 1) overrides it to accept
        its own forms as well and return them axis-first (A, B, T). The values are read
        outside ``torch.compile`` only (its shapes and dtype always).

        Raises:
            TypeError: not an integer tensor.
            ValueError: a shape this encoding does not take (the message names ``argname``
                and the shapes allowed), or a negative entry.
        """
        return check_sequence_positions(positions, length=length, batch=batch, argname=argname)

    # -- hooks -----------------------------------------------------------------------------
    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (B, T, d_model), positions (T,) or (B, T) -> x with position added."""
        return x

    def rotate(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D), k (B, H, Tk, D) -> (q', k'), same shapes and dtypes."""
        return q, k

    def rotate_values(self, v: Tensor, k_positions: Tensor) -> Tensor:
        """v (B, H_kv, Tk, Dv) at its keys' positions -> v', same shape and dtype; called by
        :func:`posenc.attention` before the attention when :attr:`rotates_values`."""
        return v

    def rotate_output(self, out: Tensor, q_positions: Tensor) -> Tensor:
        """The attention's output (B, H, Tq, Dv) at its queries' positions -> out', same shape
        and dtype (the inverse of :meth:`rotate_values`' rotation at the query position);
        called by :func:`posenc.attention` after the attention when :attr:`rotates_values`."""
        return out

    def attention_branches(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> list[tuple[Tensor, Tensor, Callable[[Tensor, Tensor], Tensor]]] | None:
        """The branches of a :attr:`branched` encoding's attention, or None (the default).

        q (B, H, Tq, D), k (B, H_kv, Tk, D) unrotated, positions as :meth:`rotate` gets them ->
        one ``(q_b, k_b, allowed_b)`` per branch: q and k rotated (and q scaled, where the
        method scales it) at the branch's positions, and the keys the branch takes as an
        elementwise rule ``allowed_b(q_pos, k_pos) -> bool`` on broadcastable int64 positions
        (grids, or FlexAttention's 0-d tensors), causal on positions, disjoint across branches.
        :func:`posenc.attention` runs one attention per branch (its mask: the rule on the call's
        positions and'ed with the causal, user and positional masks) and merges them exactly
        by log-sum-exp (:mod:`posenc.attention.branches`)."""
        return None

    def branch_key_masks(self, q_positions: Tensor, k_positions: Tensor,
                         rules: list[Callable[[Tensor, Tensor], Tensor]]) -> list[Tensor]:
        """Each branch's key mask on the grid of the call's positions, for the backends that
        take a mask tensor: ``rules`` (the ``allowed_b`` of :meth:`attention_branches`, in
        order) evaluated on q_positions (Tq,) or (B, Tq) as a column and k_positions (Tk,) or
        (B, Tk) as a row -> bool (Tq, Tk) or (B, Tq, Tk) per branch. An encoding whose rules
        share their work (one position map gives every branch's mask at once) overrides it."""
        i, j = q_positions.unsqueeze(-1), k_positions.unsqueeze(-2)
        return [allowed(i, j) for allowed in rules]

    def bias(self, q_positions: Tensor, k_positions: Tensor, head: Tensor) -> Tensor | None:
        """The score bias b(h, i, j) as math: elementwise on broadcastable int64 tensors of query
        positions, key positions and head indices -> tensor of their broadcast shape, float32
        (float64 when the encoding's parameters are float64: ``encoding.double()``).

        The one definition of an encoding's bias: every backend derives its form from it (the
        attention layer calls it on position grids, on distinct distances, or per score inside
        FlexAttention, where the arguments are 0-d). It must return a new tensor (never a view
        of a stored one), and must not modify parameters: use :meth:`prepare_bias` for that.

        Returns None for an encoding without a score bias.

        Raises:
            NotImplementedError: the encoding declares the ``score_bias`` hook but no ``bias``.
        """
        if Hook.SCORE_BIAS in self.hooks:
            raise NotImplementedError(f"{type(self).__name__} has the score_bias hook but defines no bias()")
        return None

    def prepare_bias(self) -> None:
        """Called before :meth:`bias` is used: once per attention call, and by
        :meth:`score_bias` and :meth:`score_mod`. An encoding whose parameters are projected
        onto an allowed range before every use (Kerple, as its official code does) does it
        here. Default: nothing."""

    def score_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The bias materialized: (Tq,), (Tk,) -> (H, Tq, Tk); with a (B, T) side ->
        (B, H, Tq, Tk); float32, :meth:`bias` on every (head, query, key).

        Added after the 1/sqrt(D) scaling of q.k (ALiBi and T5 are not scaled). Returns a new
        tensor that nothing else references (the caller may keep or modify it), or None for
        an encoding without a score bias.
        """
        return None

    def score_mod(self, q_positions: Tensor | None = None, k_positions: Tensor | None = None) -> ScoreMod | None:
        """The bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx) -> score``, or None
        for an encoding without a score bias.

        Without positions, token indices are the positions (q_idx, kv_idx). With positions of
        shape (T,) or (B, T) they are looked up, e.g. for a KV-cache offset or packed rows.
        Learned biases receive gradients through it.
        """
        if Hook.SCORE_BIAS not in self.hooks:
            return None
        self.prepare_bias()

        def score_mod(score, b, h, q_idx, kv_idx):
            # FlexAttention passes int32 indices; bias() gets int64 like every other caller.
            return score + self.bias(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx), h.long())

        return score_mod

    def linear_bias_slopes(self, causal: bool = True) -> Tensor | None:
        """The slopes m (H,) float32 when the score bias is b(h, i, j) = -m_h * |i - j| on every
        pair a query can see (causal: keys at or before the query; else all keys), i.e. ALiBi's
        form; None for any other bias (default). A statement about the math that lets a kernel
        with a native linear bias serve the encoding (FlashAttention-2's ``alibi_slopes``)."""
        return None

    def fused_bias(self, causal: bool = True, gate_state: object = None) -> FusedBias | None:
        """The bias (score bias or gate bias) as a :class:`posenc.kernels.fused_bias.FusedBias`:
        a form the fused attention kernel computes in registers from a few tensors per head
        (ALiBi's slopes, Kerple's p and a, T5's buckets, FIRE's MLP, FoX's cumulative gates), with gradients
        to them; None (default) when the encoding's bias has no such form for this call.
        ``gate_state``: :meth:`prepare_gates`'s result for a ``gate`` encoding. A statement
        about the math, like :meth:`linear_bias_slopes`; tested against :meth:`bias` and
        :meth:`gate_bias` (tests/test_bias_attention_triton.py)."""
        return None

    def attention_mask(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The ``mask`` hook as math: elementwise on broadcastable int64 tensors of query and key
        positions -> a bool tensor of their broadcast shape, True where the query may attend the
        key (0-d tensors inside FlexAttention). Returns None for an encoding without the hook.

        :func:`posenc.attention` ands it with the causal mask and the user's ``mask`` on every
        backend: evaluated on the (Tq, Tk) grid of the call's positions ((B, Tq, Tk) for (B, T)
        positions), or per score through :meth:`mask_mod`. It must
        depend on positions only (not on token indices), so that a KV-cache step, left padding
        and packed rows see what the rows alone see. A query that it (with the other masks)
        leaves without any key gets an output of zeros, as for ``mask=``.

        Raises:
            NotImplementedError: the encoding declares the ``mask`` hook but no ``attention_mask``.
        """
        if Hook.MASK in self.hooks:
            raise NotImplementedError(f"{type(self).__name__} has the mask hook but defines no attention_mask()")
        return None

    def mask_mod(self, q_positions: Tensor | None = None, k_positions: Tensor | None = None) -> MaskMod | None:
        """The ``mask`` hook as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``, or None
        for an encoding without it. Without positions the token indices are the positions; with
        positions of shape (T,) or (B, T) they are looked up (as :meth:`score_mod` does)."""
        if Hook.MASK not in self.hooks:
            return None

        def mask_mod(b, h, q_idx, kv_idx):
            return self.attention_mask(position_at(q_positions, b, q_idx), position_at(k_positions, b, kv_idx))

        return mask_mod

    def content_scores(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, *, mask: Tensor | None = None,
        gate_state: object = None,
    ) -> Tensor | None:
        """Query-dependent extra logits (B, H, Tq, Tk), added to q.k *before* the 1/sqrt(D) scale
        (after it, unscaled, for an encoding with ``content_scaled = False``).

        ``mask``: which keys each query may attend, boolean, broadcastable to (B, H, Tq, Tk)
        (the causal mask and the user's ``mask=`` combined), or None when every key is
        visible. Only an encoding whose terms depend on the other visible keys reads it
        (CoPE counts them); masked entries of the result are never used. ``gate_state``: for
        an encoding with the ``gate`` hook too, :meth:`prepare_gates` of every key's gates
        (PaTH's w and beta), else None.
        """
        return None

    def content_values(self, probs: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Extra attention output (B, H, Tq, D) from the attention probabilities (B, H, Tq, Tk)."""
        return None

    def content_attention(
        self, q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor, k_positions: Tensor, *, causal: bool,
        scale: float,
    ) -> Tensor | None:
        """Optional, for a ``content`` encoding: the whole attention of one call, its content terms
        included, from a fused computation, or None (the default) where it has none for the call.

        softmax(scale (q.k^T + :meth:`content_scores`) + causal mask) @ v + :meth:`content_values`:
        q (B, H, Tq, D), k and v (B, H, Tk, D) (one key head per query head), positions as the
        hooks get them, ``causal`` the bottom-right causal mask (no other mask, bias, gate or
        dropout: the attention layer asks only then). Returns (B, H, Tq, D) in the accumulation
        dtype (float32, float64), with autograd. The attention layer asks first and computes the
        scores itself on None; an implementation returns None for whatever it does not cover
        (under ``torch.compile``, other positions or dtypes, its kernel not built), so the
        result never depends on whether it ran beyond rounding. Shaw and Transformer-XL: the
        fused CPU kernel (:mod:`posenc.kernels.relpos_cpu`), float32, when built.
        """
        return None

    @property
    def gate_features(self) -> int | None:
        """For a ``gate`` encoding: None when :meth:`gate` gives one value per token and head,
        (B, H, T) (FoX), else the size F of its trailing axis, (B, H, T, F) (PaTH: w and beta)."""
        return None

    def gate(self, x: Tensor) -> Tensor | None:
        """The ``gate`` hook: per-token values from the layer's input (its hidden state).

        x (B, T, d_model), the input of the attention layer (after its normalization) ->
        (B, H, T), one value per token and query head, float32 (float64 when x or the
        parameters are float64); (B, H, T, F) for an encoding with :attr:`gate_features` F. The model calls it on every attention call and keeps the
        result with the keys (the KV cache stores it like k and v); :func:`posenc.attention`
        receives every key's values as ``gates=`` (B, H, Tk). FoX returns log f_t here.
        Returns None for an encoding without the hook.
        """
        return None

    def prepare_gates(self, gates: Tensor) -> object:
        """Called once per attention call on the gates of every key, (B, H, Tk), in key order:
        whatever :meth:`gate_bias` needs, computed in O(B H Tk) (FoX: the cumulative sum of
        log f). The attention layer passes the result back untouched. Default: the gates."""
        return gates

    def gate_bias(self, state: object, q_index: Tensor, k_index: Tensor, *, causal: bool) -> Tensor | None:
        """The bias from the gates on a tile of the logits: (B, H, len(q_index), len(k_index)),
        float32 (float64 for float64 gates), added after the 1/sqrt(D) scale like a score bias.

        ``state``: :meth:`prepare_gates`'s result. ``q_index`` (Tq',) int64: the key index of
        each query row's own token (queries are the last keys: row r is key r + Tk - Tq);
        ``k_index`` (Tk',) int64: key indices. Positions are not passed: a gate bias is a
        function of the tokens between i and j in key order, which a KV cache, packed rows
        (a document mask) and left padding keep intact. ``causal``: only keys at or before
        the query are used; the others may hold any value (the attention masks them).
        May be called on one tile of queries at a time, so that memory can stay O(T).

        Raises:
            NotImplementedError: the encoding declares the ``gate`` hook but no ``gate_bias``.
        """
        if Hook.GATE in self.hooks:
            raise NotImplementedError(f"{type(self).__name__} has the gate hook but defines no gate_bias()")
        return None

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def gate_input(x: Tensor, d_model: int, weight: Tensor) -> tuple[Tensor, torch.dtype]:
    """The ``gate`` hook's input checked and widened: x (B, T, d_model) in the wider of its dtype
    and the gate projection's ``weight`` (bfloat16 activations, float32 weights: float32), and
    the dtype the gate's values are computed in (float32, or float64 for float64 x and weights).

    Raises:
        InvalidArgument: x is not a tensor of shape (B, T, d_model).
    """
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != d_model:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise InvalidArgument(f"x must have shape (B, T, d_model={d_model}), got {shape}")
    x = x.to(torch.promote_types(x.dtype, weight.dtype))
    return x, torch.promote_types(x.dtype, torch.float32)


def sum_dtype(values: Tensor) -> torch.dtype:
    """The dtype of a running sum over the keys of per-token values (FoX's log forget gates,
    contextual GRAPE's phases, additive GRAPE's path terms): float64, whose sums of thousands
    of terms stay exact to float32; float32 on MPS, which has no float64."""
    return torch.float32 if values.device.type == "mps" else torch.float64


def layer_of_copies(first: PositionalEncoding, deeper: Sequence[PositionalEncoding], layer: int) -> PositionalEncoding:
    """:meth:`PositionalEncoding.for_layer` of an encoding with its own parameters per layer:
    layer 0 is ``first``, layer l > 0 is ``deeper[l - 1]``; with no deeper copies every layer
    shares ``first`` (any layer index).

    Raises:
        ValueError: deeper copies exist and ``layer`` is outside 0..len(deeper).
    """
    if not deeper:
        return first
    if not isinstance(layer, int) or not 0 <= layer <= len(deeper):
        raise InvalidArgument(f"layer must be in 0..{len(deeper)}, got {layer!r}")
    return first if layer == 0 else deeper[layer - 1]


def per_batch_index(index: Tensor) -> Tensor:
    """(Tq, Tk) -> (1, 1, Tq, Tk); (B, Tq, Tk) -> (B, 1, Tq, Tk): broadcastable over heads."""
    return index.unsqueeze(0).unsqueeze(0) if index.dim() == 2 else index.unsqueeze(1)


def arange_start(positions: Tensor) -> int | None:
    """p0 when ``positions`` is a 1-D run of consecutive integers p0, p0 + 1, ... (the layout in
    which relative distances are a shift of the indices), else None. Reads the values: not for
    code traced by ``torch.compile``."""
    if positions.dim() != 1 or positions.numel() == 0:
        return None
    if positions.numel() > 1 and not bool((positions.diff() == 1).all()):
        return None
    return int(positions[0])


def bias_kernel_attention(
    self: PositionalEncoding, q: Tensor, k: Tensor, v: Tensor, *, q_positions: Tensor, k_positions: Tensor,
    causal: bool, mask: Tensor | None, scale: float, gate_state: object = None,
) -> Tensor | None:
    """``fused_attention`` for an encoding whose bias has a :meth:`PositionalEncoding.fused_bias`
    form the fused CPU kernel takes (T5's buckets, ALiBi's and Kerple's functions of the
    distance, FoX's gates; :func:`posenc.kernels.relpos_cpu.bias_arguments`): the whole attention,
    softmax(scale q.k^T + b + causal mask) v, in the kernel's one pass per (batch, head) and
    its one backward, **with autograd** to q, k, v and the bias's parameters (or the gates), in
    O(T) memory and without the bias's autograd per tile. Assigned as a method
    (``fused_attention = bias_kernel_attention``).

    q (B, H, Tq, D), k and v (B, H_kv, Tk, D) (H_kv < H: repeated per group, O(T) more memory),
    float32 CPU tensors, positions 1-D runs of consecutive integers. Returns (B, H, Tq, D)
    float32, or None where the kernel does not serve the call and the caller runs its own path:
    the kernel switched off or not built (:func:`posenc.kernels.relpos_cpu.serves`), under
    ``torch.compile``, a ``mask``, other positions, dtypes or devices, no fused form (FoX
    bidirectional, ALiBi with ``slope_dtype``). Its backward has no derivative of its own."""
    from posenc.kernels import relpos_cpu

    if mask is not None or torch.compiler.is_compiling() or not relpos_cpu.serves(q, k, v):
        return None
    bias = self.fused_bias(causal, gate_state)
    q_start, k_start = arange_start(q_positions), arange_start(k_positions)
    if bias is None or q_start is None or k_start is None or q.shape[1] % k.shape[1]:
        return None
    args = relpos_cpu.bias_arguments(bias, q_start=q_start, k_start=k_start, num_queries=q.shape[2],
                                     num_keys=k.shape[2])
    if args is None or any(isinstance(t, Tensor) and (t.dtype != q.dtype or t.device != q.device)
                           for t in args.values()):
        return None
    per_head = args.get("bias_table", args.get("slopes"))
    if per_head is not None and per_head.shape[0] != q.shape[1]:
        return None
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return relpos_cpu.attention(q, k, v, **args, causal=causal, scale=scale)
