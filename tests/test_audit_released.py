"""``posenc audit`` on released config.json files (tests/data/configs, sources in SOURCES.md).

Every file ends in exit 0 (posenc reads it and the audit model agrees layer by layer) or exit 2
with the reason named (a family posenc does not read, a key the family needs); never 1 (a
false alarm) and never an internal error. Short inputs by default (the shrunk models are built
three times each); every file at the default length behind ``slow``.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from posenc.encodings import RoPE
from posenc.errors import InvalidArgument
from posenc.integrations import audit as audit_module
from posenc.lab.cli import main

CONFIGS = Path(__file__).parent / "data" / "configs"

#: file -> the reason of a refusal (a substring of the error), or None: read, exit 0.
EXPECTED = {
    "aya-23-8b": None,
    "chatglm3-6b": "'chatglm'",
    "codellama-7b": None,
    "deepseek-v2-lite": None,
    "falcon-7b-refinedwebmodel": "'n_head'",
    "gemma-2-2b": None,
    "gemma-2-9b": None,
    "gemma-2b": None,
    "gemma-3-1b-it": None,
    "gpt-j-6b": None,
    "gpt2": None,
    "llama-2-7b": None,
    "llama-3.1-8b": None,
    "llama-3.2-1b": None,
    "llava-1.5-7b": "'num_hidden_layers'",
    # model_type "ministral3" over a Mistral 3 wrapper's keys (text_config): transformers reads it as a
    # Ministral3Config of its class defaults (34 layers of 4096); posenc names the key it lacks
    "ministral-3-3b-2512": "'num_hidden_layers'",
    "mistral-7b-v0.1": None,
    "mistral-7b-v0.3": None,
    "mixtral-8x7b-v0.1": None,
    "olmo-2-7b": None,
    "phi-2-msft": "'num_hidden_layers'",
    "phi-3.5-mini": None,
    "phi-3.5-vision": "'phi3_v'",
    "phi-4-mini-instruct": None,
    "qwen1.5-1.8b-chat": None,
    "qwen1.5-moe-a2.7b": None,
    "qwen2.5-3b": None,
    "qwen3-0.6b": None,
    "redpajama-incite-3b-v1": None,
    "stablelm-2-zephyr-1.6b": None,
    "starcoder2": None,
    "tinyllama-1.1b-chat-v1.0": None,
}
#: one file per family read, run by default (the rest behind ``slow``)
DEFAULT = {"gemma-2-9b", "gemma-3-1b-it", "gpt-j-6b", "gpt2", "llama-3.1-8b", "mistral-7b-v0.1", "phi-3.5-mini",
           "qwen2.5-3b", "redpajama-incite-3b-v1", "stablelm-2-zephyr-1.6b", "aya-23-8b"}


def _cases(length):
    marks = lambda name: () if EXPECTED[name] is not None or name in DEFAULT else (pytest.mark.slow,)
    return [pytest.param(name, length, marks=marks(name) if length is not None else (pytest.mark.slow,),
                         id=f"{name}-{length or 'default'}")
            for name in sorted(EXPECTED)]


def _audit(name, length):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return audit_module.audit(CONFIGS / f"{name}.json", length=length)


def test_every_gathered_file_is_listed():
    assert sorted(path.stem for path in CONFIGS.glob("*.json")) == sorted(EXPECTED)
    sources = (CONFIGS / "SOURCES.md").read_text("utf-8")
    assert all(f"`{name}.json`" in sources for name in EXPECTED)


@pytest.mark.parametrize("name, length", _cases(64) + _cases(None))
def test_a_released_file_exits_0_or_2_with_a_named_reason(name, length):
    reason = EXPECTED[name]
    if reason is None:
        report = _audit(name, length)
        assert report.ok, [(row.plan, row.max_diff, row.tolerance, row.disagreement) for row in report.rows]
    else:
        with pytest.raises(InvalidArgument, match=reason.replace(".", r"\.")):
            _audit(name, length)


#: DeepSeek-V3's released config.json (deepseek-ai/DeepSeek-V3), its positional and MLA / MoE keys:
#: the audit died inside transformers on it ("The size of tensor a (2) must match the size of
#: tensor b (4)": MLA expands its latent to one key/value head per query head).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
    "num_hidden_layers": 61, "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_group": 8, "topk_group": 4,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "max_position_embeddings": 163840,
    "rope_theta": 10000, "vocab_size": 129280, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
#: Kimi K2 (moonshotai/Kimi-K2-Instruct): DeepSeek-V3's class under model_type kimi_k2.
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "n_routed_experts": 384, "num_attention_heads": 64,
           "rope_theta": 50000.0, "rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "factor": 32.0, "beta_fast": 1.0,
                                                   "beta_slow": 1.0}}


@pytest.mark.parametrize("config", [DEEPSEEK_V3, KIMI_K2], ids=["deepseek-v3", "kimi-k2"])
def test_mla_models_are_built_and_audited(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_module.audit(config, length=32)
    assert report.ok and report.num_layers == 61 and "yarn" in report.rows[0].plan
    assert "heads 2/2" in report.sizes  # MLA: as many key/value heads as query heads


def test_the_cli_exit_codes_on_released_files(capsys):
    assert main(["audit", str(CONFIGS / "gpt2.json"), "--length", "16"]) == 0
    assert main(["audit", str(CONFIGS / "chatglm3-6b.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error:") and "chatglm" in err


#: Gemma 3 4B-it's released config.json (google/gemma-3-4b-it): a wrapper whose text_config
#: names neither head_dim nor head counts (the class's defaults: 256, 8 / 4). The audit said
#: "cannot read its head width" although position_plan reads it.
GEMMA3_4B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 255999,
    "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256,
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}
#: BLOOM-176B's released config.json (bigscience/bloom): its width is spelled n_embed.
BLOOM_176B = {
    "architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 14336, "n_layer": 70,
    "num_attention_heads": 112, "pretraining_tp": 4, "slow_but_exact": False, "vocab_size": 250880,
    "apply_residual_connection_post_layernorm": False, "attention_softmax_in_fp32": True, "layer_norm_epsilon": 1e-05,
}


@pytest.mark.parametrize("config, head_dim", [pytest.param(GEMMA3_4B_IT, 256, marks=pytest.mark.slow),  # 10 s
                                             (BLOOM_176B, 128)], ids=["gemma-3-4b-it", "bloom-176b"])
def test_the_head_width_is_read_as_position_plan_reads_it(config, head_dim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_module.audit(config, length=48)
    assert report.ok and report.sizes.endswith(f"head_dim {head_dim}")


def _gemma4(**keys):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("gemma4_text", num_hidden_layers=35, **keys).to_dict()
    config["per_layer_config"] = {}  # its wider full-attention heads: see the next test
    return config


@pytest.mark.parametrize("keys", [
    {"num_kv_shared_layers": 20},  # Gemma 4 E2B: "The set of layer types producing a cache is different ..."
    {"enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704},  # 26B-A4B
], ids=["kv-shared", "moe"])
def test_gemma4_shapes_are_built(keys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_module.audit(_gemma4(**keys), length=48)
    assert report.ok


def test_a_plan_the_model_cannot_take_is_exit_2_named(monkeypatch):
    """Gemma 4's per_layer_config gives its full-attention layers wider heads (512) than its
    sliding ones (256). position_plan reads each layer's width (the default config audits
    clean); a plan that reads 256 everywhere, as posenc's reader once did, is one the model
    cannot take: the audit says so (exit 2), no internal error."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("gemma4_text").to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert audit_module.audit(config, length=32).ok
    read = audit_module._quiet_plan

    def narrow_plan(cfg):  # every RoPE layer 256 wide: the old misreading of the global layers
        plan = read(cfg)
        narrow = next(layer.encoding for layer in plan if isinstance(layer.encoding, RoPE) and layer.encoding.head_dim == 256)
        layers = tuple(dataclasses.replace(layer, encoding=narrow) if isinstance(layer.encoding, RoPE) else layer
                       for layer in plan)
        return dataclasses.replace(plan, layers=layers)

    monkeypatch.setattr(audit_module, "_quiet_plan", narrow_plan)
    with warnings.catch_warnings(), pytest.raises(InvalidArgument, match="head_dim=256 differs from the model.s head_dim=512"):
        warnings.simplefilter("ignore")
        audit_module.audit(config, length=32)


def _default_configs():
    from posenc.hf_config.families import FAMILIES

    return sorted(FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", _default_configs())
def test_each_family_s_default_config_exits_0_or_2(model_type):
    """AutoConfig.for_model(model_type) of every family posenc reads: read and matching, or
    refused with a reason; never a mismatch, never an internal error."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = audit_module.audit(config, length=48)
        except InvalidArgument as err:
            assert str(err)
            return
    assert report.ok, [(row.plan, row.max_diff, row.tolerance, row.disagreement) for row in report.rows]


#: Bamba-9B-shaped (ibm-ai-platform/Bamba-9B's sizes): a Mamba-2 mixer whose config class
#: validates mamba_n_heads x mamba_d_head == mamba_expand x hidden_size; attention (RoPE on half
#: of each head) at layers 9, 18 and 27.
BAMBA_9B = {
    "architectures": ["BambaForCausalLM"], "model_type": "bamba", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "attn_layer_indices": [9, 18, 27], "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128,
    "mamba_expand": 2, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_chunk_size": 256, "rope_theta": 10000.0,
    "max_position_embeddings": 262144,
}
#: Granite-4.0-H-Tiny-shaped (GraniteMoeHybrid; 8 of its 40 layers, one of them attention, with
#: RoPE switched on): Mamba-2 heads validated as Bamba's, 64 experts, 6 per token.
GRANITE_4_H = {
    "model_type": "granitemoehybrid", "hidden_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 12,
    "num_key_value_heads": 4, "intermediate_size": 512, "shared_intermediate_size": 1024, "vocab_size": 100352,
    "num_local_experts": 64, "num_experts_per_tok": 6, "position_embedding_type": "rope", "rope_theta": 10000.0,
    "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 2, "mamba_n_heads": 48, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1,
}
#: DeepSeek-V2-Lite-shaped, with num_experts_per_tok left to DeepseekV2Config's default (None):
#: its router calls topk(k=None) unless the audit model routes one expert per token.
DEEPSEEK_V2_DEFAULT_TOPK = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_experts_per_tok": None, "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "topk_method": "greedy",
    "vocab_size": 102400, "intermediate_size": 10944,
}


#: dots.llm1 with Dots1Config's default expert counts (None: transformers builds no experts of None).
DOTS1_DEFAULT_EXPERTS = {
    "model_type": "dots1", "hidden_size": 4096, "num_hidden_layers": 62, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 128, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "n_routed_experts": None, "n_shared_experts": None, "num_experts_per_tok": None, "first_k_dense_replace": 0,
    "vocab_size": 152064, "rope_theta": 10000000.0,
}


@pytest.mark.parametrize("config, rope_layers", [(BAMBA_9B, (9,)), (GRANITE_4_H, (5,)), (DEEPSEEK_V2_DEFAULT_TOPK, None),
                                                 (DOTS1_DEFAULT_EXPERTS, None)],
                         ids=["bamba-9b", "granite-4.0-h", "deepseek-v2-default-topk", "dots1-default-experts"])
def test_mamba_hybrids_and_unset_moe_sizes_are_built_and_audited(config, rope_layers):
    """The shrunk Mamba-2 sizes pass the config class's validator (it refused them: issue 34's
    sweep), the router gets an int top-k, and the attention layers' RoPE is checked."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_module.audit(config, length=32)
    assert report.ok, [(row.plan, row.max_diff, row.tolerance, row.disagreement) for row in report.rows]
    rope_rows = [row for row in report.rows if "rope" in row.plan]
    assert rope_rows and (rope_layers is None or rope_rows[0].layers == rope_layers)


def test_a_wrong_plan_on_a_mamba_hybrid_is_caught(monkeypatch):
    """The check above can fail: RoPE base / 100 on Bamba's attention layer is a mismatch there."""
    import posenc
    from posenc.hf_config import position_plan
    from posenc.hf_config.plan import LayerPlan, PositionPlan

    def wrong(config):
        plan = position_plan(config)
        layers = tuple(LayerPlan(posenc.RoPE(layer.encoding.head_dim, rotary_dim=layer.encoding.rotary_dim,
                                             base=layer.encoding.base / 100), layer.span, layer.window, layer.layer_type)
                       if isinstance(layer.encoding, posenc.RoPE) else layer for layer in plan)
        return PositionPlan(layers, model_type=plan.model_type)

    monkeypatch.setattr("posenc.hf_config.position_plan", wrong)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = audit_module.audit(BAMBA_9B, length=32)
    assert [row.layers for row in report.rows if not row.ok] == [(9,)]


def test_a_per_layer_input_switched_off_stays_off():
    """Gemma 4's hidden_size_per_layer_input 0 (26B / 31B) turns its per-layer inputs off: the
    audit model must not switch them on (a positive size is shrunk to 16)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("gemma4_text", hidden_size_per_layer_input=0).to_dict()
    shrunk = audit_module.shrink_config(config, 6)
    assert transformers.AutoConfig.for_model(**shrunk).hidden_size_per_layer_input == 0
    on = audit_module.shrink_config({**config, "hidden_size_per_layer_input": 256}, 6)
    assert (on["hidden_size_per_layer_input"], on["vocab_size_per_layer_input"]) == (16, audit_module.VOCAB)
