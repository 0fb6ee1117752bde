"""The bad-input matrix (docs/errors.md): every public constructor, function and CLI command,
each invalid argument -> an error of the documented type whose message names the argument
(and, where there is a list, the allowed values). The CLI prints one line and exits 2."""

import math
import os

import pytest
import torch

import posenc
import posenc.lab.evaluate
import posenc.masks
import posenc.rope
from posenc.lab.cli import main
from posenc.lab.data import CorpusError, load_corpus
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, preset_config
from posenc.lab.model import LMConfig, TransformerLM
from posenc.lab.train import TrainConfig

NAN, INF = float("nan"), float("inf")


def qkv(b=1, h=2, tq=3, tk=3, d=8, dtype=torch.float32):
    return torch.randn(b, h, tq, d, dtype=dtype), torch.randn(b, h, tk, d, dtype=dtype), torch.randn(b, h, tk, d, dtype=dtype)


def attn(**kwargs):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v)
    args.update(kwargs)
    return lambda: posenc.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


SIZES_BAD = [(0, ValueError), (-2, ValueError), (8.0, ValueError), (True, ValueError), ("8", ValueError)]

# (id, call, exception type, regex the message must match)
CASES = [
    # -- posenc.create / create_for_model: names ------------------------------------------
    ("create unknown name", lambda: posenc.create("rotary"), ValueError, r"unknown encoding 'rotary'; available: nope, "),
    ("create name not str", lambda: posenc.create(3), ValueError, r"unknown encoding 3; available"),
    ("create unexpected kwarg", lambda: posenc.create("alibi", num_heads=4, heads=2), TypeError, r"heads"),
    ("create missing kwarg", lambda: posenc.create("rope"), TypeError, r"head_dim"),
    ("create nope kwarg", lambda: posenc.create("nope", dim=4), TypeError, r"dim"),
    ("create_for_model unknown", lambda: posenc.create_for_model("x", d_model=8, num_heads=2, head_dim=4, max_positions=8),
     ValueError, r"unknown encoding 'x'"),
    ("create_for_model bad head_dim", lambda: posenc.create_for_model("rope", d_model=8, num_heads=2, head_dim=3, max_positions=8),
     ValueError, r"head_dim must be a positive even integer, got 3"),
    ("create_for_model bad max_positions", lambda: posenc.create_for_model("learned", d_model=8, num_heads=2, head_dim=4, max_positions=0),
     ValueError, r"num_positions must be an integer >= 1"),
    # -- sinusoidal ------------------------------------------------------------------------
    *[(f"sinusoidal dim={v!r}", (lambda v=v: posenc.create("sinusoidal", dim=v)), ValueError, r"dim must be a positive even integer")
      for v in (0, 7, 8.0, True, "8")],
    *[(f"sinusoidal base={v!r}", (lambda v=v: posenc.create("sinusoidal", dim=8, base=v)), ValueError, r"base must be a finite number > 1")
      for v in (1.0, NAN, INF, "1e4", True)],
    ("sinusoidal layout", lambda: posenc.create("sinusoidal", dim=8, layout="cat"), ValueError, r"layout must be one of \('interleaved', 'concat'\)"),
    ("sinusoidal embed width", lambda: posenc.create("sinusoidal", dim=8).embed(torch.zeros(1, 2, 6), torch.arange(2)),
     ValueError, r"x must have last dimension dim=8"),
    ("sinusoidal embed float positions", lambda: posenc.create("sinusoidal", dim=8).embed(torch.zeros(1, 2, 8), torch.zeros(2)),
     TypeError, r"positions must have an integer dtype"),
    ("sinusoidal embed negative positions", lambda: posenc.create("sinusoidal", dim=8).embed(torch.zeros(1, 2, 8), torch.tensor([-1, 0])),
     ValueError, r"positions must be >= 0"),
    *[(f"sinusoidal_table num_positions={v!r}", (lambda v=v: posenc.sinusoidal_table(v, 8)), ValueError, r"num_positions must be an integer >= 1")
      for v in (0, -1, 4.0, True)],
    *[(f"sinusoidal_table dim={v!r}", (lambda v=v: posenc.sinusoidal_table(4, v)), ValueError, r"dim must be a positive even integer")
      for v in (0, 5, 8.0)],
    *[(f"sinusoidal_table base={v!r}", (lambda v=v: posenc.sinusoidal_table(4, 8, base=v)), ValueError, r"base must be a finite number > 1")
      for v in (0.5, NAN, INF)],
    # -- learned -----------------------------------------------------------------------------
    *[(f"learned num_positions={v!r}", (lambda v=v: posenc.create("learned", num_positions=v, dim=8)), ValueError, r"num_positions must be an integer >= 1")
      for v in (0, 3.0, False)],
    ("learned dim", lambda: posenc.create("learned", num_positions=4, dim=0), ValueError, r"dim must be an integer >= 1"),
    *[(f"learned init_std={v!r}", (lambda v=v: posenc.create("learned", num_positions=4, dim=8, init_std=v)), ValueError, r"init_std must be a finite number >= 0")
      for v in (-1.0, NAN, INF)],
    ("learned position past table", lambda: posenc.create("learned", num_positions=4, dim=8).embed(torch.zeros(1, 2, 8), torch.tensor([3, 4])),
     ValueError, r"positions: the learned table holds positions 0..3, got 4"),
    # -- rope / rope_frequencies / apply_rotary -------------------------------------------------
    *[(f"rope head_dim={v!r}", (lambda v=v: posenc.create("rope", head_dim=v)), ValueError, r"head_dim must be a positive even integer")
      for v in (0, 7, 8.0, True)],
    ("rope rotary_dim > head_dim", lambda: posenc.create("rope", head_dim=8, rotary_dim=16), ValueError, r"rotary_dim must be <= head_dim=8"),
    ("rope rotary_dim odd", lambda: posenc.create("rope", head_dim=8, rotary_dim=3), ValueError, r"rotary_dim must be a positive even integer"),
    ("rope both rotary args", lambda: posenc.create("rope", head_dim=8, rotary_dim=4, partial_rotary_factor=0.5), ValueError, r"rotary_dim or partial_rotary_factor"),
    *[(f"rope partial_rotary_factor={v!r}", (lambda v=v: posenc.create("rope", head_dim=8, partial_rotary_factor=v)), ValueError, r"partial_rotary_factor must be in \(0, 1\]")
      for v in (0.0, 1.5, NAN)],
    *[(f"rope base={v!r}", (lambda v=v: posenc.create("rope", head_dim=8, base=v)), ValueError, r"base \(rope_theta\) must be a finite number > 1")
      for v in (1.0, NAN, INF, "1e4")],
    ("rope dynamic_cache", lambda: posenc.create("rope", head_dim=8, dynamic_cache="x"), ValueError, r"dynamic_cache must be one of"),
    ("rope scaling unknown type", lambda: posenc.create("rope", head_dim=8, scaling={"rope_type": "ntk2"}), ValueError, r"unknown rope_type 'ntk2'; known: \["),
    ("rope scaling missing factor", lambda: posenc.create("rope", head_dim=8, scaling={"rope_type": "linear"}), KeyError, r"factor"),
    ("rope scaling factor < 1", lambda: posenc.create("rope", head_dim=8, scaling={"rope_type": "linear", "factor": 0.5}), ValueError, r"factor"),
    ("rope rotate head_dim mismatch", lambda: posenc.create("rope", head_dim=8).rotate(*qkv(d=4)[:2], torch.arange(3), torch.arange(3)),
     ValueError, r"head_dim=8"),
    *[(f"rope_frequencies head_dim={v!r}", (lambda v=v: posenc.rope_frequencies(v)), ValueError, r"head_dim must be a positive even integer")
      for v in (0, 5, 6.0)],
    *[(f"rope_frequencies base={v!r}", (lambda v=v: posenc.rope_frequencies(8, base=v)), ValueError, r"base \(rope_theta\) must be a finite number > 1")
      for v in (0.5, NAN, INF, True)],
    ("rope_frequencies seq_len", lambda: posenc.rope_frequencies(8, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}, seq_len=0),
     ValueError, r"seq_len"),
    ("rope_frequencies scaling not dict", lambda: posenc.rope_frequencies(8, scaling="linear"), TypeError, r"scaling"),
    ("apply_rotary x not tensor", lambda: posenc.apply_rotary([1.0, 2.0], torch.ones(2), torch.ones(2)), TypeError, r"x must be a floating-point torch.Tensor"),
    ("apply_rotary integer x", lambda: posenc.apply_rotary(torch.ones(2, 4, dtype=torch.long), torch.ones(4), torch.ones(4)), TypeError, r"x must be a floating-point"),
    ("apply_rotary odd D", lambda: posenc.apply_rotary(torch.ones(2, 5), torch.ones(5), torch.ones(5)), ValueError, r"x: the last dimension must be even"),
    ("apply_rotary cos width", lambda: posenc.apply_rotary(torch.ones(2, 4), torch.ones(2), torch.ones(2)), ValueError, r"cos and sin must have last dimension 4"),
    ("apply_rotary cos shape", lambda: posenc.apply_rotary(torch.ones(3, 4), torch.ones(2, 4), torch.ones(2, 4)), ValueError, r"cos and sin must broadcast to x's shape \(3, 4\)"),
    ("apply_rotary cos integer", lambda: posenc.apply_rotary(torch.ones(2, 4), torch.ones(4, dtype=torch.long), torch.ones(4)), TypeError, r"cos and sin must be floating-point"),
    ("apply_rotary cos not tensor", lambda: posenc.apply_rotary(torch.ones(2, 4), 1.0, 1.0), TypeError, r"cos and sin must be floating-point torch.Tensor"),
    ("apply_rotary interleaved not bool", lambda: posenc.apply_rotary(torch.ones(2, 4), torch.ones(4), torch.ones(4), interleaved="yes"), TypeError, r"interleaved must be a bool"),
    # -- xpos ----------------------------------------------------------------------------------
    *[(f"xpos scale_base={v!r}", (lambda v=v: posenc.create("xpos", head_dim=8, scale_base=v)), ValueError, r"scale_base must be a finite number > 0")
      for v in (0, -1.0, NAN, INF, True)],
    *[(f"xpos gamma={v!r}", (lambda v=v: posenc.create("xpos", head_dim=8, gamma=v)), ValueError, r"gamma must be a finite number > 0")
      for v in (0, NAN)],
    *[(f"xpos center={v!r}", (lambda v=v: posenc.create("xpos", head_dim=8, center=v)), ValueError, r"center must be an int \(a fixed centre\) or one of \('query', 'call'\)")
      for v in ("middle", True, 1.5)],
    # -- fope ----------------------------------------------------------------------------------
    ("fope head_dim odd", lambda: posenc.create("fope", head_dim=7), ValueError, r"head_dim must be"),
    *[(f"fope num_inv_freq={v!r}", (lambda v=v: posenc.create("fope", head_dim=8, num_inv_freq=v)), ValueError,
       r"num_inv_freq must be") for v in (0, 5, 1.5)],
    ("fope max_position_embeddings too short", lambda: posenc.create("fope", head_dim=8, max_position_embeddings=6),
     ValueError, r"no frequency of head_dim 8 completes a period"),
    ("fope both limits", lambda: posenc.create("fope", head_dim=8, num_inv_freq=2, max_position_embeddings=64),
     ValueError, r"give num_inv_freq or max_position_embeddings, not both"),
    *[(f"fope sin_pad_value={v!r}", (lambda v=v: posenc.create("fope", head_dim=8, sin_pad_value=v)), ValueError,
       r"sin_pad_value must be 1.0 \(as shipped\) or 0.0") for v in (0.5, True)],
    ("fope learnable not bool", lambda: posenc.create("fope", head_dim=8, learnable=1), TypeError, r"learnable must be a bool"),
    # -- liere / comrope -------------------------------------------------------------------------
    *[(f"{n} block_size={v!r}", (lambda n=n, v=v: posenc.create(n, head_dim=8, block_size=v)), ValueError,
       r"block_size must be") for n in ("liere", "comrope") for v in (0, 9, 2.0)],
    *[(f"{n} num_axes={v!r}", (lambda n=n, v=v: posenc.create(n, head_dim=8, num_axes=v)), ValueError,
       r"num_axes must be an integer >= 1") for n in ("liere", "comrope") for v in (0, -1)],
    *[(f"{n} position_scale={v!r}", (lambda n=n, v=v: posenc.create(n, head_dim=8, position_scale=v)), ValueError,
       r"position_scale must be a finite number > 0") for n in ("liere", "comrope") for v in (0, -1.0, INF)],
    *[(f"liere init_range={v!r}", (lambda v=v: posenc.create("liere", head_dim=8, init_range=v)), ValueError,
       r"init_range must be a finite number > 0") for v in (0, NAN)],
    *[(f"comrope init_std={v!r}", (lambda v=v: posenc.create("comrope", head_dim=8, init_std=v)), ValueError,
       r"init_std must be a finite number > 0") for v in (0, INF)],
    ("comrope variant", lambda: posenc.create("comrope", head_dim=8, variant="cd"), ValueError,
     r"variant must be one of \('ld', 'ap'\), got 'cd'"),
    ("liere learnable not bool", lambda: posenc.create("liere", head_dim=8, learnable=0), TypeError,
     r"learnable must be a bool"),
    # -- alibi / alibi_slopes ------------------------------------------------------------------
    *[(f"alibi num_heads={v!r}", (lambda v=v: posenc.create("alibi", num_heads=v)), ValueError, r"num_heads must be an integer >= 1")
      for v, _ in SIZES_BAD],
    *[(f"alibi_slopes num_heads={v!r}", (lambda v=v: posenc.alibi_slopes(v)), ValueError, r"num_heads must be an integer >= 1")
      for v, _ in SIZES_BAD],
    ("alibi bidirectional not bool", lambda: posenc.create("alibi", num_heads=4, bidirectional="no"), TypeError, r"bidirectional must be a bool"),
    # -- t5 / t5_relative_position_bucket ------------------------------------------------------
    *[(f"t5 num_heads={v!r}", (lambda v=v: posenc.create("t5", num_heads=v)), ValueError, r"num_heads must be an integer >= 1") for v in (0, 2.0)],
    ("t5 num_buckets too few", lambda: posenc.create("t5", num_heads=2, num_buckets=2), ValueError, r"num_buckets=2 and max_distance=128 leave no logarithmic range"),
    ("t5 max_distance", lambda: posenc.create("t5", num_heads=2, max_distance=0), ValueError, r"max_distance must be an integer >= 1"),
    ("t5 max_distance too small", lambda: posenc.create("t5", num_heads=2, max_distance=4), ValueError, r"max_distance > num_buckets/2"),
    ("bucket float input", lambda: posenc.t5_relative_position_bucket(torch.tensor([1.5])), TypeError, r"relative_position must be an integer torch.Tensor"),
    ("bucket list input", lambda: posenc.t5_relative_position_bucket([1, 2]), TypeError, r"relative_position must be an integer torch.Tensor"),
    ("bucket num_buckets float", lambda: posenc.t5_relative_position_bucket(torch.tensor([1]), num_buckets=32.0), ValueError, r"num_buckets must be an integer >= 1"),
    # -- kerple / fire ---------------------------------------------------------------------------
    ("kerple variant", lambda: posenc.create("kerple", num_heads=2, variant="exp"), ValueError, r"variant must be one of \('log', 'power'\)"),
    *[(f"kerple eps={v!r}", (lambda v=v: posenc.create("kerple", num_heads=2, eps=v)), ValueError, r"eps must be a number in \(0, 1\)") for v in (0.0, 1.0, NAN, True)],
    ("kerple num_heads", lambda: posenc.create("kerple", num_heads=0), ValueError, r"num_heads must be an integer >= 1"),
    ("fire num_heads", lambda: posenc.create("fire", num_heads=1.0), ValueError, r"num_heads must be an integer >= 1"),
    ("fire mlp_width", lambda: posenc.create("fire", num_heads=2, mlp_width=0), ValueError, r"mlp_width must be an integer >= 1"),
    *[(f"fire init_L={v!r}", (lambda v=v: posenc.create("fire", num_heads=2, init_L=v)), ValueError, r"init_L must be a finite number > 0") for v in (0.0, NAN, INF, "512")],
    *[(f"fire init_c={v!r}", (lambda v=v: posenc.create("fire", num_heads=2, init_c=v)), ValueError, r"init_c must be a finite number") for v in (NAN, INF, "0.1")],
    *[(f"fire eps={v!r}", (lambda v=v: posenc.create("fire", num_heads=2, eps=v)), ValueError, r"eps must be a finite number >= 0") for v in (-1e-6, NAN)],
    # -- shaw / transformer_xl -------------------------------------------------------------------
    ("shaw head_dim", lambda: posenc.create("shaw", head_dim=0), ValueError, r"head_dim must be an integer >= 1"),
    ("shaw max_relative_position", lambda: posenc.create("shaw", head_dim=8, max_relative_position=1.5), ValueError, r"max_relative_position must be an integer >= 1"),
    ("shaw q head_dim", lambda: posenc.attention(*qkv(d=4), posenc.create("shaw", head_dim=8)), ValueError, r"q must have head_dim=8"),
    ("txl d_model odd", lambda: posenc.create("transformer_xl", d_model=7, num_heads=1, head_dim=7), ValueError, r"d_model must be even"),
    ("txl num_heads", lambda: posenc.create("transformer_xl", d_model=8, num_heads=0, head_dim=4), ValueError, r"num_heads must be an integer >= 1"),
    ("txl base", lambda: posenc.create("transformer_xl", d_model=8, num_heads=2, head_dim=4, base=1), ValueError, r"base must be a finite number > 1"),
    ("txl init_std", lambda: posenc.create("transformer_xl", d_model=8, num_heads=2, head_dim=4, init_std=-1.0), ValueError, r"init_std must be a finite number >= 0"),
    ("txl q heads", lambda: posenc.attention(*qkv(h=3, d=4), posenc.create("transformer_xl", d_model=8, num_heads=2, head_dim=4)),
     ValueError, r"q must have num_heads=2 and head_dim=4"),
    # -- mrope / axial_rope / mrope_position_ids ----------------------------------------------------
    ("mrope head_dim", lambda: posenc.create("mrope", head_dim=7), ValueError, r"head_dim must be a positive even integer"),
    ("mrope rotary_dim > head_dim", lambda: posenc.create("mrope", head_dim=8, rotary_dim=16), ValueError, r"rotary_dim must be <= head_dim=8"),
    ("mrope base", lambda: posenc.create("mrope", head_dim=8, base=1.0), ValueError, r"base \(rope_theta\) must be a finite number > 1"),
    ("mrope section sum", lambda: posenc.create("mrope", head_dim=16, mrope_section=[2, 3, 2]), ValueError,
     r"mrope_section must sum to rotary_dim/2 = 8 .*got \[2, 3, 2\] \(sum 7\)"),
    *[(f"mrope section={v!r}", (lambda v=v: posenc.create("mrope", head_dim=16, mrope_section=v)), ValueError,
       r"mrope_section must be 3 non-negative integers \(temporal, height, width pairs\)") for v in ([-1, 5, 4], [4, 4], [2.0, 3, 3], "233")],
    ("mrope section not interleavable", lambda: posenc.create("mrope", head_dim=16, mrope_section=[2, 3, 3], mrope_interleaved=True),
     ValueError, r"mrope_section \[2, 3, 3\] cannot be interleaved over 8 pairs"),
    ("mrope mrope_interleaved not bool", lambda: posenc.create("mrope", head_dim=8, mrope_interleaved="yes"), TypeError, r"mrope_interleaved must be a bool"),
    ("mrope length-dependent scaling", lambda: posenc.create("mrope", head_dim=8, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}),
     ValueError, r"scaling: rope_type 'dynamic' depends on the call's length"),
    ("mrope positions shape", attn(encoding=posenc.create("mrope", head_dim=8), q_positions=torch.zeros(4, 1, 3, dtype=torch.long)),
     ValueError, r"q_positions must have shape \(3,\) or \(1, 3\) \(one position per token, every axis equal\), or \(3, 3\) or \(3, 1, 3\) \(temporal, height, width\)"),
    ("mrope negative positions", attn(encoding=posenc.create("mrope", head_dim=8), k_positions=torch.tensor([[0, 1, 2], [0, 1, 2], [0, -1, 2]])),
     ValueError, r"k_positions must be >= 0"),
    ("mrope rotate positions shape", lambda: posenc.create("mrope", head_dim=8).rotate(*qkv()[:2], torch.zeros(3, 3, dtype=torch.long), torch.arange(3)),
     ValueError, r"q_positions must have shape \(3,\) or \(1, 3\) \(every axis equal\) or \(3, 1, 3\) \(axis-first"),
    *[(f"axial_rope num_axes={v!r}", (lambda v=v: posenc.create("axial_rope", head_dim=8, num_axes=v)), ValueError, r"num_axes must be an integer >= 1")
      for v in (0, 2.0, True)],
    ("axial_rope axes not dividing", lambda: posenc.create("axial_rope", head_dim=12, num_axes=4), ValueError,
     r"rotary_dim=12 does not split into 4 axes of even width .* give axial_dims"),
    ("axial_rope axial_dims sum", lambda: posenc.create("axial_rope", head_dim=16, axial_dims=[6, 6], rotary_dim=16), ValueError,
     r"axial_dims must sum to rotary_dim=16, got \[6, 6\] \(sum 12\)"),
    ("axial_rope axial_dims odd", lambda: posenc.create("axial_rope", head_dim=16, axial_dims=[5, 11]), ValueError, r"axial_dims entries must be a positive even integer"),
    ("axial_rope axial_dims count", lambda: posenc.create("axial_rope", head_dim=16, num_axes=3, axial_dims=[8, 8]), ValueError,
     r"axial_dims must give one width per axis \(num_axes=3\)"),
    ("axial_rope axial_dims wider than head", lambda: posenc.create("axial_rope", head_dim=8, axial_dims=[8, 8]), ValueError, r"rotary_dim must be <= head_dim=8"),
    ("axial_rope freqs_for", lambda: posenc.create("axial_rope", head_dim=8, freqs_for="pixels"), ValueError, r"freqs_for must be one of \('lang', 'pixel'\)"),
    ("axial_rope pixel without grid_size", lambda: posenc.create("axial_rope", head_dim=8, freqs_for="pixel"), ValueError, r"grid_size is required with freqs_for='pixel'"),
    ("axial_rope grid_size with lang", lambda: posenc.create("axial_rope", head_dim=8, grid_size=4), ValueError, r"grid_size is for freqs_for='pixel'"),
    *[(f"axial_rope grid_size={v!r}", (lambda v=v: posenc.create("axial_rope", head_dim=8, freqs_for="pixel", grid_size=v)), ValueError,
       r"grid_size must be an integer >= 1 or 2 of them") for v in (0, [4], [4, 0], 4.0)],
    *[(f"axial_rope max_freq={v!r}", (lambda v=v: posenc.create("axial_rope", head_dim=8, max_freq=v)), ValueError, r"max_freq must be a finite number > 0")
      for v in (0.0, NAN)],
    ("axial_rope interleaved not bool", lambda: posenc.create("axial_rope", head_dim=8, interleaved=1), TypeError, r"interleaved must be a bool"),
    ("axial_rope positions shape", attn(encoding=posenc.create("axial_rope", head_dim=8), k_positions=torch.zeros(3, 3, dtype=torch.long)),
     ValueError, r"k_positions must have shape \(3,\) or \(1, 3\) .*, or \(3, 2\) or \(1, 3, 2\) \(one coordinate per axis, axis last\)"),
    ("mrope_position_ids merge", lambda: posenc.mrope_position_ids([2, (1, 3, 4)]), ValueError,
     r"segments\[1\] must be an int \(text tokens\), \(t, h, w\) or \(t, h, w, time_interval\).*divisible by spatial_merge_size=2"),
    ("mrope_position_ids segment form", lambda: posenc.mrope_position_ids([(1, 2)]), ValueError, r"segments\[0\] must be an int .*another form"),
    ("mrope_position_ids negative text", lambda: posenc.mrope_position_ids([-1]), ValueError, r"segments\[0\] must be an int"),
    ("mrope_position_ids time_interval", lambda: posenc.mrope_position_ids([(2, 2, 2, -1.0)]), ValueError, r"time_interval must be a finite number >= 0"),
    *[(f"mrope_position_ids spatial_merge_size={v!r}", (lambda v=v: posenc.mrope_position_ids([1], spatial_merge_size=v)), ValueError,
       r"spatial_merge_size must be an integer >= 1") for v in (0, 2.0)],
    # -- irope -------------------------------------------------------------------------------------
    *[(f"irope attention_chunk_size={v!r}", (lambda v=v: posenc.create("irope", head_dim=8, attention_chunk_size=v)),
       ValueError, r"attention_chunk_size must be an integer >= 1") for v in (0, -4, 8.0, True)],
    ("irope chunked layer size", lambda: posenc.encodings.irope.ChunkedRoPE(8, attention_chunk_size=0), ValueError,
     r"attention_chunk_size must be an integer >= 1"),
    *[(f"irope no_rope_layers={v!r}", (lambda v=v: posenc.create("irope", head_dim=8, no_rope_layers=v)), ValueError,
       r"no_rope_layers must be a non-empty list of 0 and 1") for v in ([], [1, 2], "1101", [True, False], 4)],
    ("irope no_rope_layer_interval", lambda: posenc.create("irope", head_dim=8, no_rope_layer_interval=0), ValueError,
     r"no_rope_layer_interval must be an integer >= 1"),
    ("irope floor_scale", lambda: posenc.create("irope", head_dim=8, floor_scale=0), ValueError, r"floor_scale must be an integer >= 1"),
    ("irope floor_scale float", lambda: posenc.create("irope", head_dim=8, floor_scale=8192.0), ValueError, r"floor_scale must be an integer >= 1"),
    *[(f"irope attn_scale={v!r}", (lambda v=v: posenc.create("irope", head_dim=8, attn_scale=v)), ValueError,
       r"attn_scale must be a finite number >= 0") for v in (-0.1, NAN, INF)],
    ("irope rope_theta", lambda: posenc.create("irope", head_dim=8, rope_theta=1.0), ValueError, r"base \(rope_theta\) must be a finite number > 1"),
    ("irope head_dim", lambda: posenc.create("irope", head_dim=7), ValueError, r"head_dim must be a positive even integer"),
    ("irope interleaved", lambda: posenc.create("irope", head_dim=8, interleaved="yes"), TypeError, r"interleaved must be a bool"),
    ("irope attn_temperature_tuning", lambda: posenc.create("irope", head_dim=8, attn_temperature_tuning=1), TypeError,
     r"attn_temperature_tuning must be a bool"),
    ("irope schedule shorter than the model", lambda: posenc.create_for_model("irope", d_model=16, num_heads=2, head_dim=8,
     max_positions=8, num_layers=3, no_rope_layers=[1, 0]), ValueError, r"no_rope_layers has 2 entries for a model of num_layers=3"),
    ("irope for_layer negative", lambda: posenc.create("irope", head_dim=8).for_layer(-1), ValueError, r"layer must be an integer >= 0"),
    ("irope for_layer past the schedule", lambda: posenc.create("irope", head_dim=8, no_rope_layers=[1]).for_layer(1), ValueError,
     r"layer 1 is past no_rope_layers, which schedules 1 layers"),
    ("irope from_hf_config partial rotary", lambda: posenc.IRoPE.from_hf_config({"head_dim": 8, "rope_theta": 5e5, "partial_rotary_factor": 0.5}),
     ValueError, r"partial_rotary_factor=0.5; iRoPE rotates the whole head"),
    # -- cope / fox ------------------------------------------------------------------------------
    ("cope head_dim", lambda: posenc.create("cope", head_dim=0, npos_max=4), ValueError, r"head_dim must be an integer >= 1"),
    *[(f"cope npos_max={v!r}", (lambda v=v: posenc.create("cope", head_dim=8, npos_max=v)), ValueError, r"npos_max must be an integer >= 1")
      for v in (0, 2.5, True)],
    ("cope missing npos_max", lambda: posenc.create("cope", head_dim=8), TypeError, r"npos_max"),
    ("cope num_layers", lambda: posenc.create("cope", head_dim=8, num_layers=0, npos_max=4), ValueError, r"num_layers must be an integer >= 1"),
    ("cope for_layer", lambda: posenc.create_for_model("cope", d_model=16, num_heads=2, head_dim=8, max_positions=8, num_layers=2).for_layer(2),
     ValueError, r"layer must be in 0..1, got 2"),
    ("cope q head_dim", lambda: posenc.attention(*qkv(d=4), posenc.create("cope", head_dim=8, npos_max=4)), ValueError, r"q must have head_dim=8"),
    ("cope blocked", attn(encoding=posenc.create("cope", head_dim=8, npos_max=4), backend="blocked"), ValueError,
     r"backend='blocked' has no content terms"),
    *[(f"fox {f}={v!r}", (lambda f=f, v=v: posenc.create("fox", **{"d_model": 8, "num_heads": 2, f: v})), ValueError, rf"{f} must be an integer >= 1")
      for f in ("d_model", "num_heads", "num_layers") for v in (0, 2.0)],
    ("fox gate x width", lambda: posenc.create("fox", d_model=8, num_heads=2).gate(torch.zeros(1, 3, 5)), ValueError,
     r"x must have shape \(B, T, d_model=8\), got \(1, 3, 5\)"),
    ("attention fox without gates", attn(encoding=posenc.create("fox", d_model=8, num_heads=2)), ValueError,
     r"gates: FoX has the gate hook, which reads the hidden state: pass gates=encoding.gate\(x\)"),
    ("attention gates without a gate encoding", attn(gates=torch.zeros(1, 2, 3)), ValueError,
     r"gates: only an encoding with the gate hook takes gates="),
    ("attention gates shape", attn(encoding=posenc.create("fox", d_model=8, num_heads=2), gates=torch.zeros(1, 2, 4)), ValueError,
     r"gates must have shape \(B, H, Tk\) = \(1, 2, 3\)"),
    ("attention gates integer", attn(encoding=posenc.create("fox", d_model=8, num_heads=2), gates=torch.zeros(1, 2, 3, dtype=torch.long)),
     TypeError, r"gates must be a floating-point torch.Tensor"),
    ("attention gates list", attn(encoding=posenc.create("fox", d_model=8, num_heads=2), gates=[0.0, 0.0, 0.0]), TypeError,
     r"gates must be a floating-point torch.Tensor .*, got list"),
    ("attention gates Tq > Tk", attn(q=qkv(tq=4)[0], encoding=posenc.create("fox", d_model=8, num_heads=2), causal=False,
                                     gates=torch.zeros(1, 2, 3)), ValueError, r"gates: the queries must be the last keys \(Tq <= Tk\)"),
    ("attention flex with fox", attn(encoding=posenc.create("fox", d_model=8, num_heads=2), gates=torch.zeros(1, 2, 3), backend="flex"),
     ValueError, r"backend='flex' has no gate bias"),
    # -- path ------------------------------------------------------------------------------------
    *[(f"path {f}={v!r}", (lambda f=f, v=v: posenc.create("path", **{"d_model": 8, "num_heads": 2, "head_dim": 8, f: v})),
       ValueError, rf"{f} must be an integer >= 1") for f in ("d_model", "num_heads", "head_dim", "num_layers", "w_rank")
      for v in (0, 2.0)],
    ("path num_kv_heads", lambda: posenc.create("path", d_model=8, num_heads=4, head_dim=8, num_kv_heads=3), ValueError,
     r"num_kv_heads must divide num_heads=4, got 3"),
    ("path forget_gate", lambda: posenc.create("path", d_model=8, num_heads=2, head_dim=8, forget_gate=1), ValueError,
     r"forget_gate must be a bool, got 1"),
    ("path causal False", lambda: posenc.create("path", d_model=8, num_heads=2, head_dim=8, causal=False), ValueError,
     r"causal: PaTH's transforms run from the key to the query \(causal attention only\), got False"),
    ("path gate x width", lambda: posenc.create("path", d_model=8, num_heads=2, head_dim=8).gate(torch.zeros(1, 3, 5)), ValueError,
     r"x must have shape \(B, T, d_model=8\), got \(1, 3, 5\)"),
    ("attention path gates shape", attn(encoding=posenc.create("path", d_model=8, num_heads=2, head_dim=8), gates=torch.zeros(1, 2, 3)),
     ValueError, r"gates must have shape \(B, H, Tk, F\) = \(1, 2, 3, 9\)"),
    ("attention path causal=False", attn(encoding=posenc.create("path", d_model=8, num_heads=2, head_dim=8), causal=False,
                                         gates=torch.zeros(1, 2, 3, 9)), ValueError, r"causal: PaTH is defined for causal attention only"),
    ("attention path blocked", attn(encoding=posenc.create("path", d_model=8, num_heads=2, head_dim=8), gates=torch.zeros(1, 2, 3, 9),
                                    backend="blocked"), ValueError, r"backend='blocked' has no content terms"),
    # -- attention -------------------------------------------------------------------------------
    ("attention q 3-D", lambda: posenc.attention(torch.ones(2, 3, 8), *qkv()[1:]), ValueError, r"q must be a 4-D tensor \(B, H, T, D\)"),
    ("attention q not tensor", lambda: posenc.attention([1.0], *qkv()[1:]), TypeError, r"q must be a floating-point torch.Tensor"),
    ("attention integer k", lambda: posenc.attention(qkv()[0], torch.ones(1, 2, 3, 8, dtype=torch.long), qkv()[2]), TypeError, r"k must be a floating-point tensor"),
    ("attention batch mismatch", lambda: posenc.attention(qkv(b=2)[0], *qkv()[1:]), ValueError, r"q \(B, H, Tq, D\), k and v \(B, H_kv, Tk, D\) disagree"),
    ("attention kv heads not dividing", lambda: posenc.attention(qkv(h=3)[0], *qkv(h=2)[1:]), ValueError, r"H_kv must divide q's H"),
    ("attention scale", lambda: posenc.attention(*qkv(), scale=0.0), ValueError, r"scale must be a finite number > 0"),
    ("attention dropout_p", lambda: posenc.attention(*qkv(), dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    ("attention flex dropout", lambda: posenc.attention(*qkv(), dropout_p=0.1, backend="flex"), ValueError, r"backend='flex' has no attention dropout"),
    ("attention v length", lambda: posenc.attention(*qkv()[:2], qkv(tk=4)[2]), ValueError, r"disagree"),
    ("attention head_dim mismatch", lambda: posenc.attention(qkv(d=4)[0], *qkv()[1:]), ValueError, r"q and k must share head_dim, got 4 and 8"),
    ("attention dtype mismatch", lambda: posenc.attention(qkv()[0].double(), *qkv()[1:]), ValueError, r"q, k and v must share one dtype"),
    ("attention causal Tq > Tk", lambda: posenc.attention(*qkv(tq=4, tk=3)), ValueError, r"causal attention needs Tq <= Tk"),
    ("attention causal not bool", attn(causal="yes"), TypeError, r"causal must be a bool"),
    ("attention backend", attn(backend="flash"), ValueError, r"backend must be one of \('auto', 'eager', 'sdpa', 'blocked', 'flex', 'flash_attention_2', 'triton'\)"),
    ("attention encoding type", attn(encoding="rope"), TypeError, r"encoding must be a posenc.PositionalEncoding"),
    ("attention float positions", attn(q_positions=torch.zeros(3)), TypeError, r"q_positions must have an integer dtype"),
    ("attention bool positions", attn(k_positions=torch.ones(3, dtype=torch.bool)), TypeError, r"k_positions must have an integer dtype"),
    ("attention negative positions", attn(k_positions=torch.tensor([-1, 0, 1])), ValueError, r"k_positions must be >= 0"),
    ("attention positions length", attn(q_positions=torch.arange(4)), ValueError, r"q_positions must have shape \(3,\) or \(1, 3\)"),
    ("attention positions rank", attn(q_positions=torch.zeros(1, 1, 3, dtype=torch.long)), ValueError, r"q_positions must have shape \(T,\) or \(B, T\)"),
    ("attention positions list", attn(q_positions=[0, 1, 2]), TypeError, r"q_positions must be an integer torch.Tensor"),
    ("attention sdpa with shaw", attn(encoding=posenc.create("shaw", head_dim=8), backend="sdpa"), ValueError, r"backend='sdpa' cannot add a content term"),
    ("attention flex q grad on cpu", lambda: posenc.attention(*(t.requires_grad_() for t in qkv()), backend="flex"), ValueError,
     r"backend='flex' has no backward for q, k, v on the CPU"),
    ("attention mask not bool", attn(mask=torch.ones(3, 3)), TypeError, r"mask must be a boolean tensor \(True = may attend\) or a mask_mod"),
    ("attention mask_mod not bool", attn(mask=lambda b, h, i, j: i - j), TypeError, r"a mask_mod must return a boolean tensor"),
    ("sliding_window_mask_mod 0", lambda: posenc.masks.sliding_window_mask_mod(0), ValueError, r"sliding_window must be an integer >= 1"),
    ("chunked_mask_mod float", lambda: posenc.masks.chunked_mask_mod(2.5), ValueError, r"attention_chunk_size must be an integer >= 1"),
    ("document_mask_mod float ids", lambda: posenc.masks.document_mask_mod(torch.zeros(4)), ValueError, r"q_document_ids must be an integer tensor"),
    # -- LMConfig / TransformerLM -------------------------------------------------------------
    *[(f"LMConfig {f}={v!r}", (lambda f=f, v=v: LMConfig(**{f: v})), ValueError, rf"{f} must be an integer >= 1")
      for f in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio", "max_positions") for v in (0, 2.0, True)],
    ("LMConfig heads divide", lambda: LMConfig(d_model=64, num_heads=3), ValueError, r"d_model=64 must be divisible by num_heads=3"),
    ("LMConfig backend", lambda: LMConfig(backend="flex2"), ValueError, r"backend must be one of"),
    ("TransformerLM unknown encoding", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "rotary"), ValueError, r"unknown encoding 'rotary'"),
    ("TransformerLM encoding type", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), 3), TypeError, r"encoding must be a posenc.PositionalEncoding or a registered name"),
    ("TransformerLM config type", lambda: TransformerLM({"d_model": 16}, "rope"), TypeError, r"config must be a posenc.lab.model.LMConfig"),
    ("TransformerLM tokens 1-D", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "nope")(torch.zeros(4, dtype=torch.long)),
     ValueError, r"tokens must have shape \(B, T\)"),
    ("TransformerLM tokens float", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "nope")(torch.zeros(1, 4)),
     TypeError, r"tokens must be an integer tensor"),
    ("TransformerLM tokens out of vocab", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "nope")(torch.tensor([[1, 256]])),
     ValueError, r"tokens must be in \[0, 256\), got 256"),
    ("TransformerLM positions float", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "nope")(torch.zeros(1, 4, dtype=torch.long), torch.zeros(4)),
     TypeError, r"positions must have an integer dtype"),
    # -- TrainConfig ---------------------------------------------------------------------------
    *[(f"TrainConfig {f}={v!r}", (lambda f=f, v=v: TrainConfig(**{f: v})), ValueError, rf"{f} must be an integer >= 1")
      for f in ("steps", "batch_size", "seq_len") for v in (0, 10.0, True)],
    *[(f"TrainConfig lr={v!r}", (lambda v=v: TrainConfig(lr=v)), ValueError, r"lr must be a finite number > 0") for v in (0.0, -1e-3, NAN, INF)],
    *[(f"TrainConfig {f}={v!r}", (lambda f=f, v=v: TrainConfig(**{f: v})), ValueError, rf"{f} must be in") for f, v in
      (("warmup_frac", 1.0), ("warmup_frac", NAN), ("min_lr_frac", -0.1), ("min_lr_frac", NAN))],
    *[(f"TrainConfig stable_frac={v!r}", (lambda v=v: TrainConfig(stable_frac=v)), ValueError,
       r"stable_frac must be >= 0 with warmup_frac \+ stable_frac < 1") for v in (-0.1, 0.95, NAN)],
    *[(f"TrainConfig {f}={v!r}", (lambda f=f, v=v: TrainConfig(**{f: v})), ValueError, rf"{f} must be a finite number") for f, v in
      (("grad_clip", 0.0), ("grad_clip", NAN), ("weight_decay", -0.1), ("weight_decay", INF))],
    *[(f"TrainConfig seed={v!r}", (lambda v=v: TrainConfig(seed=v)), ValueError, r"seed must be an integer >= 0") for v in (-1, 1.5, True)],
    ("TrainConfig autocast float16", lambda: TrainConfig(autocast="float16"), ValueError, r"autocast must be None \(float32\) or one of"),
    ("TrainConfig compile str", lambda: TrainConfig(compile="yes"), TypeError, r"compile must be a bool"),
    ("config eval_stride > L", lambda: ExtrapolationConfig.from_options(train_len=8, eval_tokens=200, eval_stride=9), ValueError,
     r"eval_stride=9 must be <= train_len=8"),
    ("sliding windows stride", lambda: posenc.lab.evaluate.sliding_windows(torch.zeros(100, dtype=torch.uint8), 8, 0, 50), ValueError,
     r"stride must be an integer in \[1, length=8\]"),
    # -- ExtrapolationConfig / preset_config ---------------------------------------------------
    ("preset unknown", lambda: preset_config("huge"), ValueError, r"preset must be one of \['quick', 'default', 'full', 'gpu', 'paper'\]"),
    ("config encodings str", lambda: ExtrapolationConfig(encodings="rope"), TypeError, r"encodings must be a sequence of encoding names"),
    ("config encodings empty", lambda: ExtrapolationConfig(encodings=()), ValueError, r"encodings: give at least one encoding"),
    ("config encodings unknown", lambda: ExtrapolationConfig(encodings=("rope", "rotary")), ValueError, r"unknown encoding 'rotary'; available"),
    ("config encodings twice", lambda: ExtrapolationConfig(encodings=("rope", "rope")), ValueError, r"encodings: each name once"),
    *[(f"config {f}={v!r}", (lambda f=f, v=v: ExtrapolationConfig.from_options(**{f: v})), ValueError, rf"{f} must be an integer >= 1")
      for f in ("train_len", "steps", "batch_size", "d_model", "num_layers", "num_heads", "eval_tokens") for v in (0, 4.0)],
    *[(f"config eval_factors={v!r}", (lambda v=v: ExtrapolationConfig(eval_factors=v)), ValueError, r"eval_factors") for v in ((), (1, 0), (1, 2.5), (1, True))],
    *[(f"config seeds={v!r}", (lambda v=v: ExtrapolationConfig(seeds=v)), ValueError, r"seeds") for v in ((), (0, 0), (0.5,), (True,), (-1,))],
    ("config lr nan", lambda: ExtrapolationConfig.from_options(lr=NAN), ValueError, r"lr must be a finite number > 0"),
    ("config eval_tokens short", lambda: ExtrapolationConfig(eval_tokens=100), ValueError, r"eval_tokens=100 must be >= the longest eval length 1024"),
    ("config learned_positions", lambda: ExtrapolationConfig(learned_positions=0), ValueError, r"learned_positions must be an integer >= 1"),
    ("config device", lambda: ExtrapolationConfig(device="gpu0"), ValueError, r"device must be a torch device such as 'cpu' or 'cuda', got 'gpu0'"),
    ("config heads divide", lambda: ExtrapolationConfig.from_options(num_heads=3), ValueError, r"divisible"),
    ("config option unknown", lambda: ExtrapolationConfig.from_options(layers=2), TypeError, r"unexpected keyword argument 'layers'"),
    ("config model type", lambda: ExtrapolationConfig(model={"d_model": 64}), TypeError, r"model must be a posenc.lab.model.LMConfig, got dict"),
    ("config train type", lambda: ExtrapolationConfig(train=None), TypeError, r"train must be a posenc.lab.train.TrainConfig, got NoneType"),
    ("config extension_methods str", lambda: ExtrapolationConfig(extension_methods="yarn"), TypeError, r"extension_methods \(--rope-scaling\) must be a sequence"),
    ("config extension_methods unknown", lambda: ExtrapolationConfig(extension_methods=("su",)), ValueError, r"extension_methods \(--rope-scaling\): unknown method\(s\) \['su'\]"),
    # -- load_corpus -----------------------------------------------------------------------------
    ("corpus missing", lambda: load_corpus("/no/such/corpus"), CorpusError, r"corpus: /no/such/corpus does not exist"),
    ("corpus type", lambda: load_corpus(123), TypeError, r"path must be a str or os.PathLike \(a file or folder\), got int"),
    *[(f"corpus val_fraction={v!r}", (lambda v=v: load_corpus(None, val_fraction=v)), ValueError, r"val_fraction must be in \(0, 1\)") for v in (0.0, 1.0, NAN, "0.1")],
    # -- plots.plot_encoding / posenc.rope.from_hf_config ----------------------------------------
    ("plot_encoding unknown", lambda: __import__("posenc.lab.plots").lab.plots.plot_encoding("rotary", "x.png"), ValueError, r"unknown encoding 'rotary'; available"),
    ("plot_encoding bad option", lambda: __import__("posenc.lab.plots").lab.plots.plot_encoding("kerple", "x.png", variant="exp"), ValueError, r"variant must be one of"),
    ("plot_encoding bad size", lambda: __import__("posenc.lab.plots").lab.plots.plot_encoding("rope", "x.png", head_dim=7), ValueError, r"head_dim must be a positive even integer"),
    ("from_hf_config not dict", lambda: posenc.rope.from_hf_config("config.json"), TypeError, r"config must be a dict"),
    ("from_hf_config no head_dim", lambda: posenc.rope.from_hf_config({"rope_theta": 10000.0}), KeyError, r"head_dim"),
    ("from_hf_config bad theta", lambda: posenc.rope.from_hf_config({"head_dim": 8, "rope_theta": 0.5}), ValueError, r"rope_theta"),
    ("from_hf_config bad scaling", lambda: posenc.rope.from_hf_config({"head_dim": 8, "rope_scaling": {"rope_type": "yarn2", "factor": 2.0}}), ValueError, r"unknown rope_type 'yarn2'"),
    ("from_hf_config Grok's top-level rope_type", lambda: posenc.rope.from_hf_config({"head_dim": 8, "rope_type": "yarn_log", "scaling_factor": 4.0, "original_max_position_embeddings": 64}), ValueError, r"Grok's spelling.*construct RoPE"),
    ("theta_scale context <= 2 pi", lambda: posenc.create("rope", head_dim=8, scaling={"rope_type": "theta_scale", "factor": 2.0, "original_max_position_embeddings": 6}), ValueError, r"must be > 2 pi"),
]


#: Cases where Python itself refuses the call (a missing or unexpected keyword argument): the
#: interpreter's TypeError, not one of posenc's checks.
SIGNATURE_CASES = {"create unexpected kwarg", "create missing kwarg", "create nope kwarg", "cope missing npos_max",
                   "config option unknown"}


@pytest.mark.parametrize("case_id, call, error, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case_id, call, error, match, tmp_path, monkeypatch):
    """The documented type and message; and every check of posenc raises a class of
    posenc.errors (what the CLI maps to exit 2), where Python's own signature errors stay
    plain TypeErrors."""
    from posenc.errors import PosencError

    monkeypatch.chdir(tmp_path)  # plot cases never write into the checkout
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, PosencError) == (case_id not in SIGNATURE_CASES), type(info.value)


def test_corpus_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01" * 100)
    folder = tmp_path / "nothing"
    folder.mkdir()
    for path, match in ((empty, "holds no text"), (binary, "holds no text"), (folder, "no text files")):
        with pytest.raises(CorpusError, match=match):
            load_corpus(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_corpus(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("text")
    path.chmod(0)
    with pytest.raises(CorpusError, match="cannot be read"):
        load_corpus(path)


def test_nan_in_attention_inputs_propagates_to_the_rows_it_reaches():
    # Documented (docs/precision.md, docs/errors.md): not checked, as torch; a NaN query row
    # gives a NaN output row, other rows are untouched.
    q, k, v = qkv(tq=4, tk=4)
    q[0, 0, 2, 0] = NAN
    for backend in ("eager", "sdpa"):
        out = posenc.attention(q, k, v, posenc.create("alibi", num_heads=2), backend=backend)
        assert torch.isnan(out[0, 0, 2]).all() and torch.isfinite(out[0, 0, [0, 1, 3]]).all() and torch.isfinite(out[0, 1]).all()


# -- the CLI: one line on stderr, exit code 2 ----------------------------------------------------
CLI_CASES = [
    (["list", "extra"], "extra"),
    (["extrapolate", "--encodings", "nope,rotary"], "unknown encoding 'rotary'; available: nope"),
    (["extrapolate", "--encodings", ","], "--encodings: give a comma-separated list"),
    (["extrapolate", "--encodings", "rope,rope"], "each name once"),
    (["extrapolate", "--corpus", "/no/such/path"], "corpus: /no/such/path does not exist"),
    (["extrapolate", "--steps", "0"], "steps must be an integer >= 1"),
    (["extrapolate", "--steps", "2.5"], "--steps"),
    (["extrapolate", "--train-len", "-8"], "train_len must be an integer >= 1"),
    (["extrapolate", "--batch-size", "0"], "batch_size must be an integer >= 1"),
    (["extrapolate", "--lr", "nan"], "lr must be a finite number > 0"),
    (["extrapolate", "--lr", "-1"], "lr must be a finite number > 0"),
    (["extrapolate", "--d-model", "0"], "d_model must be an integer >= 1"),
    (["extrapolate", "--layers", "0"], "num_layers must be an integer >= 1"),
    (["extrapolate", "--heads", "3"], "divisible"),
    (["extrapolate", "--eval-factors", "1,0.5"], "--eval-factors"),
    (["extrapolate", "--eval-factors", "0,1"], "eval_factors"),
    (["extrapolate", "--eval-tokens", "10"], "eval_tokens=10 must be >="),
    (["extrapolate", "--seeds", "0,0"], "seeds"),
    (["extrapolate", "--seeds", "a"], "--seeds"),
    (["extrapolate", "--seeds", "-1"], "seeds"),
    (["extrapolate", "--preset", "huge"], "preset must be one of"),
    (["extrapolate", "--device", "gpu0"], "device must be a torch device"),
    *([(["extrapolate", "--device", "cuda"], "no cuda device")] if not torch.cuda.is_available() else []),
    (["extrapolate", "--device", "cpu:x"], "device must be a torch device"),
    (["extrapolate", "--eval-stride", "65"], "eval_stride=65 must be <= train_len=64"),
    (["bench", "attention", "--device", "cpu", "--backends", "fast"], "--backends: unknown ['fast']"),
    (["bench", "attention", "--device", "gpu0"], "--device must be a torch device"),
    (["extrapolate", "--no-such-option"], "no-such-option"),
    (["plot", "rotary"], "unknown encoding 'rotary'; available"),
    (["plot"], "Missing argument 'name'"),
    (["frobnicate"], "frobnicate"),
    # -- issue 22: values the machine cannot hold, refused before any work ----------------------
    (["extrapolate", "--seeds", str(2**64)], "seeds: give one or more distinct integers in [0, 2**63)"),
    (["extrapolate", "--seeds", str(2**63)], "seeds: give one or more distinct integers in [0, 2**63)"),
    (["extrapolate", "--batch-size", "100000000"], "training (batch 100000000 x 64 tokens)"),
    (["extrapolate", "--d-model", "1000000"], "parameters needs at least"),
    (["extrapolate", "--layers", "10000000"], "lower --batch-size, --train-len, --d-model, --layers"),
    (["extrapolate", "--encodings", "rope", "--randomized-positions", "10000000000"], "needs at least"),
    (["extrapolate", "--threads", "100000"], "--threads must be at most "),
    (["extrapolate", "--out", "/dev/null"], "--out: /dev/null exists and is not a folder"),
    (["extrapolate", "--out", "/proc/posenc-out"], "--out: /proc/posenc-out is not writable"),
    (["extrapolate", "--corpus", ""], "corpus: give a text file, a folder or a dataset name, got ''"),
    (["extrapolate", "--corpus", "./missing.txt"], "corpus: missing.txt does not exist"),
    (["extrapolate", "--corpus", "data/wiki.txt"], "corpus: data/wiki.txt does not exist"),
    (["lengthgen", "--train-size", "1000000000"], "train_size (--train-size) must be at most 16384"),
    (["lengthgen", "--eval-instances", "100000000"], "evaluation (100000000 instances"),
    (["lengthgen", "--tasks", "copy", "--randomized-positions", "10000000000"], "needs at least"),
    (["lengthgen", "--batch-size", "100000000"], "lower --batch-size, --train-size"),
    (["lengthgen", "--workers", "100000"], "--workers must be at most "),
    (["lengthgen", "--threads", "0"], "--threads must be an integer >= 1, got 0"),
    (["bench", "attention", "--device", "cpu", "--lengths", "0"], "--lengths: every length must be an integer >= 1, got 0"),
    (["bench", "attention", "--device", "cpu", "--lengths=-5"], "--lengths: every length must be an integer >= 1, got -5"),
    (["bench", "attention", "--device", "cpu", "--dtype", "int64"], "--dtype must be a torch dtype name, one of float32, bfloat16, float16, float64"),
    (["bench", "--threads", "100000"], "--threads must be at most "),
    (["generate", "model.pt", "--prompt", "a", "--temperature", "1e-300"], "--temperature must be a finite number >= 1e-06"),
    (["generate", "model.pt", "--prompt", "a", "--temperature", "nan"], "--temperature must be a finite number >= 1e-06"),
    (["generate", "model.pt", "--prompt", "a", "--seed", str(2**64)], "--seed must be an integer in [0, 2**63)"),
    (["plot", "rope", "--out", "rope.foo"], "--out: rope.foo: unknown figure format '.foo'; matplotlib writes"),
    (["inspect", "config.json", "--out", "rope.foo"], "--out: rope.foo: unknown figure format '.foo'"),
]


@pytest.mark.parametrize("args, match", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_bad_arguments(args, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the memory check compares with the free memory: the same 16 GiB on every machine
    monkeypatch.setattr("posenc.lab.experiments.limits.available_bytes", lambda device: 16 * 2**30)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err


def test_cli_empty_corpus_file(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code = main(["extrapolate", "--corpus", str(empty), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "holds no text" in err, err


def matrix_size() -> int:
    return len(CASES) + len(CLI_CASES) + 3 + 1 + 1  # + corpus files (3), unreadable, NaN, empty corpus CLI


def _write_errors_doc(path: str = "docs/errors.md") -> None:
    """Regenerate the tables (and the case count) of docs/errors.md from this matrix, with the
    messages raised today: ``python tests/test_bad_inputs.py`` from the repository root."""
    import contextlib
    import io
    import re
    import tempfile
    from pathlib import Path

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    api = ["| case | raises | message |", "|---|---|---|"]
    for case_id, call, error, _ in CASES:
        try:
            call()
        except error as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            api.append(f"| {cell(case_id)} | `{type(exc).__name__}` | {cell(str(message))} |")
        else:
            raise AssertionError(f"{case_id}: raised nothing")
    cli = ["| command | exit | stderr (one line) |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        for args, _ in CLI_CASES:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(args)
            cli.append(f"| `posenc {' '.join(args)}` | {code} | {cell(err.getvalue().strip())} |")
    doc = Path(path)
    text = doc.read_text()
    text = re.sub(r"(## Python API\n\n)(\|.*\n)+", lambda m: m.group(1) + "\n".join(api) + "\n", text)
    text = re.sub(r"(## CLI\n\n)(\|.*\n)+", lambda m: m.group(1) + "\n".join(cli) + "\n", text)
    text = re.sub(r"\d+ API cases \+ \d+ CLI cases", f"{len(CASES)} API cases + {len(CLI_CASES)} CLI cases", text)
    text = re.sub(r"on the CLI: \d+ cases", f"on the CLI: {matrix_size()} cases", text)
    doc.write_text(text)


if __name__ == "__main__":
    _write_errors_doc()
