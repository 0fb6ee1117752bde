"""The encoding protocol (posenc.encodings.base): typed hooks, declared model sizes, and the
constructor config each encoding records."""

import pathlib
import re

import pytest

import posenc
from posenc.encodings import (
    ALiBi, ComRoPE, ContextualGRAPE, CoPE, FIRE, FoPE, FoX, GRAPE, GRAPEAdditive, PaTH, LieRE, MHRoPE, IRoPE, Kerple, LearnedAbsolute, MRoPE, NoPE, ProportionalRoPE, RoPE, Shaw, Sinusoidal,
    T5RelativeBias, TransformerXL, VideoRoPE, VORoPE, XPos, AxialRoPE,
)
from posenc.encodings.base import MODEL_SIZES, Hook, PositionalEncoding
from posenc.errors import InvalidArgument

SRC = pathlib.Path(posenc.__file__).parent

#: The hooks of every registered encoding, as docs/encodings.md and base.py's table state them.
HOOKS = {
    "nope": set(), "sinusoidal": {"embed"}, "learned": {"embed"}, "rope": {"rotate"}, "xpos": {"rotate"},
    "alibi": {"score_bias"}, "t5": {"score_bias"}, "kerple": {"score_bias"}, "fire": {"score_bias"},
    "shaw": {"content"}, "transformer_xl": {"content"}, "p_rope": {"rotate"}, "mrope": {"rotate"},
    "axial_rope": {"rotate"}, "irope": {"rotate", "mask"}, "cope": {"content"}, "fox": {"gate"}, "path": {"gate", "content"},
    "fope": {"rotate"}, "liere": {"rotate"}, "comrope": {"rotate"}, "vo_rope": {"rotate"}, "videorope": {"rotate"}, "mhrope": {"rotate"}, "grape": {"rotate"},
    "grape_additive": {"gate", "content"}, "grape_contextual": {"gate", "content"},
}

#: Sizes all different from each other, so that a size passed to the wrong argument shows.
SIZES = dict(d_model=48, num_heads=4, head_dim=12, max_positions=40, num_layers=3)

#: What for_model must call, written out per encoding (the overrides it replaced).
CONSTRUCTOR_CALLS = {
    "nope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: NoPE(),
    "sinusoidal": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: Sinusoidal(d_model),
    "learned": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers:
        LearnedAbsolute(max_positions, d_model),
    "rope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: RoPE(head_dim),
    "xpos": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: XPos(head_dim),
    "p_rope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: ProportionalRoPE(head_dim),
    "mrope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: MRoPE(head_dim),
    "axial_rope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: AxialRoPE(head_dim),
    "alibi": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers:
        ALiBi(num_heads, bidirectional=not causal),
    "t5": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers:
        T5RelativeBias(num_heads, bidirectional=not causal),
    "kerple": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: Kerple(num_heads),
    "fire": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: FIRE(num_heads),
    "shaw": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: Shaw(head_dim),
    "transformer_xl": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers:
        TransformerXL(d_model, num_heads, head_dim),
    "irope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: IRoPE(head_dim),
    "cope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers:
        CoPE(head_dim, num_layers, npos_max=max_positions + 1),
    "fox": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: FoX(d_model, num_heads, num_layers),
    "path": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: PaTH(
        d_model, num_heads, head_dim, num_layers=num_layers, causal=causal),
    "fope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: FoPE(head_dim),
    "liere": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: LieRE(head_dim),
    "comrope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: ComRoPE(head_dim),
    "vo_rope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: VORoPE(head_dim),
    "videorope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: VideoRoPE(head_dim),
    "mhrope": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: MHRoPE(head_dim, num_heads),
    "grape": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: GRAPE(head_dim),
    "grape_additive": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: GRAPEAdditive(
        d_model, num_heads, head_dim, num_layers=num_layers, causal=causal),
    "grape_contextual": lambda d_model, num_heads, head_dim, max_positions, causal, num_layers: ContextualGRAPE(
        d_model, num_heads, head_dim, num_layers=num_layers, causal=causal),
}


def shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# -- hooks -------------------------------------------------------------------------------------

def test_hook_is_a_string_enum():
    assert Hook.ROTATE == "rotate" and str(Hook.ROTATE) == "rotate" and f"{Hook.SCORE_BIAS}" == "score_bias"
    assert "rotate" in frozenset({Hook.ROTATE}) and ", ".join(sorted({Hook.ROTATE, Hook.MASK})) == "mask, rotate"
    assert {h.value for h in Hook} == {"embed", "rotate", "score_bias", "content", "mask", "gate"}


def test_tables_cover_every_registered_encoding():
    assert sorted(HOOKS) == sorted(CONSTRUCTOR_CALLS) == sorted(posenc.available())


@pytest.mark.parametrize("name", posenc.available())
def test_every_registered_encoding_declares_its_hooks_as_hook_members(name):
    hooks = posenc.REGISTRY[name].hooks
    assert isinstance(hooks, frozenset) and all(type(h) is Hook for h in hooks)
    assert {h.value for h in hooks} == HOOKS[name]


@pytest.mark.parametrize("hooks, match", [
    (frozenset({"rotat"}), r"Typo\.hooks: unknown hook 'rotat'; allowed: 'embed', 'rotate', 'score_bias'"),
    (frozenset({Hook.ROTATE, "score-bias"}), "unknown hook 'score-bias'"),
    ("rotate", "must be a set of posenc Hook members"),
    (None, "must be a set of posenc Hook members"),
])
def test_a_misspelt_hook_is_an_error_when_the_class_is_defined(hooks, match):
    with pytest.raises(InvalidArgument, match=match):
        type("Typo", (PositionalEncoding,), {"hooks": hooks, "name": "typo"})


def test_hooks_given_as_their_names_become_hook_members():
    class Content(PositionalEncoding):
        hooks = frozenset({"content"})

    assert Content.hooks == {Hook.CONTENT} and all(type(h) is Hook for h in Content.hooks)


def test_no_module_outside_encodings_checks_a_hook_by_its_string():
    pattern = re.compile(r"""["'](embed|rotate|score_bias|content|mask|gate)["']\s+(not\s+)?in\b[^\n]*hooks"""
                         r"""|hooks\s*&\s*\{\s*["']""")
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


# -- model sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", posenc.available())
def test_for_model_passes_each_constructor_the_sizes_it_declares(name, causal):
    if not causal and posenc.REGISTRY[name].causal_only:  # PaTH: refused by both, at construction
        for build in (lambda: posenc.create_for_model(name, **SIZES, causal=False),
                      lambda: CONSTRUCTOR_CALLS[name](**SIZES, causal=False)):
            with pytest.raises(InvalidArgument, match="causal"):
                build()
        return
    built = posenc.create_for_model(name, **SIZES, causal=causal)
    expected = CONSTRUCTOR_CALLS[name](**SIZES, causal=causal)
    assert type(built) is type(expected)
    assert built.config() == expected.config() and shapes(built) == shapes(expected)


@pytest.mark.parametrize("name", posenc.available())
def test_model_sizes_name_model_sizes_and_constructor_arguments(name):
    cls = posenc.REGISTRY[name]
    assert set(cls.model_sizes.values()) <= set(MODEL_SIZES)
    assert set(cls.model_sizes) <= set(CONSTRUCTOR_CALLS[name](**SIZES, causal=True).config())


@pytest.mark.parametrize("model_sizes, match", [
    (("head_dimm",), r"Sized\.model_sizes: 'head_dimm': 'head_dimm' is not a model size; allowed: d_model, num_heads"),
    ({"dim": "width"}, "'dim': 'width' is not a model size"),
    (("num_heads",), r"'num_heads' is not an argument of its constructor \(head_dim, base\)"),
    ("head_dim", "must be a tuple of model sizes or a mapping"),
])
def test_a_bad_model_sizes_declaration_is_an_error_when_the_class_is_defined(model_sizes, match):
    def __init__(self, head_dim, *, base=10.0):
        PositionalEncoding.__init__(self)

    with pytest.raises(InvalidArgument, match=match):
        type("Sized", (PositionalEncoding,), {"model_sizes": model_sizes, "__init__": __init__})


def test_an_option_that_is_a_declared_size_is_refused():
    with pytest.raises(TypeError, match="multiple values for keyword argument 'dim'"):
        posenc.create_for_model("sinusoidal", **SIZES, dim=8)


def test_irope_keeps_its_own_check_on_top_of_the_sizes():
    with pytest.raises(InvalidArgument, match="no_rope_layers has 2 entries for a model of num_layers=3"):
        posenc.create_for_model("irope", **SIZES, no_rope_layers=[1, 0])


# -- the constructor config --------------------------------------------------------------------

def test_config_is_the_constructor_arguments_by_name_defaults_included():
    rope = RoPE(16, base=500.0, scaling={"rope_type": "linear", "factor": 2.0})
    assert rope.config() == {
        "head_dim": 16, "rotary_dim": None, "partial_rotary_factor": None, "base": 500.0, "interleaved": False,
        "scaling": {"rope_type": "linear", "factor": 2.0}, "dynamic_cache": "rerotate", "hf_layout": None,
        "max_position_embeddings": None,
    }
    # a subclass passing **kwargs to its parent records them flat, once, as its own
    assert XPos(8, gamma=0.3, base=100.0).config() == {"head_dim": 8, "scale_base": 512.0, "gamma": 0.3,
                                                       "center": "query", "base": 100.0}
    assert NoPE().config() == {}


def test_config_is_a_copy_of_what_the_caller_passed():
    scaling = {"rope_type": "linear", "factor": 2.0}
    rope = RoPE(8, scaling=scaling)
    scaling["factor"] = 3.0
    rope.config()["scaling"]["factor"] = 4.0
    assert rope.config()["scaling"] == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize("name", posenc.available())
def test_config_rebuilds_the_encoding(name):
    encoding = posenc.create_for_model(name, **SIZES)
    twin = type(encoding)(**encoding.config())
    assert twin.config() == encoding.config() and shapes(twin) == shapes(encoding)


@pytest.mark.parametrize("name", posenc.available())
def test_options_for_model_of_an_encoding_built_for_the_model_are_the_options_given(name):
    assert posenc.create_for_model(name, **SIZES).options_for_model(**SIZES) == {}


@pytest.mark.parametrize("encoding, options", [
    (T5RelativeBias(4), {"bidirectional": True}),  # the constructor's default, not a causal model's
    (ALiBi(4, bidirectional=False), {}),  # what for_model derives for a causal model
    (CoPE(12, 3, npos_max=9), {"npos_max": 9}),
    (RoPE(12, base=10000.0), {"base": 10000.0}),  # given, though the default
    (XPos(12, gamma=0.3, interleaved=True), {"gamma": 0.3, "interleaved": True}),
])
def test_options_for_model_keep_what_differs_from_the_model_defaults(encoding, options):
    assert encoding.options_for_model(**SIZES) == options
    rebuilt = posenc.create_for_model(encoding.name, **SIZES, **options)
    assert rebuilt.config() == encoding.config()


@pytest.mark.parametrize("encoding, match", [
    (RoPE(8), "RoPE was built with head_dim=8, the model has head_dim=12"),
    (LearnedAbsolute(10, 48), "LearnedAbsolute was built with num_positions=10, the model has max_positions=40"),
    (FoX(48, 4), "FoX was built with num_layers=1, the model has num_layers=3"),
])
def test_options_for_model_refuse_an_encoding_of_other_sizes(encoding, match):
    with pytest.raises(InvalidArgument, match=match):
        encoding.options_for_model(**SIZES)
