"""iRoPE (Llama 4): the layer schedule, chunked attention by position, attention temperature
tuning, against float64 loops and transformers' Llama4TextModel; the positions contract with
chunks and temperatures small enough to matter."""

from __future__ import annotations

import cmath
import math
import warnings

import pytest
import torch

import posenc
from posenc.encodings.nope import NoPE
from posenc.encodings.irope import AttentionTemperature, ChunkedRoPE, IRoPE, attention_temperature
from posenc.mask_rules import same_chunk
from posenc.lab.model import KVCache, document_mask, key_padding_mask, positions_from_document_ids, positions_from_padding_mask
from test_positions_contract import TOL, decode_with_cache, tiny_lm
from loop_reference import softmax_average

BACKENDS = ("eager", "sdpa", "blocked", "flex")
#: flex compiles or builds a block mask per call: seconds per test on a CPU.
SLOW_FLEX = ("eager", "sdpa", "blocked", pytest.param("flex", marks=pytest.mark.slow))
#: A 2-layer schedule with one RoPE and one NoPE layer, chunks and temperature steps of a few tokens.
SMALL = dict(no_rope_layers=[1, 0], attention_chunk_size=4, floor_scale=3, attn_scale=0.5)


# -- the formulas against float64 loops ------------------------------------------------------

def temperature_reference(p: int, floor_scale: int, attn_scale: float) -> float:
    return math.log1p(math.floor((p + 1) / floor_scale)) * attn_scale + 1.0


@pytest.mark.parametrize("floor_scale, attn_scale", [(8192, 0.1), (3, 0.5), (1, 0.1), (7, 0.0)])
def test_temperature_matches_the_float64_loop(floor_scale, attn_scale):
    positions = torch.cat((torch.arange(100), torch.tensor([8190, 8191, 8192, 16383, 16384, 10**6, 2**40])))
    got = attention_temperature(positions, floor_scale=floor_scale, attn_scale=attn_scale)
    expected = torch.tensor([temperature_reference(p, floor_scale, attn_scale) for p in positions.tolist()],
                            dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-15, atol=0)


def test_temperature_is_one_below_floor_scale_and_steps_at_its_multiples():
    tau = attention_temperature(torch.tensor([0, 8190, 8191, 16382, 16383]))  # Llama 4's defaults
    assert tau.tolist()[:2] == [1.0, 1.0]
    assert tau[2].item() == pytest.approx(1 + 0.1 * math.log(2)) and tau[3].item() == tau[2].item()
    assert tau[4].item() == pytest.approx(1 + 0.1 * math.log(3))


@pytest.mark.parametrize("shape", [(11,), (2, 11)])
def test_the_nope_layer_scales_queries_by_position_and_leaves_keys(shape):
    layer = AttentionTemperature(floor_scale=3, attn_scale=0.5)
    q, k = torch.randn(2, 4, 11, 8, dtype=torch.float64), torch.randn(2, 2, 11, 8, dtype=torch.float64)
    positions = torch.arange(11).expand(shape) + (torch.tensor([[0], [5]]) if len(shape) == 2 else 0)
    q2, k2 = layer.rotate(q, k, positions, positions)
    assert k2 is k
    rows = positions if positions.dim() == 2 else positions.expand(2, -1)
    for b in range(2):
        for i, p in enumerate(rows[b].tolist()):
            torch.testing.assert_close(q2[b, :, i], q[b, :, i] * temperature_reference(p, 3, 0.5), rtol=1e-15, atol=0)


def test_same_chunk_matches_the_loop():
    q, k = torch.tensor([0, 3, 4, 7, 8, 13]), torch.arange(15)
    got = same_chunk(q.unsqueeze(-1), k.unsqueeze(0), 4)
    expected = [[qp // 4 == kp // 4 for kp in k.tolist()] for qp in q.tolist()]
    assert got.tolist() == expected


def rotate_interleaved(x: torch.Tensor, position: int, base: float) -> list[complex]:
    """Llama 4's rotation written out: pairs (2i, 2i + 1) as complex numbers times e^{i p theta_i}."""
    d = x.shape[-1]
    return [complex(float(x[2 * i]), float(x[2 * i + 1])) * cmath.exp(1j * position * base ** (-2 * i / d))
            for i in range(d // 2)]


def chunked_rope_reference(q, k, v, q_pos, k_pos, chunk, base):
    """float64 loops over (b, h, i, j): RoPE logits (real part of sum q_i conj(k_j)), keys allowed
    iff causal by index and q_pos // chunk == k_pos // chunk; zeros for a query without keys."""
    B, H, Tq, D = q.shape
    Tk, groups = k.shape[2], q.shape[1] // k.shape[1]
    out = torch.zeros(B, H, Tq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            keys = [rotate_interleaved(k[b, h // groups, j], k_pos[b][j], base) for j in range(Tk)]
            for i in range(Tq):
                qi = rotate_interleaved(q[b, h, i], q_pos[b][i], base)
                allowed = [j for j in range(Tk) if j <= i + Tk - Tq and q_pos[b][i] // chunk == k_pos[b][j] // chunk]
                if not allowed:
                    continue
                logits = [sum((a * c.conjugate()).real for a, c in zip(qi, keys[j])) / math.sqrt(D) for j in allowed]
                out[b, h, i] = softmax_average(logits, [v[b, h // groups, j] for j in allowed])
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("positions", ["default", "offset", "per_row"])
def test_chunked_rope_attention_matches_the_loop(backend, positions):
    enc = ChunkedRoPE(8, attention_chunk_size=4, base=100.0, interleaved=True)
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g)
    k_pos = {"default": torch.arange(11), "offset": torch.arange(11) + 6,
             "per_row": torch.stack((torch.arange(11) + 3, torch.arange(11)))}[positions]
    q_pos = k_pos[..., 6:]
    out = posenc.attention(q, k, v, enc, q_positions=q_pos, k_positions=k_pos, backend=backend)
    rows = lambda p: (p if p.dim() == 2 else p.expand(2, -1)).tolist()  # noqa: E731
    torch.testing.assert_close(out.double(), chunked_rope_reference(q, k, v, rows(q_pos), rows(k_pos), 4, 100.0),
                               rtol=1e-5, atol=1e-5)
    # the mask matters: plain RoPE attends across chunks
    plain = posenc.attention(q, k, v, posenc.create("rope", head_dim=8, base=100.0, interleaved=True),
                             q_positions=q_pos, k_positions=k_pos, backend=backend)
    assert (plain - out).abs().max() > 1e-2


# -- the schedule ----------------------------------------------------------------------------

def test_default_schedule_is_a_nope_layer_every_fourth():
    enc = posenc.create("irope", head_dim=8)
    kinds = [enc.uses_rope(i) for i in range(12)]
    assert kinds == [True, True, True, False] * 3
    assert [type(enc.for_layer(i)) for i in (0, 3)] == [ChunkedRoPE, AttentionTemperature]
    assert enc.for_layer(0) is enc.for_layer(5)  # one shared instance per kind
    enc2 = posenc.create("irope", head_dim=8, no_rope_layer_interval=2, attn_temperature_tuning=False,
                         attention_chunk_size=None)
    assert [type(enc2.for_layer(i)) for i in range(4)] == [posenc.RoPE, NoPE] * 2


def test_no_rope_layers_keeps_transformers_meaning_one_is_a_rope_layer():
    enc = posenc.create("irope", head_dim=8, no_rope_layers=[0, 1, 1])
    assert [enc.uses_rope(i) for i in range(3)] == [False, True, True]
    with pytest.raises(ValueError, match="layer 3 is past no_rope_layers, which schedules 3 layers"):
        enc.for_layer(3)


def test_llama4_defaults_and_layout():
    enc = posenc.create("irope", head_dim=128)
    rope = enc.for_layer(0)
    assert (rope.attention_chunk_size, rope.base, rope.interleaved, rope.scaling) == (8192, 500000.0, True, None)
    assert (enc.for_layer(3).floor_scale, enc.for_layer(3).attn_scale) == (8192, 0.1)
    assert enc.max_positions is None and enc.call_invariant


def test_called_directly_it_is_its_rope_layers():
    enc = posenc.create("irope", head_dim=8, attention_chunk_size=4)
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    torch.testing.assert_close(posenc.attention(q, k, v, enc), posenc.attention(q, k, v, enc.for_layer(0)), rtol=0, atol=0)


def test_options_for_train_len_scale_chunk_and_temperature_step():
    assert IRoPE.options_for_train_len(64) == {"attention_chunk_size": 16, "floor_scale": 16}
    assert IRoPE.options_for_train_len(2) == {"attention_chunk_size": 1, "floor_scale": 1}
    assert posenc.RoPE.options_for_train_len(64) == {}
    from posenc.lab.experiments.extrapolation_config import preset_config

    config = preset_config("full", train_len=128, steps=1)
    assert "irope" in config.encodings
    built = config.encoding("irope")
    assert built.for_layer(0).attention_chunk_size == 32 and built.floor_scale == 32
    assert config.encoding("rope") == "rope"


# -- backends against eager, values and gradients --------------------------------------------

@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("backend", ["sdpa", "blocked", "flex"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_backends_agree_with_eager(layer, backend, with_mask):
    enc = posenc.create("irope", head_dim=8, **SMALL).for_layer(layer)
    positions = torch.stack((torch.arange(13), torch.tensor([0] * 3 + list(range(10)))))
    mask = key_padding_mask(torch.arange(13).expand(2, -1) >= torch.tensor([[0], [3]])) if with_mask else None
    args = [torch.randn(2, 4, 13, 8, requires_grad=backend != "flex") for _ in range(3)]

    def run(name):
        out = posenc.attention(*args, enc, q_positions=positions, k_positions=positions, mask=mask, backend=name)
        if backend == "flex":
            return out, []
        return out, torch.autograd.grad(out.square().sum(), args)

    (ref, ref_grads), (got, got_grads) = run("eager"), run(backend)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", SLOW_FLEX)
def test_attention_with_both_kinds_of_layer_compiles_in_one_graph(backend):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    enc = posenc.create("irope", head_dim=8, **SMALL)
    q, k, v = (torch.randn(2, 4, 12, 8) for _ in range(3))
    for layer in (0, 1):
        sub = enc.for_layer(layer)
        compiled = torch.compile(lambda q, k, v: posenc.attention(q, k, v, sub, backend=backend),
                                 backend="eager", fullgraph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(q, k, v)
        torch.testing.assert_close(got, posenc.attention(q, k, v, sub, backend=backend), rtol=1e-5, atol=1e-5)
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    torch._dynamo.reset()


# -- the positions contract with chunks and temperatures that matter -------------------------

def small_lm(backend="auto", **overrides):
    return tiny_lm("irope", backend, **{**SMALL, **overrides})


@pytest.mark.parametrize("backend", SLOW_FLEX)
def test_cached_decoding_equals_the_full_pass(backend):
    model = small_lm(backend)
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        torch.testing.assert_close(decode_with_cache(model, tokens, 1), full, **TOL)
        torch.testing.assert_close(decode_with_cache(model, tokens, 7), full, **TOL)
        # and both the chunks and the temperature change the logits
        for off in (dict(attention_chunk_size=None), dict(attn_temperature_tuning=False)):
            other = small_lm(backend, **off)
            other.load_state_dict(model.state_dict())
            assert (other(tokens) - full).abs().max() > 1e-3, off


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_packed_documents_equal_each_document_alone(backend):
    """Chunks follow positions, which restart per document: each document's chunks start at
    its first token (transformers' follow the packed row's index instead)."""
    model = small_lm(backend)
    lengths = [[5, 7, 4], [9, 1, 6]]
    docs = [[torch.randint(0, 256, (n,)) for n in row] for row in lengths]
    tokens = torch.stack([torch.cat(row) for row in docs])
    ids = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in lengths])
    with torch.no_grad():
        packed = model(tokens, positions_from_document_ids(ids), mask=document_mask(ids))
        for b, row in enumerate(docs):
            start = 0
            for doc in row:
                torch.testing.assert_close(packed[b, start:start + len(doc)], model(doc.unsqueeze(0))[0], **TOL)
                start += len(doc)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "blocked"])
def test_left_padded_rows_equal_the_unpadded_rows(backend):
    model = small_lm(backend)
    lengths, width = [12, 7, 1], 12
    rows = [torch.randint(0, 256, (n,)) for n in lengths]
    tokens = torch.full((3, width), 7, dtype=torch.long)
    padding = torch.zeros(3, width, dtype=torch.bool)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):], padding[b, width - len(row):] = row, True
    with torch.no_grad():
        padded = model(tokens, positions_from_padding_mask(padding), mask=key_padding_mask(padding))
        for b, row in enumerate(rows):
            torch.testing.assert_close(padded[b, width - len(row):], model(row.unsqueeze(0))[0], **TOL)
    assert torch.isfinite(padded).all()


def test_generate_with_a_cache_equals_generate_without():
    model = small_lm()
    prompt = torch.randint(0, 256, (2, 5))
    cached = model.generate(prompt, 9)
    with torch.no_grad():
        tokens = prompt
        for _ in range(9):
            tokens = torch.cat((tokens, model(tokens)[:, -1:].argmax(-1)), 1)
    assert torch.equal(cached, tokens)


def test_model_trains_and_checkpoints_its_schedule(tmp_path):
    model = small_lm()
    model.train()
    tokens = torch.randint(0, 256, (2, 17))
    loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    model.save(tmp_path / "m.pt")
    loaded = posenc.lab.model.TransformerLM.from_checkpoint(tmp_path / "m.pt")
    assert loaded.encoding.no_rope_layers == [1, 0] and loaded.encoding.for_layer(0).attention_chunk_size == 4
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model.eval()(tokens), rtol=0, atol=0)


# -- parity with transformers' Llama 4 -------------------------------------------------------

SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
              "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}


def llama4_text_model(**overrides):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4.modeling_llama4 import Llama4TextModel

    settings = dict(vocab_size=64, hidden_size=32, intermediate_size=16, intermediate_size_mlp=16,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    no_rope_layers=[1, 0], attention_chunk_size=4, floor_scale=3, attn_scale=0.5,
                    num_local_experts=2, rope_parameters=SCOUT_ROPE, attn_implementation="eager")
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers warns on Scout's low_freq_factor == high_freq_factor
        config = transformers.Llama4TextConfig(**settings)
        torch.manual_seed(0)
        return Llama4TextModel(config).float().eval()


def attention_io(model, input_ids):
    """Each decoder layer's attention input (after its RMSNorm) and output (after o_proj)."""
    seen, handles = {}, []
    for index, layer in enumerate(model.layers):
        def keep(module, args, kwargs, out, index=index):
            seen[index] = (kwargs["hidden_states"], out[0])
        handles.append(layer.self_attn.register_forward_hook(keep, with_kwargs=True))
    with torch.no_grad():
        model(input_ids)
    for handle in handles:
        handle.remove()
    return seen


def posenc_attention_layer(attn, hidden, encoding, backend):
    """transformers' q/k/v/o projections around posenc.attention with the layer's encoding. The
    qk-norm of the RoPE layers (an L2 norm, no weight) is applied before the rotation, which
    preserves the norm of every pair: transformers applies it after."""
    batch, length, _ = hidden.shape
    heads, kv_heads, dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
    q = attn.q_proj(hidden).view(batch, length, heads, dim).transpose(1, 2)
    k = attn.k_proj(hidden).view(batch, length, kv_heads, dim).transpose(1, 2)
    v = attn.v_proj(hidden).view(batch, length, kv_heads, dim).transpose(1, 2)
    if hasattr(attn, "qk_norm"):
        q, k = attn.qk_norm(q), attn.qk_norm(k)
    out = posenc.attention(q, k, v, encoding, backend=backend)
    return attn.o_proj(out.transpose(1, 2).reshape(batch, length, heads * dim))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_matches_transformers_llama4_layer_by_layer(backend):
    """A tiny random Llama4TextModel (fp32, eager attention; layer 0 RoPE with chunks of 4 and
    Scout's llama3 scaling, layer 1 NoPE with temperature steps of 3; qk-norm on; T = 11):
    each layer's attention output from posenc.attention with IRoPE.from_hf_config's
    for_layer(i), to 1e-5."""
    model = llama4_text_model()
    encoding = IRoPE.from_hf_config(model.config.to_dict())
    assert encoding.no_rope_layers == [1, 0] and encoding.rope_scaling["factor"] == 16.0
    assert model.config.layer_types == ["chunked_attention", "full_attention"]
    input_ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(0))
    seen = attention_io(model, input_ids)
    with torch.no_grad():
        for index, layer in enumerate(model.layers):
            hidden, expected = seen[index]
            got = posenc_attention_layer(layer.self_attn, hidden, encoding.for_layer(index), backend)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            # what makes each layer iRoPE shows at this size: the chunks, the temperature, the layout
            wrong = {0: [IRoPE(8, attention_chunk_size=None, rope_scaling=encoding.rope_scaling),
                         IRoPE(8, attention_chunk_size=4, rope_scaling=encoding.rope_scaling, interleaved=False)],
                     1: [NoPE()]}[index]
            for other in wrong:
                other_out = posenc_attention_layer(layer.self_attn, hidden, other.for_layer(0) if index == 0 else other, backend)
                assert (other_out - expected).abs().max() > 1e-4


def test_default_schedule_matches_transformers():
    model = llama4_text_model(no_rope_layers=None, num_hidden_layers=8)
    encoding = IRoPE.from_hf_config(model.config.to_dict())
    assert [int(encoding.uses_rope(i)) for i in range(8)] == model.config.no_rope_layers


@pytest.mark.slow  # ~20 s of tracing on a CPU
def test_lm_with_both_kinds_of_layer_compiles_without_breaks_or_recompiles():
    from posenc.lab.model import LMConfig, TransformerLM

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    config = LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2, max_positions=64)
    model = TransformerLM(config, posenc.create_for_model("irope", **config.encoding_sizes(), **SMALL))
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    for length in (9, 14):
        tokens = torch.randint(0, 32, (2, length + 1))
        losses = []
        for m in (model, compiled):
            logits = m(tokens[:, :-1])
            losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_use_encoding_gives_each_transformers_layer_its_schedule_entry():
    transformers = pytest.importorskip("transformers")
    from posenc.integrations.transformers import use_encoding

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = use_encoding(transformers.LlamaForCausalLM(config).eval(), "irope", **SMALL)
    encoding = model.model.posenc_encoding
    assert [layer.self_attn.__dict__["_posenc_encoding"] for layer in model.model.layers] == \
        [encoding.for_layer(0), encoding.for_layer(1)]
    prompt = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False))


def test_from_hf_config_reads_absent_keys_at_transformers_defaults():
    """A config.json leaving out Llama 4's positional keys (theta, head_dim, chunk, schedule,
    temperature): IRoPE.from_hf_config takes Llama4TextConfig's defaults, the ones the Llama 4
    family record reads too; the reference is the class's own to_dict() of the same config."""
    transformers = pytest.importorskip("transformers")

    sparse = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = transformers.Llama4TextConfig(**sparse).to_dict()
    got, expected = IRoPE.from_hf_config(sparse), IRoPE.from_hf_config(full)
    assert got.head_dim == expected.head_dim == full["head_dim"]
    assert [got.uses_rope(i) for i in range(8)] == [bool(flag) for flag in full["no_rope_layers"]]
    for layer in (0, 3):  # a RoPE layer (theta, chunk) and a NoPE one (the temperature)
        mine, theirs = got.for_layer(layer), expected.for_layer(layer)
        assert type(mine) is type(theirs) and mine.config() == theirs.config(), layer
    assert got.for_layer(0).base == full["rope_parameters"]["rope_theta"]
    assert got.for_layer(3).floor_scale == full["floor_scale"] and got.for_layer(3).attn_scale == full["attn_scale"]
