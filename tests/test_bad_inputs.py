"""The bad-input matrix (docs/errors.md): every public constructor, function and CLI command,
each invalid argument -> an error of the documented type whose message names the argument
(and, where there is a list, the allowed values). The CLI prints one line and exits 2."""

import math
import os

import pytest
import torch

import posenc
import posenc.rope
from posenc.cli import main
from posenc.data import CorpusError, load_corpus
from posenc.experiments.extrapolation import ExtrapolationConfig, preset_config
from posenc.model import LMConfig, TransformerLM
from posenc.train import TrainConfig

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
    ("attention backend", attn(backend="flash"), ValueError, r"backend must be one of \('auto', 'eager', 'sdpa', 'blocked', 'flex'\)"),
    ("attention encoding type", attn(encoding="rope"), TypeError, r"encoding must be a posenc.PositionalEncoding"),
    ("attention float positions", attn(q_positions=torch.zeros(3)), TypeError, r"q_positions must have an integer dtype"),
    ("attention bool positions", attn(k_positions=torch.ones(3, dtype=torch.bool)), TypeError, r"k_positions must have an integer dtype"),
    ("attention negative positions", attn(k_positions=torch.tensor([-1, 0, 1])), ValueError, r"k_positions must be >= 0"),
    ("attention positions length", attn(q_positions=torch.arange(4)), ValueError, r"q_positions must have shape \(3,\) or \(1, 3\)"),
    ("attention positions rank", attn(q_positions=torch.zeros(1, 1, 3, dtype=torch.long)), ValueError, r"q_positions must have shape \(T,\) or \(B, T\)"),
    ("attention positions list", attn(q_positions=[0, 1, 2]), TypeError, r"q_positions must be an integer torch.Tensor"),
    ("attention sdpa with shaw", attn(encoding=posenc.create("shaw", head_dim=8), backend="sdpa"), ValueError, r"backend='sdpa' cannot add a content term"),
    # -- LMConfig / TransformerLM -------------------------------------------------------------
    *[(f"LMConfig {f}={v!r}", (lambda f=f, v=v: LMConfig(**{f: v})), ValueError, rf"{f} must be an integer >= 1")
      for f in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio", "max_positions") for v in (0, 2.0, True)],
    ("LMConfig heads divide", lambda: LMConfig(d_model=64, num_heads=3), ValueError, r"d_model=64 must be divisible by num_heads=3"),
    ("LMConfig backend", lambda: LMConfig(backend="flex2"), ValueError, r"backend must be one of"),
    ("TransformerLM unknown encoding", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), "rotary"), ValueError, r"unknown encoding 'rotary'"),
    ("TransformerLM encoding type", lambda: TransformerLM(LMConfig(d_model=16, num_heads=2, num_layers=1), 3), TypeError, r"encoding must be a posenc.PositionalEncoding or a registered name"),
    ("TransformerLM config type", lambda: TransformerLM({"d_model": 16}, "rope"), TypeError, r"config must be a posenc.model.LMConfig"),
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
    # -- ExtrapolationConfig / preset_config ---------------------------------------------------
    ("preset unknown", lambda: preset_config("huge"), ValueError, r"preset must be one of \['quick', 'default', 'full'\]"),
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
    ("config model type", lambda: ExtrapolationConfig(model={"d_model": 64}), TypeError, r"model must be a posenc.model.LMConfig, got dict"),
    ("config train type", lambda: ExtrapolationConfig(train=None), TypeError, r"train must be a posenc.train.TrainConfig, got NoneType"),
    ("config extension_methods str", lambda: ExtrapolationConfig(extension_methods="yarn"), TypeError, r"extension_methods \(--rope-scaling\) must be a sequence"),
    ("config extension_methods unknown", lambda: ExtrapolationConfig(extension_methods=("su",)), ValueError, r"extension_methods \(--rope-scaling\): unknown method\(s\) \['su'\]"),
    # -- load_corpus -----------------------------------------------------------------------------
    ("corpus missing", lambda: load_corpus("/no/such/corpus"), CorpusError, r"corpus: /no/such/corpus does not exist"),
    ("corpus type", lambda: load_corpus(123), TypeError, r"path must be a str or os.PathLike \(a file or folder\), got int"),
    *[(f"corpus val_fraction={v!r}", (lambda v=v: load_corpus(None, val_fraction=v)), ValueError, r"val_fraction must be in \(0, 1\)") for v in (0.0, 1.0, NAN, "0.1")],
    # -- plots.plot_encoding / posenc.rope.from_hf_config ----------------------------------------
    ("plot_encoding unknown", lambda: __import__("posenc.plots").plots.plot_encoding("rotary", "x.png"), ValueError, r"unknown encoding 'rotary'; available"),
    ("plot_encoding bad option", lambda: __import__("posenc.plots").plots.plot_encoding("kerple", "x.png", variant="exp"), ValueError, r"variant must be one of"),
    ("plot_encoding bad size", lambda: __import__("posenc.plots").plots.plot_encoding("rope", "x.png", head_dim=7), ValueError, r"head_dim must be a positive even integer"),
    ("from_hf_config not dict", lambda: posenc.rope.from_hf_config("config.json"), TypeError, r"config must be a dict"),
    ("from_hf_config no head_dim", lambda: posenc.rope.from_hf_config({"rope_theta": 10000.0}), KeyError, r"head_dim"),
    ("from_hf_config bad theta", lambda: posenc.rope.from_hf_config({"head_dim": 8, "rope_theta": 0.5}), ValueError, r"rope_theta"),
    ("from_hf_config bad scaling", lambda: posenc.rope.from_hf_config({"head_dim": 8, "rope_scaling": {"rope_type": "yarn2", "factor": 2.0}}), ValueError, r"unknown rope_type 'yarn2'"),
]


@pytest.mark.parametrize("call, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(call, error, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plot cases never write into the checkout
    with pytest.raises(error, match=match):
        call()


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
    (["extrapolate", "--no-such-option"], "no-such-option"),
    (["plot", "rotary"], "unknown encoding 'rotary'; available"),
    (["plot"], "Missing argument 'name'"),
    (["frobnicate"], "frobnicate"),
]


@pytest.mark.parametrize("args, match", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_bad_arguments(args, match, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
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
