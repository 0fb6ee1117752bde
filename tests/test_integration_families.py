"""use_encoding on every family whose attention goes through transformers' AttentionInterface.

Tiny random models (2-4 layers, hidden 64, 4 heads, vocab 128) shaped like each family's
released config, every parameter drawn with std 0.2 so that a wrong position moves the logits;
float32; no downloads. The references are transformers' own models with the same weights.

(a) use_encoding(model, the plan of the model's own positions) reproduces its logits within the
model's own float32 noise (max(1e-5, 2 x |eager - sdpa|)) and its greedy tokens, with left
padding and the cache; a wrong plan moves the logits (so the check can fail).
(b) posenc encodings by name on all layers or on ``layers=`` train and generate with the cache
exactly as without it.

The plans are built by hand here (LayerPlan per layer, from each family's modeling file); they
become ``position_plan(config)`` once the reader is merged.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.encodings.irope import AttentionTemperature  # noqa: E402
from posenc.encodings.rope.query_scaled import QueryScaledRoPE
from posenc.errors import InvalidArgument  # noqa: E402
from posenc.hf_config.plan import LayerPlan, PositionPlan  # noqa: E402
from posenc.integrations.transformers import extend_context, use_encoding  # noqa: E402

T = transformers
V = 128
COMMON = dict(vocab_size=V, hidden_size=64, num_attention_heads=4, max_position_embeddings=64, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
SMALL = dict(COMMON, intermediate_size=96, num_key_value_heads=2)


def rope(base=10000.0, **kwargs):
    return posenc.RoPE(kwargs.pop("head_dim", 16), base=base, **kwargs)


def uniform(make, n):
    return lambda config: PositionPlan(tuple(LayerPlan(make()) for _ in range(n)))


def by_type(make, sinks=False):
    return lambda config: PositionPlan(tuple(LayerPlan(make(t), layer_type=t, sinks=sinks) for t in config.layer_types))


def by_flags(make, nope=lambda: None):  # no_rope_layers: 1 = RoPE, 0 = NoPE (SmolLM3, Llama 4)
    return lambda config: PositionPlan(tuple(LayerPlan(make() if flag else nope()) for flag in config.no_rope_layers))


#: The smallest vision tower the Qwen-VL configs take (1 block, width 16, merged to the text width 64).
VISION = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, out_hidden_size=64, intermediate_size=16, patch_size=2,
              spatial_merge_size=1, temporal_patch_size=1)

QWEN3_VISION = dict(depth=1, hidden_size=16, num_heads=2, out_hidden_size=64, intermediate_size=16, patch_size=2,
                    spatial_merge_size=1, temporal_patch_size=1, num_position_embeddings=16, deepstack_visual_indexes=[])

GLM4V_VISION = dict(depth=1, hidden_size=16, num_heads=2, out_hidden_size=64, intermediate_size=16, patch_size=2,
                    spatial_merge_size=1, temporal_patch_size=1)

#: GLM-4.5V (MoE), tiny: 2 layers, half of each 16-wide head rotated, M-RoPE sections [1, 2, 1]
GLM4V_MOE = dict(
    text_config=dict(SMALL, num_hidden_layers=2, head_dim=16, n_routed_experts=2, num_experts_per_tok=1,
                     moe_intermediate_size=32, first_k_dense_replace=1, rope_parameters={
                         "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                         "mrope_section": [1, 2, 1]}),
    vision_config=GLM4V_VISION)

PIXTRAL = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, head_dim=8, image_size=16,
               patch_size=4)

OLMO3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.2,
              "beta_fast": 32.0, "beta_slow": 1.0}

MINISTRAL3_YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}

GEMMA3_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]

#: family -> (config class, model class, config kwargs, the model's own plan, attention implementation)
FAMILIES = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, dict(SMALL, num_hidden_layers=2), uniform(rope, 2), "sdpa"),
    "mistral": (T.MistralConfig, T.MistralForCausalLM,
                dict(SMALL, num_hidden_layers=2, sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                uniform(lambda: rope(1e6), 2), "sdpa"),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              uniform(lambda: rope(1e6), 2), "sdpa"),
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM,
              dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              uniform(lambda: rope(1e6), 2), "sdpa"),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, dict(SMALL, num_hidden_layers=2, num_key_value_heads=1, head_dim=16),
              uniform(rope, 2), "sdpa"),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
               uniform(rope, 2), "eager"),  # transformers refuses sdpa for Gemma 2
    "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                    dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                         layer_types=GEMMA3_TYPES,
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
                    by_type(lambda t: rope(1e4) if t == "sliding_attention"
                            else rope(1e6, scaling={"rope_type": "linear", "factor": 8.0})), "sdpa"),
    "cohere": (T.CohereConfig, T.CohereForCausalLM,
               dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 8e6}),
               uniform(lambda: rope(8e6, interleaved=True), 2), "sdpa"),
    "cohere2": (T.Cohere2Config, T.Cohere2ForCausalLM,
                dict(SMALL, num_hidden_layers=4, sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                     rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
                by_type(lambda t: rope(5e4, interleaved=True) if t == "sliding_attention" else None), "sdpa"),
    "smollm3": (T.SmolLM3Config, T.SmolLM3ForCausalLM,
                dict(SMALL, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
                     rope_parameters={"rope_type": "default", "rope_theta": 2e6}),
                by_flags(lambda: rope(2e6)), "sdpa"),
    "gpt_oss": (T.GptOssConfig, T.GptOssForCausalLM,
                dict(COMMON, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                     num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention"],
                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "rope_theta": 150000.0, "original_max_position_embeddings": 16, "truncate": False}),
                lambda config: PositionPlan(tuple(
                    LayerPlan(rope(150000.0, scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                      "original_max_position_embeddings": 16, "truncate": False}),
                              sinks=True) for _ in range(2))),
                "eager"),  # transformers refuses sdpa for gpt-oss (sinks)
    "qwen3_next": (T.Qwen3NextConfig, T.Qwen3NextForCausalLM,
                   dict(SMALL, num_hidden_layers=4, head_dim=16, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_num_value_heads=4,
                        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                        layer_types=["linear_attention"] * 3 + ["full_attention"],
                        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}),
                   by_type(lambda t: rope(1e7, rotary_dim=4) if t == "full_attention" else None), "sdpa"),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM,
             dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5}),
             uniform(lambda: rope(rotary_dim=8), 2), "sdpa"),
    "olmo2": (T.Olmo2Config, T.Olmo2ForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
              uniform(lambda: rope(5e5), 2), "sdpa"),
    # OLMo 3: YaRN (a v4 rope_scaling, as released) on the full_attention layers only
    "olmo3": (T.Olmo3Config, T.Olmo3ForCausalLM,
              dict(SMALL, num_hidden_layers=4, sliding_window=8, rope_theta=500000.0, rope_scaling=OLMO3_YARN),
              by_type(lambda t: rope(5e5) if t == "sliding_attention" else rope(5e5, scaling=OLMO3_YARN)), "sdpa"),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(COMMON, intermediate_size=96, num_hidden_layers=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
                 uniform(lambda: rope(rotary_dim=4), 2), "sdpa"),
    "gptj": (T.GPTJConfig, T.GPTJForCausalLM,
             dict(vocab_size=V, n_embd=64, n_head=4, n_layer=2, n_positions=64, rotary_dim=8, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2),
             uniform(lambda: rope(rotary_dim=8, interleaved=True), 2), "sdpa"),
    "stablelm": (T.StableLmConfig, T.StableLmForCausalLM,
                 dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                    "partial_rotary_factor": 0.25}),
                 uniform(lambda: rope(rotary_dim=4), 2), "sdpa"),
    "persimmon": (T.PersimmonConfig, T.PersimmonForCausalLM,
                  dict(COMMON, intermediate_size=96, num_hidden_layers=2, qk_layernorm=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.5}),
                  uniform(lambda: rope(25000.0, rotary_dim=8), 2), "sdpa"),
    "llama4_text": (T.Llama4TextConfig, T.Llama4ForCausalLM,
                    dict(SMALL, intermediate_size=64, intermediate_size_mlp=96, num_hidden_layers=4, head_dim=16,
                         num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8,
                         no_rope_layers=[1, 1, 1, 0], attn_temperature_tuning=True, floor_scale=4, attn_scale=0.1,
                         use_qk_norm=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
                    # the NoPE layers' attention temperature (Llama 4's attn_temperature_tuning), as the model applies it
                    by_flags(lambda: rope(5e5, interleaved=True),
                             lambda: AttentionTemperature(floor_scale=4, attn_scale=0.1)), "sdpa"),
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                dict(SMALL, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1, sliding_window=None),
                uniform(lambda: rope(1e6), 2), "sdpa"),
    "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                  dict(SMALL, num_hidden_layers=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                       head_dim=16), uniform(rope, 2), "sdpa"),
    "phi": (T.PhiConfig, T.PhiForCausalLM, dict(SMALL, num_hidden_layers=2, partial_rotary_factor=0.5),
            uniform(lambda: rope(rotary_dim=8), 2), "sdpa"),
    # Gemma 4: sliding layers base 1e4 on head_dim 16; global layers proportional RoPE on global_head_dim 32
    "gemma4_text": (T.Gemma4TextConfig, T.Gemma4ForCausalLM,
                    dict(SMALL, num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=8,
                         hidden_size_per_layer_input=16, vocab_size_per_layer_input=128),
                    lambda config: PositionPlan(tuple(
                        LayerPlan(rope(1e4) if t == "sliding_attention" else
                                  posenc.RoPE(32, base=1e6, scaling={"rope_type": "proportional",
                                                                     "partial_rotary_factor": 0.25}),
                                  layer_type=t) for t in config.layer_types)), "sdpa"),
    # MLA: RoPE on the qk_rope_head_dim part of each head, pairs interleaved (rope_interleave)
    "deepseek_v3": (T.DeepseekV3Config, T.DeepseekV3ForCausalLM,
                    dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                         n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                         kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
                    uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    # the VL models (text tower at model.language_model; a vision tower as small as transformers
    # allows): M-RoPE, 8 pairs per head split (temporal, height, width) by mrope_section
    "qwen2_vl": (T.Qwen2VLConfig, T.Qwen2VLForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                                      "mrope_section": [2, 3, 3]}),
        vision_config=VISION), uniform(lambda: posenc.MRoPE(16, mrope_section=[2, 3, 3], base=1e6), 2), "sdpa"),
    "qwen2_5_vl": (T.Qwen2_5_VLConfig, T.Qwen2_5_VLForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                                      "mrope_section": [4, 2, 2]}),
        vision_config=VISION), uniform(lambda: posenc.MRoPE(16, mrope_section=[4, 2, 2], base=1e6), 2), "sdpa"),
    # issue 34's families (tiny, shaped like their released configs)
    "arcee": (T.ArceeConfig, T.ArceeForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                                "original_max_position_embeddings": 16}),
              uniform(lambda: rope(scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 16}), 2), "sdpa"),
    "apertus": (T.ApertusConfig, T.ApertusForCausalLM, dict(SMALL, num_hidden_layers=2),  # the class's llama3 x8
                uniform(lambda: rope(12_000_000.0, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                            "high_freq_factor": 4.0,
                                                            "original_max_position_embeddings": 8192}), 2), "sdpa"),
    "seed_oss": (T.SeedOssConfig, T.SeedOssForCausalLM,
                 dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e7}),
                 uniform(lambda: rope(1e7), 2), "sdpa"),
    # interleaved pairs, handed Llama-format tables that apply_rotary_pos_emb de-interleaves
    "helium": (T.HeliumConfig, T.HeliumForCausalLM,
               dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
               uniform(lambda: rope(1e5, interleaved=True), 2), "sdpa"),
    "ernie4_5": (T.Ernie4_5Config, T.Ernie4_5ForCausalLM,
                 dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                 uniform(lambda: rope(5e5, interleaved=True), 2), "sdpa"),
    "ernie4_5_moe": (T.Ernie4_5_MoeConfig, T.Ernie4_5_MoeForCausalLM,
                     dict(SMALL, num_hidden_layers=2, moe_num_experts=2, moe_k=1, moe_intermediate_size=32,
                          moe_layer_start_index=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                     uniform(lambda: rope(5e5, interleaved=True), 2), "sdpa"),
    "glm": (T.GlmConfig, T.GlmForCausalLM,
            dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                           "partial_rotary_factor": 0.5}),
            uniform(lambda: rope(rotary_dim=8, interleaved=True), 2), "sdpa"),
    "glm4": (T.Glm4Config, T.Glm4ForCausalLM,
             dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                            "partial_rotary_factor": 0.5}),
             uniform(lambda: rope(rotary_dim=8, interleaved=True), 2), "sdpa"),
    "glm4_moe": (T.Glm4MoeConfig, T.Glm4MoeForCausalLM,
                 dict(SMALL, num_hidden_layers=2, head_dim=16, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
                      topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
                 uniform(lambda: rope(1e6, rotary_dim=8), 2), "sdpa"),
    "granite": (T.GraniteConfig, T.GraniteForCausalLM,
                dict(SMALL, num_hidden_layers=2, attention_multiplier=0.125,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e7}),
                uniform(lambda: rope(1e7), 2), "sdpa"),
    "granitemoe": (T.GraniteMoeConfig, T.GraniteMoeForCausalLM,
                   dict(SMALL, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1, attention_multiplier=0.125),
                   uniform(rope, 2), "sdpa"),
    "granitemoeshared": (T.GraniteMoeSharedConfig, T.GraniteMoeSharedForCausalLM,
                         dict(SMALL, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1,
                              shared_intermediate_size=32, attention_multiplier=0.125),
                         uniform(rope, 2), "sdpa"),
    # HunYuan's released spelling: "dynamic" with an alpha, a static NTK-alpha base
    "hunyuan_v1_dense": (T.HunYuanDenseV1Config, T.HunYuanDenseV1ForCausalLM,
                         dict(SMALL, num_hidden_layers=2, head_dim=16,
                              rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                               "rope_theta": 10000.0}),
                         uniform(lambda: rope(10000.0 * 1000.0 ** (16 / 14)), 2), "sdpa"),
    "hunyuan_v1_moe": (T.HunYuanMoEV1Config, T.HunYuanMoEV1ForCausalLM,
                       dict(SMALL, num_hidden_layers=2, head_dim=16, num_experts=2, moe_topk=1,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
                       uniform(lambda: rope(1e5), 2), "sdpa"),
    "starcoder2": (T.Starcoder2Config, T.Starcoder2ForCausalLM,
                   dict(COMMON, intermediate_size=96, num_hidden_layers=2, num_key_value_heads=2, sliding_window=8,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
                   uniform(lambda: rope(1e5), 2), "sdpa"),
    "phimoe": (T.PhimoeConfig, T.PhimoeForCausalLM,
               dict(SMALL, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
               uniform(lambda: rope(1e6), 2), "sdpa"),
    # EXAONE 4: RoPE on the sliding layers, the full layers NoPE
    "exaone4": (T.Exaone4Config, T.Exaone4ForCausalLM,
                dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8, sliding_window_pattern=4,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                by_type(lambda t: rope(1e6) if t == "sliding_attention" else None), "sdpa"),
    "dots1": (T.Dots1Config, T.Dots1ForCausalLM,
              dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, max_window_layers=1, n_routed_experts=2, n_shared_experts=1,
                   num_experts_per_tok=1, n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              uniform(lambda: rope(1e6), 2), "sdpa"),
    "vaultgemma": (T.VaultGemmaConfig, T.VaultGemmaForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
                   lambda config: PositionPlan(tuple(LayerPlan(rope(), layer_type=t, softcap=50.0)
                                                     for t in config.layer_types)), "eager"),
    # MiniMax-M2's absolute rotary_dim: 8 of 16
    "minimax_m2": (T.MiniMaxM2Config, T.MiniMaxM2ForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, rotary_dim=8, num_local_experts=2, num_experts_per_tok=1,
                        rope_theta=5e6),
                   uniform(lambda: rope(5e6, rotary_dim=8), 2), "sdpa"),
    "ministral": (T.MinistralConfig, T.MinistralForCausalLM,
                  dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 1e8}),
                  by_type(lambda t: rope(1e8)), "sdpa"),
    # Ministral 3 as released: YaRN on every layer, the queries past original_max_position_embeddings
    # (8 here: tokens() has 20) scaled by 1 + 0.1 log(1 + floor(p / 8)), which the model applies itself
    "ministral3": (T.Ministral3Config, T.Ministral3ForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters=MINISTRAL3_YARN), uniform(
                       lambda: QueryScaledRoPE(16, base=1e6, llama_4_scaling_beta=0.1, original_max_position_embeddings=8,
                                               scaling={k: v for k, v in MINISTRAL3_YARN.items()
                                                        if k not in ("rope_theta", "llama_4_scaling_beta")}), 2), "sdpa"),
    # DeepSeek-V2's MLA: complex-pair RoPE on the qk_rope_head_dim part of each head
    "deepseek_v2": (T.DeepseekV2Config, T.DeepseekV2ForCausalLM,
                    dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                         n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                         kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_shared_experts=1),
                    uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    # Qwen3-VL: interleaved M-RoPE (T H W T H W T T over 8 pairs), text tower at model.language_model
    "qwen3_vl": (T.Qwen3VLConfig, T.Qwen3VLForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6, "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
        vision_config=QWEN3_VISION),
        uniform(lambda: posenc.MRoPE(16, mrope_section=[3, 3, 2], base=1e6, mrope_interleaved=True), 2), "sdpa"),
    # Cosmos 3 Omni: Qwen3-VL's text tower (interleaved M-RoPE) inside NVIDIA's wrapper, at model.language_model
    "cosmos3_omni": (T.Cosmos3OmniConfig, T.Cosmos3OmniForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6, "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
        vision_config=QWEN3_VISION),
        uniform(lambda: posenc.MRoPE(16, mrope_section=[3, 3, 2], base=1e6, mrope_interleaved=True), 2), "sdpa"),
    # Qwen3.5: Gated DeltaNet layers (no positions) and full-attention layers with interleaved M-RoPE
    # over a quarter of the head (8 of 32: 4 pairs, T H W T)
    "qwen3_5_text": (T.Qwen3_5TextConfig, T.Qwen3_5ForCausalLM,
                     dict(SMALL, num_hidden_layers=4, head_dim=32, linear_num_value_heads=4, linear_num_key_heads=2,
                          linear_key_head_dim=16, linear_value_head_dim=16,
                          layer_types=["linear_attention"] * 3 + ["full_attention"],
                          rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                           "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
                     by_type(lambda t: posenc.MRoPE(32, mrope_section=[2, 1, 1], base=1e7, rotary_dim=8,
                                                    mrope_interleaved=True) if t == "full_attention" else None), "sdpa"),
    # the hybrids: RoPE on the softmax-attention layers, None on the convolution / Mamba layers
    "lfm2": (T.Lfm2Config, T.Lfm2ForCausalLM,
             dict(SMALL, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"],
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
             by_type(lambda t: rope(1e6) if t == "full_attention" else None), "sdpa"),
    "bamba": (T.BambaConfig, T.BambaForCausalLM,
              dict(SMALL, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=8,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
              lambda config: PositionPlan(tuple(LayerPlan(rope(rotary_dim=8) if i == 1 else None) for i in range(3))),
              "sdpa"),
    # Granite 4.0 hybrid: position_embedding_type "rope" here (the released models: NoPE)
    "granitemoehybrid": (T.GraniteMoeHybridConfig, T.GraniteMoeHybridForCausalLM,
                         dict(SMALL, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], num_local_experts=2,
                              num_experts_per_tok=1, shared_intermediate_size=32, mamba_n_heads=8, mamba_d_state=8,
                              mamba_chunk_size=8, position_embedding_type="rope", attention_multiplier=0.125,
                              rope_parameters={"rope_type": "default", "rope_theta": 1e7}),
                         lambda config: PositionPlan(tuple(LayerPlan(rope(1e7) if i == 1 else None) for i in range(3))),
                         "sdpa"),
    # Falcon-H1: attention and a Mamba mixer side by side in every layer
    "falcon_h1": (T.FalconH1Config, T.FalconH1ForCausalLM,
                  dict(SMALL, num_hidden_layers=2, head_dim=16, mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=8,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e11}),
                  uniform(lambda: rope(1e11), 2), "sdpa"),
    # Mistral 3: a Pixtral tower and a Mistral decoder at model.language_model (image token V, outside the prompts)
    "mistral3": (T.Mistral3Config, T.Mistral3ForConditionalGeneration, dict(
        text_config=dict(SMALL, vocab_size=V + 1, model_type="mistral", num_hidden_layers=2, head_dim=16, sliding_window=8,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e9}),
        vision_config=PIXTRAL, image_token_index=V, spatial_merge_size=1), uniform(lambda: rope(1e9), 2), "sdpa"),
    # Llama 3.2 Vision's text model: layer 1 cross-attends (to no image here), the others are Llama's
    "mllama_text_model": (T.MllamaTextConfig, T.MllamaForCausalLM,
                          dict(SMALL, num_hidden_layers=3, cross_attention_layers=[1],
                               rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                          lambda config: PositionPlan(tuple(LayerPlan(None if i == 1 else rope(5e5)) for i in range(3))),
                          "sdpa"),
    "lfm2_moe": (T.Lfm2MoeConfig, T.Lfm2MoeForCausalLM,
                 dict(SMALL, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], num_experts=2,
                      num_experts_per_tok=1, moe_intermediate_size=32, num_dense_layers=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                 by_type(lambda t: rope(1e6) if t == "full_attention" else None), "sdpa"),
    # GLM-4.7-Flash's MLA: RoPE on the qk_rope_head_dim part, pairs interleaved (rope_interleave)
    "glm4_moe_lite": (T.Glm4MoeLiteConfig, T.Glm4MoeLiteForCausalLM,
                      dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                           n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                      uniform(lambda: posenc.RoPE(8, base=1e6, interleaved=True), 2), "sdpa"),
    "qwen3_vl_moe": (T.Qwen3VLMoeConfig, T.Qwen3VLMoeForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, head_dim=16, num_experts=2, num_experts_per_tok=1,
                         moe_intermediate_size=32, rope_parameters={
                             "rope_type": "default", "rope_theta": 1e6, "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
        vision_config=QWEN3_VISION),
        uniform(lambda: posenc.MRoPE(16, mrope_section=[3, 3, 2], base=1e6, mrope_interleaved=True), 2), "sdpa"),
    # Qwen3.5 with its vision tower: the hybrid text tower at model.language_model
    "qwen3_5": (T.Qwen3_5Config, T.Qwen3_5ForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=4, head_dim=32, linear_num_value_heads=4, linear_num_key_heads=2,
                         linear_key_head_dim=16, linear_value_head_dim=16,
                         layer_types=["linear_attention"] * 3 + ["full_attention"],
                         rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                          "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        vision_config=QWEN3_VISION),
        lambda config: PositionPlan(tuple(
            LayerPlan(posenc.MRoPE(32, mrope_section=[2, 1, 1], base=1e7, rotary_dim=8, mrope_interleaved=True)
                      if t == "full_attention" else None) for t in config.text_config.layer_types)), "sdpa"),
    # Gemma 3n's text model: 4 sliding layers (θ 1e4) to 1 full (θ 1e6); the last 5 layers reuse the
    # keys and values of the last earlier layer of their type (num_kv_shared_layers)
    "gemma3n_text": (T.Gemma3nTextConfig, T.Gemma3nForCausalLM,
                     dict(SMALL, num_hidden_layers=10, head_dim=16, sliding_window=8, num_kv_shared_layers=5,
                          hidden_size_per_layer_input=16, vocab_size_per_layer_input=V, laurel_rank=8,
                          activation_sparsity_pattern=[0.0] * 10, rope_theta=1e6, rope_local_base_freq=1e4),
                     by_type(lambda t: rope(1e4) if t == "sliding_attention" else rope(1e6)), "sdpa"),
    # -- issue 34, list A
    # DeepSeek-V3.2 / GLM-5: MLA (interleaved RoPE on qk_rope_head_dim) and the lightning indexer (its
    # index_topk 2048 keeps every key here; test_dsa_indexer_reads_the_plans_rope makes it select)
    "deepseek_v32": (T.DeepseekV32Config, T.DeepseekV32ForCausalLM,
                     dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                          n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                          kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_head_dim=16,
                          index_n_heads=2),
                     uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    "glm_moe_dsa": (T.GlmMoeDsaConfig, T.GlmMoeDsaForCausalLM,
                    dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                         n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                         kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_head_dim=16,
                         index_n_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                    uniform(lambda: posenc.RoPE(8, base=1e6, interleaved=True), 2), "sdpa"),
    # CodeGen: GPT-J's interleaved rotary on the first rotary_dim dimensions (mp_num 4 splits of the qkv)
    "codegen": (T.CodeGenConfig, T.CodeGenForCausalLM,
                dict(vocab_size=V, n_embd=64, n_head=4, n_layer=2, n_positions=64, n_ctx=64, rotary_dim=8, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2),
                uniform(lambda: rope(rotary_dim=8, interleaved=True), 2), "sdpa"),
    # GLM-4.1V: chunked M-RoPE over half the head, pairs interleaved (GLM-4.5V: test_glm4v_moe_read_plan_...)
    "glm4v": (T.Glm4vConfig, T.Glm4vForConditionalGeneration, dict(
        text_config=dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={
            "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5, "mrope_section": [1, 2, 1]}),
        vision_config=GLM4V_VISION),
        uniform(lambda: posenc.MRoPE(16, mrope_section=[1, 2, 1], rotary_dim=8, interleaved=True), 2), "sdpa"),
    # Doge: Llama's RoPE, every layer sliding (its dynamic mask selects keys only past keep_window_size 2048)
    "doge": (T.DogeConfig, T.DogeForCausalLM,
             dict(SMALL, num_hidden_layers=2, sliding_window=16,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
             uniform(rope, 2), "sdpa"),
    # Llama's RoPE in families of their own (HyperCLOVA X with Granite's multipliers)
    "hyperclovax": (T.HyperCLOVAXConfig, T.HyperCLOVAXForCausalLM,
                    dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 5e7}),
                    uniform(lambda: rope(5e7), 2), "sdpa"),
    "iquestcoder": (T.IQuestCoderConfig, T.LlamaForCausalLM, dict(SMALL, num_hidden_layers=2, head_dim=16),
                    uniform(rope, 2), "sdpa"),
    "jais2": (T.Jais2Config, T.Jais2ForCausalLM,
              dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
              uniform(lambda: rope(1e6), 2), "sdpa"),
    "flex_olmo": (T.FlexOlmoConfig, T.FlexOlmoForCausalLM,
                  dict(SMALL, num_hidden_layers=2, num_experts=2, num_experts_per_tok=1),  # the class's theta 5e5
                  uniform(lambda: rope(5e5), 2), "sdpa"),
    "aria_text": (T.AriaTextConfig, T.AriaTextForCausalLM,
                  dict(SMALL, num_hidden_layers=2, moe_num_experts=2, moe_topk=1, moe_intermediate_size=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 5e6}),
                  uniform(lambda: rope(5e6), 2), "sdpa"),
    # GPT-NeoX Japanese: rotary_emb_base and rotary_pct (1 by default: the whole head)
    "gpt_neox_japanese": (T.GPTNeoXJapaneseConfig, T.GPTNeoXJapaneseForCausalLM,
                          dict(COMMON, intermediate_multiple_size=2, num_hidden_layers=2, rotary_emb_base=5e5),
                          uniform(lambda: rope(5e5), 2), "eager"),  # transformers refuses sdpa for it
    # A.X K1: DeepSeek-V3's MLA; A.X K2: DeepSeek-V3.2's (index_topk 2048 keeps every key here)
    "axk1": (T.AXK1Config, T.AXK1ForCausalLM,
             dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
                  topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
             uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    "axk2": (T.AXK2Config, T.AXK2ForCausalLM,
             dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
                  topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_head_dim=16, index_n_heads=2),
             uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    "hy_v3": (T.HYV3Config, T.HYV3ForCausalLM,
              dict(SMALL, num_hidden_layers=2, head_dim=16, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32),
              uniform(lambda: rope(11_158_840.0), 2), "sdpa"),  # the class's theta
    # Flint: gpt-oss's sinks, RoPE on the sliding layers only (layers 0, 1 and the last full, NoPE)
    "flint": (T.FlintConfig, T.FlintForCausalLM,
              dict(SMALL, num_hidden_layers=3, head_dim=16, sliding_window=8, num_local_experts=2, num_experts_per_tok=1,
                   moe_intermediate_size=32, layer_types=["full_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
              by_type(lambda t: rope(1e5) if t == "sliding_attention" else None, sinks=True), "eager"),
    # Dory: 1 input, 2 recurrent (run twice), 1 output layer; theta 1e4 sliding, 1e7 full, RoPE on all
    "dory": (T.DoryConfig, T.DoryForCausalLM,
             dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8, n_input_layers=1, n_output_layers=1,
                  n_recurrent_loops=2, initializer_range=0.2),  # its q/k scales: head_dim**0.5 / initializer_range
             by_type(lambda t: rope(1e4) if t == "sliding_attention" else rope(1e7)), "sdpa"),
    # InternLM3 and EXAONE 3: configs of their own, built as Llama
    "internlm3": (T.InternLM3Config, T.LlamaForCausalLM,
                  dict(SMALL, num_hidden_layers=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 5e7}),
                  uniform(lambda: rope(5e7), 2), "sdpa"),
    "exaone": (T.ExaoneConfig, T.LlamaForCausalLM, dict(SMALL, num_layers=2),  # the class's theta 5e5
               uniform(lambda: rope(5e5), 2), "sdpa"),
    # JetMoE: heads of kv_channels, num_key_value_heads x num_experts_per_tok query heads
    "jetmoe": (T.JetMoeConfig, T.JetMoeForCausalLM,
               dict(COMMON, intermediate_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=16,
                    num_local_experts=2, num_experts_per_tok=2), uniform(rope, 2), "sdpa"),
    "bitnet": (T.BitNetConfig, T.BitNetForCausalLM, dict(SMALL, num_hidden_layers=2),  # the class's theta 5e5
               uniform(lambda: rope(5e5), 2), "sdpa"),
    "diffllama": (T.DiffLlamaConfig, T.DiffLlamaForCausalLM,
                  dict(SMALL, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
                  uniform(lambda: rope(1e5), 2), "sdpa"),
    # CWM: 1 full layer then 3 sliding, the class's llama3 x16 RoPE over 8192 on all
    "cwm": (T.CwmConfig, T.CwmForCausalLM, dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8),
            by_type(lambda t: rope(1e6, scaling={"rope_type": "llama3", "factor": 16.0, "high_freq_factor": 4.0,
                                                 "low_freq_factor": 1.0, "original_max_position_embeddings": 8192})),
            "sdpa"),
    # Granite SWA: theta per layer (0: NoPE) and learned sinks; transformers refuses sdpa
    "granite_swa": (T.GraniteSWAConfig, T.GraniteSWAForCausalLM,
                    dict(SMALL, num_hidden_layers=4, sliding_window=8, attention_multiplier=0.125,
                         layer_rope_theta=[1e4, 0, 5e5, 1e4]),
                    lambda config: PositionPlan(tuple(LayerPlan(rope(theta) if theta else None, sinks=True)
                                                      for theta in config.layer_rope_theta)), "eager"),
    "granitemoe_swa": (T.GraniteMoeSWAConfig, T.GraniteMoeSWAForCausalLM,
                       dict(SMALL, num_hidden_layers=2, sliding_window=8, attention_multiplier=0.125, num_local_experts=2,
                            num_experts_per_tok=1, layer_rope_theta=[0, 1e5]),
                       lambda config: PositionPlan((LayerPlan(None, sinks=True), LayerPlan(rope(1e5), sinks=True))),
                       "eager"),
    # AFMoE and EXAONE MoE: RoPE on the sliding layers, the full layers NoPE
    "afmoe": (T.AfmoeConfig, T.AfmoeForCausalLM,
              dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, global_attn_every_n_layers=2, num_experts=2,
                   num_experts_per_tok=1, moe_intermediate_size=32, num_dense_layers=1),
              by_type(lambda t: rope() if t == "sliding_attention" else None), "sdpa"),
    "exaone_moe": (T.ExaoneMoeConfig, T.ExaoneMoeForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, sliding_window_pattern=2, num_experts=2,
                        num_experts_per_tok=1, moe_intermediate_size=32, first_k_dense_replace=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                   by_type(lambda t: rope(1e6) if t == "sliding_attention" else None), "sdpa"),
    # Cohere2-MoE: interleaved RoPE on the sliding layers and on the dense first layer (force_rope)
    "cohere2_moe": (T.Cohere2MoeConfig, T.Cohere2MoeForCausalLM,
                    dict(SMALL, num_hidden_layers=3, head_dim=16, sliding_window=8, sliding_window_pattern=2,
                         first_k_dense_replace=1, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
                    lambda config: PositionPlan(tuple(
                        LayerPlan(rope(5e4, interleaved=True) if i == 0 or t == "sliding_attention" else None)
                        for i, t in enumerate(config.layer_types))), "sdpa"),
    # issue 34, list B
    # Qwen2-MoE with use_sliding_window: layer 0 slides (window 8), layers 1 and 2 full
    "qwen2_moe": (T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM,
                  dict(SMALL, num_hidden_layers=3, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, use_sliding_window=True, sliding_window=8,
                       max_window_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                  lambda config: PositionPlan(tuple(
                      LayerPlan(rope(1e6), *(("sliding", 8) if i == 0 else ("full", None))) for i in range(3))), "sdpa"),
    "olmo": (T.OlmoConfig, T.OlmoForCausalLM, dict(SMALL, num_hidden_layers=2, clip_qkv=8.0), uniform(rope, 2), "sdpa"),
    "olmoe": (T.OlmoeConfig, T.OlmoeForCausalLM,
              dict(SMALL, num_hidden_layers=2, num_experts=2, num_experts_per_tok=1), uniform(rope, 2), "sdpa"),
    "solar_open": (T.SolarOpenConfig, T.SolarOpenForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, n_routed_experts=2, num_experts_per_tok=1,
                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                   uniform(lambda: rope(1e6), 2), "sdpa"),
    # Nemotron: RoPE over half of each head (partial_rotary_factor 0.5, its class's default)
    "nemotron": (T.NemotronConfig, T.NemotronForCausalLM, dict(SMALL, num_hidden_layers=2),
                 uniform(lambda: rope(rotary_dim=8), 2), "sdpa"),
    # Zamba2 with use_mem_rope: RoPE on the shared attention block of the hybrid layer (head 2 x 64 / 4 = 32)
    "zamba2": (T.Zamba2Config, T.Zamba2ForCausalLM,
               dict(SMALL, num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"], n_mamba_heads=4,
                    mamba_d_state=8, mamba_ngroups=1, chunk_size=8, use_mem_rope=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
               lambda config: PositionPlan(tuple(LayerPlan(rope(5e4, head_dim=32) if i == 1 else None)
                                                 for i in range(3))), "sdpa"),
    # MiniMax: softmax attention with RoPE (layer 0), lightning attention without positions (layer 1)
    "minimax": (T.MiniMaxConfig, T.MiniMaxForCausalLM,
                dict(SMALL, num_hidden_layers=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1, block_size=8,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                by_type(lambda t: rope(1e6) if t == "full_attention" else None), "sdpa"),
    # the DeepSeek-V3 MLA copies: RoPE on the qk_rope_head_dim part, interleaved (rope_interleave)
    "sarvam_mla": (T.SarvamMLAConfig, T.DeepseekV3ForCausalLM,
                   dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                        n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
                   uniform(lambda: posenc.RoPE(8, interleaved=True), 2), "sdpa"),
    "youtu": (T.YoutuConfig, T.YoutuForCausalLM,
              dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                   qk_nope_head_dim=16, v_head_dim=16, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
              uniform(lambda: posenc.RoPE(8, base=1e5, interleaved=True), 2), "sdpa"),
    # MiniCPM3: MLA, the qk_rope_head_dim part in half-split pairs
    "minicpm3": (T.MiniCPM3Config, T.MiniCPM3ForCausalLM,
                 dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
                      qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
                 uniform(lambda: posenc.RoPE(8), 2), "sdpa"),
    # Sarvam-MoE: GLM-4.5's class, the whole head rotated
    "sarvam_moe": (T.SarvamMoEConfig, T.Glm4MoeForCausalLM,
                   dict(SMALL, num_hidden_layers=2, head_dim=16, n_routed_experts=2, num_experts_per_tok=1, n_group=1,
                        topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 8e6}),
                   uniform(lambda: rope(8e6), 2), "sdpa"),
    # MiniMax-M3's text model: RoPE over the rope dict's half of the head (its rotary_dim is not read)
    "minimax_m3_vl_text": (T.MiniMaxM3VLTextConfig, T.MiniMaxM3VLForCausalLM,
                           dict(SMALL, num_hidden_layers=2, head_dim=16, rotary_dim=4, num_local_experts=2,
                                num_experts_per_tok=1, mlp_layer_types=["dense", "dense"],
                                rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}),
                           uniform(lambda: rope(5e6, rotary_dim=8), 2), "sdpa"),
    # ModernBERT-decoder: layer 0 global (theta 160000), layer 1 sliding over local_attention // 2 (theta 10000)
    "modernbert-decoder": (T.ModernBertDecoderConfig, T.ModernBertDecoderForCausalLM,
                           dict(COMMON, intermediate_size=96, num_hidden_layers=2, local_attention=16, sep_token_id=3,
                                cls_token_id=4),
                           lambda config: PositionPlan((LayerPlan(rope(1.6e5)), LayerPlan(rope(1e4), "sliding", 8))),
                           "sdpa"),
    # ZAYA: CCA attention (q, k convolved over time by the model), RoPE on half the head per layer type
    "zaya": (T.ZayaConfig, T.ZayaForCausalLM,
             dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, num_experts=2, num_experts_per_tok=1,
                  layer_types=["hybrid", "hybrid_sliding"]),
             lambda config: PositionPlan((LayerPlan(rope(5e6, rotary_dim=8)), LayerPlan(rope(1e4, rotary_dim=8),
                                                                                        "sliding", 8))), "sdpa"),
    # sliding / full hybrids with one rope dict per layer type
    "kolibri1": (T.Kolibri1Config, T.Kolibri1ForCausalLM,
                 dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention"],
                      rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                 # its full layers apply no rotary where there is a window ("global NoPE", as EXAONE 4)
                 lambda config: PositionPlan((LayerPlan(rope(5e5), "sliding", 8), LayerPlan(None))), "sdpa"),
    "laguna": (T.LagunaConfig, T.LagunaForCausalLM,
               dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, num_experts=2, num_experts_per_tok=1,
                    moe_intermediate_size=32, layer_types=["sliding_attention", "full_attention"]),
               lambda config: PositionPlan((LayerPlan(rope(1e4), "sliding", 8),
                                            LayerPlan(rope(5e5, rotary_dim=8)))), "sdpa"),
    # Mellum: Laguna's model with Qwen3-MoE's attention; its own rope dicts per layer type (1e4 sliding, 5e5 full)
    "mellum": (T.MellumConfig, T.MellumForCausalLM,
               dict(SMALL, num_hidden_layers=2, head_dim=16, sliding_window=8, num_experts=2, num_experts_per_tok=1,
                    moe_intermediate_size=32, layer_types=["sliding_attention", "full_attention"]),
               lambda config: PositionPlan((LayerPlan(rope(1e4), "sliding", 8), LayerPlan(rope(5e5)))), "sdpa"),
    "mimo_v2_flash": (T.MiMoV2FlashConfig, T.MiMoV2FlashForCausalLM,
                      dict(SMALL, num_hidden_layers=2, head_dim=24, v_head_dim=16, sliding_window=8, n_routed_experts=2,
                           num_experts_per_tok=1, moe_intermediate_size=32,
                           layer_types=["full_attention", "sliding_attention"]),
                      lambda config: PositionPlan((LayerPlan(rope(5e6, head_dim=24, rotary_dim=8)),
                                                   LayerPlan(rope(1e4, head_dim=24, rotary_dim=8), "sliding", 8))),
                      "eager"),
    # LFM3: a convolution, a sliding layer (theta 1e4), a full layer (proportional over half the head)
    "lfm3": (T.Lfm3Config, T.Lfm3ForCausalLM,
             dict(SMALL, num_hidden_layers=3, head_dim=16, sliding_window=8,
                  layer_types=["conv", "sliding_attention", "full_attention"]),
             lambda config: PositionPlan((LayerPlan(None), LayerPlan(rope(1e4), "sliding", 8), LayerPlan(rope(
                 1e6, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5})))), "sdpa"),
    # OLMo Hybrid and LARA Mini: Gated DeltaNet layers beside attention (LARA Mini: RoPE on its sliding layers only)
    "olmo_hybrid": (T.OlmoHybridConfig, T.OlmoHybridForCausalLM,
                    dict(SMALL, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                         rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
                    by_type(lambda t: rope(5e5) if t == "full_attention" else None), "sdpa"),
    "lara_mini": (T.LaraMiniConfig, T.LaraMiniForCausalLM,
                  dict(SMALL, num_hidden_layers=3, head_dim=16, sliding_window=8, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                       layer_types=["linear_attention", "sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                  lambda config: PositionPlan((LayerPlan(None), LayerPlan(rope(1e6), "sliding", 8), LayerPlan(None))),
                  "sdpa"),
}

#: Guarantee (a), measured here (CPU, float32, torch's default threads): max |logits(use_encoding(own plan)) -
#: logits(model)| over a (2, 20) batch, and the model's own noise |eager - sdpa| (0 where both are eager).
MEASURED = {
    "llama": (2.83e-07, 2.98e-07), "mistral": (3.58e-07, 2.98e-07), "qwen2": (3.58e-07, 3.58e-07),
    "qwen3": (4.17e-07, 3.58e-07), "gemma": (3.58e-06, 5.25e-06), "gemma2": (2.86e-06, 0.0),
    "gemma3_text": (3.34e-06, 3.34e-06), "cohere": (2.24e-08, 2.24e-08), "cohere2": (2.61e-08, 2.42e-08),
    "smollm3": (3.58e-07, 3.87e-07), "gpt_oss": (2.38e-07, 0.0), "qwen3_next": (1.43e-06, 1.43e-06),
    "phi3": (2.38e-07, 4.77e-07), "olmo2": (3.65e-07, 6.85e-07), "olmo3": (4.77e-07, 5.96e-07), "gpt_neox": (4.77e-07, 3.58e-07),
    "gptj": (2.98e-07, 3.58e-07), "stablelm": (2.98e-07, 5.96e-07), "persimmon": (5.96e-07, 5.96e-07),
    "llama4_text": (2.98e-07, 3.58e-07),
    "mixtral": (3.87e-07, 0.0), "qwen3_moe": (2.68e-07, 0.0), "phi": (3.58e-07, 0.0), "deepseek_v3": (2.98e-07, 0.0),
    "gemma4_text": (3.58e-07, 0.0), "qwen2_vl": (3.58e-07, 4.77e-07), "qwen2_5_vl": (3.58e-07, 3.58e-07),
    "arcee": (5.96e-07, 5.66e-07), "apertus": (2.98e-07, 4.77e-07), "seed_oss": (3.28e-07, 3.58e-07),
    "helium": (3.28e-07, 3.58e-07), "ernie4_5": (2.98e-07, 2.76e-07), "ernie4_5_moe": (3.28e-07, 2.98e-07),
    "glm": (3.58e-07, 4.17e-07), "glm4": (3.87e-07, 6.26e-07), "glm4_moe": (3.58e-07, 4.77e-07),
    "granite": (2.38e-07, 4.17e-07), "granitemoe": (3.43e-07, 4.17e-07), "granitemoeshared": (3.58e-07, 3.58e-07),
    "hunyuan_v1_dense": (3.58e-07, 4.17e-07), "hunyuan_v1_moe": (2.98e-07, 3.87e-07),
    "starcoder2": (4.17e-07, 3.58e-07), "phimoe": (4.77e-07, 4.17e-07), "exaone4": (4.77e-07, 5.59e-07),
    "dots1": (4.17e-07, 4.17e-07), "vaultgemma": (4.71e-06, 0.0), "minimax_m2": (2.38e-07, 4.77e-07),
    "ministral": (3.58e-07, 5.96e-07), "ministral3": (2.98e-07, 2.98e-07),
    "deepseek_v2": (2.98e-07, 2.98e-07), "qwen3_vl": (2.98e-07, 3.28e-07),
    "qwen3_5_text": (1.91e-06, 1.91e-06),
    "lfm2": (3.87e-07, 4.17e-07), "bamba": (4.47e-07, 3.58e-07), "granitemoehybrid": (3.58e-07, 5.96e-07),
    "falcon_h1": (2.38e-07, 3.58e-07), "mistral3": (4.23e-07, 4.17e-07),
    "mllama_text_model": (2.98e-07, 3.58e-07), "lfm2_moe": (2.38e-07, 4.17e-07), "glm4_moe_lite": (2.98e-07, 2.38e-07),
    "qwen3_vl_moe": (3.58e-07, 2.98e-07), "qwen3_5": (1.43e-06, 1.43e-06), "cosmos3_omni": (2.98e-07, 3.28e-07),
    "gemma3n_text": (9.54e-07, 6.3e-07),
    "internlm3": (2.38e-07, 3.58e-07), "exaone": (3.28e-07, 3.28e-07), "jetmoe": (2.98e-07, 2.98e-07),
    "bitnet": (4.17e-07, 5.36e-07), "diffllama": (3.87e-07, 3.58e-07), "cwm": (3.87e-07, 4.17e-07),
    "granite_swa": (4.17e-07, 0.0), "granitemoe_swa": (2.98e-07, 0.0), "afmoe": (4.77e-07, 4.77e-07),
    "exaone_moe": (2.98e-07, 3.91e-07), "cohere2_moe": (1.86e-08, 2.61e-08),
    "deepseek_v32": (3.58e-07, 4.17e-07), "glm_moe_dsa": (3.58e-07, 3.58e-07), "codegen": (3.58e-07, 4.77e-07),
    "glm4v": (4.77e-07, 5.36e-07), "doge": (4.77e-07, 6.41e-07),
    "hyperclovax": (4.17e-07, 4.17e-07), "iquestcoder": (2.68e-07, 4.77e-07), "jais2": (3.58e-07, 4.77e-07),
    "flex_olmo": (4.17e-07, 5.96e-07), "aria_text": (3.73e-07, 5.36e-07), "gpt_neox_japanese": (4.17e-07, 0.0),
    "axk1": (4.17e-07, 4.77e-07), "axk2": (2.98e-07, 2.68e-07), "hy_v3": (3.58e-07, 4.77e-07),
    "flint": (4.77e-07, 0.0), "dory": (3.58e-07, 3.28e-07),
    # issue 34, list B
    "qwen2_moe": (3.58e-07, 2.98e-07), "olmo": (3.81e-06, 4.93e-06), "olmoe": (2.38e-07, 3.58e-07),
    "solar_open": (2.46e-07, 3.58e-07), "nemotron": (3.46e-06, 5.01e-06), "zamba2": (7.15e-07, 8.94e-07),
    "minimax": (4.77e-07, 7.86e-07), "sarvam_mla": (2.98e-07, 4.17e-07), "youtu": (4.17e-07, 2.98e-07),
    "minicpm3": (9.54e-07, 7.15e-07), "sarvam_moe": (3.28e-07, 4.77e-07), "kolibri1": (3.87e-07, 6.56e-07),
    "laguna": (4.77e-07, 5.07e-07), "mellum": (2.98e-07, 2.98e-07), "mimo_v2_flash": (3.58e-07, 0.0), "lfm3": (4.77e-07, 4.77e-07),
    "olmo_hybrid": (4.17e-07, 5.96e-07), "lara_mini": (4.17e-07, 5.66e-07), "minimax_m3_vl_text": (4.02e-06, 4.77e-06),
    "modernbert-decoder": (3.58e-07, 4.77e-07), "zaya": (2.98e-07, 3.73e-07),
}

#: The hybrids whose attention applies no positions at all (issue 34, list B): their config,
#: as transformers builds it (Mamba 2 / MLP / experts / KDA layers beside the attention layers).
NOPE_HYBRIDS = {
    "nemotron_h": (T.NemotronHConfig, T.NemotronHForCausalLM,
                   dict(SMALL, head_dim=16, layers_block_type=["mamba", "attention", "mlp"], mamba_num_heads=4,
                        mamba_head_dim=32, ssm_state_size=8, n_groups=1, chunk_size=8)),
    "jamba": (T.JambaConfig, T.JambaForCausalLM,
              dict(SMALL, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1, num_experts=2,
                   num_experts_per_tok=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8)),
    "zamba": (T.ZambaConfig, T.ZambaForCausalLM,
              dict(SMALL, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], n_mamba_heads=2,
                   mamba_d_state=8)),
    "kimi_linear": (T.KimiLinearConfig, T.KimiLinearForCausalLM,
                    dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, layer_types=["linear_attention", "full_attention"],
                         mlp_layer_types=["dense", "dense"], qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                         kv_lora_rank=16, linear_head_dim=16, linear_num_heads=4)),
}


def build(family, attn=None, **overrides):
    config_class, model_class, kwargs, _, default_attn = FAMILIES[family]
    config = config_class(**{**kwargs, **overrides})
    config._attn_implementation = attn or default_attn
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def own_plan(model):
    return FAMILIES[model.config.model_type][3](model.config)


def train_a_few_steps(model, batch, steps=4):
    """The losses of ``steps`` AdamW steps on one fixed batch (guarantee (b): they fall)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def plain_reload_logits(model, model_class, folder, x, attn="sdpa"):
    """save_pretrained, then a plain transformers from_pretrained (no posenc): its logits on x."""
    model.save_pretrained(folder)
    plain = model_class.from_pretrained(folder, attn_implementation=attn).eval()
    with torch.no_grad():
        return plain(x).logits


def tokens(batch=2, length=20, seed=1):
    return torch.randint(3, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def left_padded(x, pad):
    batch = x.clone()
    batch[1, :pad] = 0
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    return batch, mask


def wrong(plan):
    """The plan with every RoPE's base divided by 100."""
    def changed(encoding):
        if isinstance(encoding, posenc.MRoPE):
            return posenc.MRoPE(encoding.head_dim, mrope_section=encoding.mrope_section, base=encoding.base / 100,
                                rotary_dim=encoding.rotary_dim, interleaved=encoding.interleaved)
        if not isinstance(encoding, posenc.RoPE):  # NoPE, and Llama 4's temperature
            return encoding
        return posenc.RoPE(encoding.head_dim, rotary_dim=encoding.rotary_dim, base=encoding.base / 100,
                           scaling=encoding.scaling, interleaved=encoding.interleaved)
    return PositionPlan(tuple(LayerPlan(changed(layer.encoding), layer.span, layer.window, layer.layer_type, layer.sinks)
                              for layer in plan))


#: One family per kind of plan, whose cases run by default; every other family's run with
#: ``pytest -m slow`` (the default suite's time budget: ~7 tests per family). A new FAMILIES entry
#: is slow unless it brings a kind not below: then add it here, with its kind.
REPRESENTATIVE = {
    "llama": "Llama-shaped: one RoPE on every layer",
    "mistral": "sliding window on every layer",
    "gemma3_text": "RoPE per layer type (sliding base 1e4, full linear x8 at 1e6)",
    "olmo3": "YaRN on the full_attention layers only (a v4 rope_scaling)",
    "smollm3": "NoPE layers (no_rope_layers flags)",
    "llama4_text": "NoPE layers with the model's attention temperature; interleaved pairs",
    "ministral3": "RoPE layers whose queries the model scales itself (llama_4_scaling_beta)",
    "cohere": "interleaved pairs",
    "gptj": "partial interleaved rotary, built per layer",
    "phi3": "partial rotary (partial_rotary_factor)",
    "gemma4_text": "a wider head on the global layers (proportional RoPE)",
    "qwen2_vl": "M-RoPE, text tower inside a VL wrapper",
    "qwen3_vl": "interleaved M-RoPE",
    "deepseek_v3": "MLA: RoPE on the qk_rope_head_dim part",
    "lfm2": "a hybrid: layers without attention (None in the plan)",
    "gemma2": "attention logit softcapping (eager)",
    "vaultgemma": "softcap in the plan",
    "gpt_oss": "attention sinks, YaRN",
    "granite_swa": "a RoPE theta per layer (0: NoPE), sinks",
    "zamba2": "a hybrid whose attention sits at a dotted path (shared_transformer.self_attn)",
}


def families(names=None):
    """``names`` (default: every family) as pytest parameters, all but REPRESENTATIVE's marked slow."""
    return [pytest.param(f, marks=() if f in REPRESENTATIVE else pytest.mark.slow)
            for f in (FAMILIES if names is None else names)]


def test_every_representative_is_a_family():
    assert set(REPRESENTATIVE) <= set(FAMILIES), set(REPRESENTATIVE) - set(FAMILIES)


@pytest.mark.parametrize("family", families())
def test_own_plan_reproduces_the_model(family):
    reference = build(family)
    x = tokens()
    with torch.no_grad():
        expected = reference(x).logits
        noise = (build(family, "eager")(x).logits - expected).abs().max().item()
    tolerance = max(1e-5, 2 * noise)
    model = use_encoding(build(family), own_plan(reference))
    with torch.no_grad():
        difference = (model(x).logits - expected).abs().max().item()
    assert difference <= tolerance, (family, difference, tolerance)
    assert difference <= max(1e-5, 4 * max(MEASURED[family]))  # the recorded values still hold
    # left padding and the cache: the same greedy tokens as the model's own
    batch, mask = left_padded(x[:, :10], pad=4)
    generated = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(generated, reference.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False))
    with torch.no_grad():
        padded = model(batch, attention_mask=mask).logits[:, 4:]
        assert (padded - reference(batch, attention_mask=mask).logits[:, 4:]).abs().max() <= tolerance
    # a wrong plan moves the logits: the check above can fail
    use_encoding(model, wrong(own_plan(reference)))
    with torch.no_grad():  # (Cohere's logits are small: logit_scale 1/16)
        assert (model(x).logits - expected).abs().max() > max(1e-3 * expected.abs().max(), 100 * difference)


@pytest.mark.parametrize("family", families())
def test_the_read_plan_reproduces_the_model(family):
    """Guarantee (a) end to end: use_encoding(model, position_plan(model.config)), the plan
    posenc reads from the config (not built by hand), gives the model's own logits."""
    from posenc.integrations.transformers import position_plan

    reference = build(family)
    x = tokens()
    with torch.no_grad():
        expected = reference(x).logits
        noise = (build(family, "eager")(x).logits - expected).abs().max().item()
    model = use_encoding(build(family), position_plan(reference.config))
    with torch.no_grad():
        difference = (model(x).logits - expected).abs().max().item()
    assert difference <= max(1e-5, 2 * noise), (family, difference, noise)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "cosmos3_omni"])
def test_qwen_vl_read_plan_reproduces_image_like_mrope_positions(family):
    """M-RoPE positions (3, B, T) whose axes differ (text, a 1 x 4 x 6 image grid, text, as
    get_rope_index lays them out) given to the VL model: posenc's M-RoPE tables, read from the
    config, give the model's logits; another mrope_section (the same pairs, other axes) does not.
    rope_theta 100 here, so that with 8 pairs the height and width axes reach high frequencies."""
    from posenc.integrations.transformers import position_plan

    text = FAMILIES[family][2]["text_config"]
    low_base = dict(text_config=dict(text, rope_parameters=dict(text["rope_parameters"], rope_theta=100.0)))
    reference = build(family, **low_base)
    ids = posenc.mrope_position_ids([4, (1, 4, 6), 4], spatial_merge_size=1)  # (3, 32)
    assert not torch.equal(ids[1], ids[2])
    positions = ids[:, None].expand(3, 2, -1)
    x = tokens(length=ids.shape[1])
    with torch.no_grad():
        expected = reference(x, position_ids=positions).logits
        noise = (build(family, "eager", **low_base)(x, position_ids=positions).logits - expected).abs().max().item()
        model = use_encoding(build(family, **low_base), position_plan(reference.config))
        difference = (model(x, position_ids=positions).logits - expected).abs().max().item()
        assert difference <= max(1e-5, 2 * noise), (family, difference, noise)
        # the check can fail: the sections reversed, or a plain RoPE reading the temporal axis only
        section = model.model.language_model.posenc_plan[0].encoding.mrope_section
        assert model.model.language_model.posenc_plan[0].encoding.base == 100.0
        for other in (posenc.MRoPE(16, mrope_section=section[::-1], base=100.0), posenc.RoPE(16, base=100.0)):
            use_encoding(model, PositionPlan(tuple(LayerPlan(other) for _ in range(2))))
            assert (model(x, position_ids=positions).logits - expected).abs().max() > max(1e-3, 100 * difference)
        assert (model(x).logits - reference(x).logits).abs().max() <= max(1e-5, 2 * noise)  # text: every axis equal


def test_glm4v_moe_read_plan_reproduces_the_model():
    """GLM-4.5V (MoE): half-split chunked M-RoPE over half the head, read from the config, gives the
    model's logits on text positions and on (t, h, w) positions whose axes differ; a wrong base
    moves them. (Its decoder layers are handed the (3, B, T) position ids, which posenc's own
    attention route does not take yet: the encodings by name are not run on it here.)"""
    from posenc.integrations.transformers import position_plan

    config = T.Glm4vMoeConfig(**GLM4V_MOE)
    torch.manual_seed(0)
    reference = T.Glm4vMoeForConditionalGeneration(config)
    with torch.no_grad():
        for parameter in reference.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    reference.eval()
    ids = posenc.mrope_position_ids([4, (1, 4, 6), 4], spatial_merge_size=1)[:, None].expand(3, 2, -1)
    x = tokens(length=ids.shape[-1])
    model = use_encoding(copy.deepcopy(reference), position_plan(reference.config))
    with torch.no_grad():
        for positions in (None, ids):
            expected = reference(x, position_ids=positions).logits
            difference = (model(x, position_ids=positions).logits - expected).abs().max().item()
            assert difference <= 1e-5, difference
        use_encoding(model, wrong(position_plan(reference.config)))
        assert (model(x, position_ids=ids).logits - expected).abs().max() > 1e-3


#: Families whose read plan is checked here but not the encodings by name: their decoder layers
#: take what posenc's own attention route does not serve yet (GLM-4.5V: (3, B, T) position ids;
#: Hy V4: learned sinks with value heads narrower than the query heads, which the sinks backend refuses;
#: Bailing hybrid: its linear-attention layers' modules sit where the attention does, as self_attn).
READ_ONLY = {
    # Bailing (Ling) hybrid: MLA (interleaved RoPE on qk_rope_head_dim) on layer 1, linear attention on layer 0
    "bailing_hybrid": (T.BailingHybridConfig, T.BailingHybridForCausalLM,
                       dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, layer_group_size=2, q_lora_rank=32,
                            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_experts=2,
                            num_experts_per_tok=1, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                            topk_group=1), "sdpa"),
    "hy_v4": (T.HYV4Config, T.HYV4ForCausalLM,
              dict(SMALL, num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=2, num_experts_per_tok=1,
                   moe_intermediate_size=32, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                   v_head_dim=16, index_head_dim=16, index_n_heads=2), "eager"),
}


@pytest.mark.parametrize("family", list(READ_ONLY))
def test_read_plan_reproduces_a_read_only_family(family):
    """use_encoding(model, position_plan(config)) gives the model's own logits and greedy tokens
    with the cache (Hy V4: MLA with half-split RoPE on qk_rope_head_dim, learned sinks); a plan
    whose base is off moves the logits."""
    from posenc.integrations.transformers import position_plan

    config_class, model_class, kwargs, attn = READ_ONLY[family]

    def tiny():
        config = config_class(**kwargs)
        config._attn_implementation = attn
        torch.manual_seed(0)
        model = model_class(config)
        with torch.no_grad():
            for parameter in model.parameters():
                torch.nn.init.normal_(parameter, std=0.2)
        return model.eval()

    reference, x = tiny(), tokens()
    model = use_encoding(tiny(), position_plan(reference.config))
    with torch.no_grad():
        expected = reference(x).logits
        difference = (model(x).logits - expected).abs().max().item()
        assert difference <= 1e-5, difference
    prompt = x[:, :8]
    assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False),
                       reference.generate(prompt, max_new_tokens=6, do_sample=False))
    use_encoding(model, wrong(position_plan(reference.config)))
    with torch.no_grad():
        assert (model(x).logits - expected).abs().max() > max(1e-3, 100 * difference)


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_indexer_reads_the_plans_rope(family):
    """DeepSeek Sparse Attention: with index_topk 8 of 20 keys the lightning indexer's selection
    (its own RoPE on the layer's tables: half-split on DeepSeek-V3.2, interleaved on GLM-5) changes
    the logits; use_encoding(model, position_plan(config)) still gives the model's own, and a
    plan whose base is off moves them. (transformers' own DSA gives other logits with the cache
    than without at such a top-k, so generate is not compared here.)"""
    from posenc.integrations.transformers import position_plan

    reference, keep_all = build(family, index_topk=8), build(family)
    x = tokens()
    with torch.no_grad():
        expected = reference(x).logits
        assert (keep_all(x).logits - expected).abs().max() > 1e-3  # the indexer selects: the check reaches it
        noise = (build(family, "eager", index_topk=8)(x).logits - expected).abs().max().item()
        model = use_encoding(build(family, index_topk=8), position_plan(reference.config))
        difference = (model(x).logits - expected).abs().max().item()
        assert difference <= max(1e-5, 2 * noise), (difference, noise)
        use_encoding(model, wrong(position_plan(reference.config)))
        assert (model(x).logits - expected).abs().max() > max(1e-3, 100 * difference)


#: (b): names on all layers, and on some layers; the families whose layers refuse them are tested below.
B_CASES = [("alibi", None), ("t5", "last"), ("rope", None), ("nope", "last")]


def _b_model(family):
    overrides = {"attn_logit_softcapping": None} if family == "gemma2" else {}
    return build(family, **overrides)


#: Families whose layers fail on posenc's own attention route (xfail, strict): family -> why
#: (MiMo-V2-Flash's sinks with values narrower than q and k were one, fixed in attention/sdpa.py).
POSENC_ROUTE_FAILS: dict[str, str] = {}


@pytest.mark.parametrize("family", families([f for f in FAMILIES if f != "gpt_oss"]))
@pytest.mark.parametrize("name,layers", B_CASES)
def test_encodings_by_name_train_and_generate_with_the_cache(family, name, layers, request):
    if family in POSENC_ROUTE_FAILS and name != "nope":  # NoPE keeps the model's own attention
        request.applymarker(pytest.mark.xfail(strict=True, reason=POSENC_ROUTE_FAILS[family]))
    model = _b_model(family)
    if layers == "last":
        layers = [getattr(model.config, "text_config", model.config).num_hidden_layers - 1]
    model = use_encoding(model, name, layers=layers)
    model.train()
    batch = tokens(batch=4, length=12, seed=3)
    losses = train_a_few_steps(model, batch)
    assert losses[-1] < losses[0], losses
    model.eval()
    prompt = batch[:2, :6]
    options = dict(max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)
    cached, uncached = model.generate(prompt, use_cache=True, **options), model.generate(prompt, use_cache=False, **options)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-4


def test_layers_change_only_the_layers_named():
    reference = build("llama")
    x = tokens()
    model = use_encoding(build("llama"), "alibi", layers=[1])
    assert "_posenc_encoding" not in model.model.layers[0].self_attn.__dict__
    assert "_posenc_encoding" in model.model.layers[1].self_attn.__dict__
    hidden = {}
    for m, key in ((reference, "ref"), (model, "new")):
        m.model.layers[0].register_forward_hook(lambda mod, a, out, key=key: hidden.__setitem__(key, out))
    with torch.no_grad():
        expected, got = reference(x).logits, model(x).logits
    assert (hidden["ref"] - hidden["new"]).abs().max() < 1e-5  # layer 0 keeps the model's RoPE
    assert (expected - got).abs().max() > 1e-3  # layer 1 is ALiBi now


def test_static_cache_is_refused_with_posenc_attention_and_works_with_tables():
    model = use_encoding(build("llama"), "alibi")
    prompt = tokens()[:, :6]
    with pytest.raises(InvalidArgument, match="StaticCache"):
        model.generate(prompt, max_new_tokens=3, do_sample=False, cache_implementation="static")
    reference = build("llama")
    own = use_encoding(build("llama"), own_plan(reference))
    assert torch.equal(own.generate(prompt, max_new_tokens=3, do_sample=False, cache_implementation="static"),
                       reference.generate(prompt, max_new_tokens=3, do_sample=False))


def test_head_count_mismatch_is_refused_naming_both_counts():
    with pytest.raises(InvalidArgument, match="num_heads=8.*4 query heads"):
        use_encoding(build("llama"), posenc.create("alibi", num_heads=8))
    with pytest.raises(InvalidArgument, match="num_heads=2.*4 heads"):
        q = torch.randn(1, 4, 5, 16)
        posenc.attention(q, q, q, posenc.create("t5", num_heads=2))


def test_a_plan_of_the_wrong_length_is_refused():
    with pytest.raises(InvalidArgument, match="3 layers for a model with 2"):
        use_encoding(build("llama"), PositionPlan(tuple(LayerPlan(rope()) for _ in range(3))))


def test_extend_context_refuses_an_all_nope_model_and_leaves_it_unchanged():
    model = build("smollm3", no_rope_layers=[0, 0, 0, 0])
    use_encoding(model, own_plan(model))
    before = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="every layer is NoPE"):
        extend_context(model, "yarn", 4.0)
    assert model.config.to_dict() == before


def test_extend_context_scales_gemma3_global_layers_and_round_trips(tmp_path):
    """Gemma 3 1B's shape (no scaling yet, global base 1e6): extend_context scales the global
    layers only (linear x8, Google's long-context recipe); the sliding layers keep theirs."""
    unscaled = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
    already = build("gemma3_text")  # global layers linear x8 already: refused, nothing changed
    use_encoding(already, own_plan(already))
    before = already.config.to_dict()
    with pytest.raises(InvalidArgument, match="already scaled"):
        extend_context(already, "linear", 4.0)
    assert already.config.to_dict() == before
    model = build("gemma3_text", rope_parameters=unscaled)
    use_encoding(model, PositionPlan(tuple(LayerPlan(rope(1e4 if t == "sliding_attention" else 1e6), layer_type=t)
                                           for t in GEMMA3_TYPES)))
    before = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="not among"):
        extend_context(model, "yarn", 2.0, layer_types=["global"])
    assert model.config.to_dict() == before  # atomic
    extend_context(model, "linear", 8.0)
    assert model.config.rope_parameters["sliding_attention"] == unscaled["sliding_attention"]
    assert model.config.rope_parameters["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    x = tokens(length=40)
    with torch.no_grad():
        extended = model(x).logits
    assert (plain_reload_logits(model, T.Gemma3ForCausalLM, tmp_path, x) - extended).abs().max() < 1e-5
    with torch.no_grad():
        assert (build("gemma3_text", rope_parameters=unscaled)(x).logits - extended).abs().max() > 1e-3
    sliding_only = build("gemma3_text", rope_parameters=unscaled)
    use_encoding(sliding_only, PositionPlan(tuple(LayerPlan(rope(1e4 if t == "sliding_attention" else 1e6), layer_type=t)
                                                  for t in GEMMA3_TYPES)))
    extend_context(sliding_only, "linear", 2.0, layer_types=["sliding_attention"])
    assert sliding_only.config.rope_parameters["full_attention"] == unscaled["full_attention"]
    assert sliding_only.config.rope_parameters["sliding_attention"]["factor"] == 2.0


def test_extend_context_keeps_cohere_interleaved_and_round_trips(tmp_path):
    """Without a recorded plan, the family's pair layout (Cohere: interleaved) is kept: the
    extended model equals a plain reload of its config (the issue's 0.29 logit error)."""
    model = build("cohere")
    extend_context(model, "yarn", 4.0)
    x = tokens(length=40)
    with torch.no_grad():
        extended = model(x).logits
    assert (plain_reload_logits(model, T.CohereForCausalLM, tmp_path, x) - extended).abs().max() < 1e-5
    with torch.no_grad():
        assert (build("cohere")(x).logits - extended).abs().max() > 1e-4


@pytest.mark.parametrize("name,layers", [("rope", None), ("nope", [0])])
def test_gpt_oss_keeps_its_sinks_with_tables_and_trains(name, layers):
    model = use_encoding(build("gpt_oss"), name, layers=layers)
    assert model.config._attn_implementation == "eager"  # the model's own attention, sinks included
    model.train()
    batch = tokens(batch=4, length=12, seed=3)
    losses = train_a_few_steps(model, batch)
    assert losses[-1] < losses[0], losses
    model.eval()
    prompt = batch[:2, :6]
    assert torch.equal(model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True),
                       model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False))


def test_llama4_native_temperature_is_kept_for_its_own_plan_and_replaced_otherwise():
    """Llama 4 scales its NoPE layers' queries itself: a plan with the same temperature keeps
    that (no double scaling: the read plan reproduces the model above); another encoding on
    those layers replaces it (the model's own scaling off), and a later use_encoding restores it."""
    model = build("llama4_text")
    x = tokens()
    with torch.no_grad():
        expected = model(x).logits
    nope_layer = model.model.layers[3].self_attn
    use_encoding(model, "nope", layers=[3])
    assert nope_layer.attn_temperature_tuning is False
    use_encoding(model, own_plan(model))
    assert nope_layer.attn_temperature_tuning is True
    with torch.no_grad():  # the model's own temperature alone (the plan's read while it was off: not twice)
        assert (model(x).logits - expected).abs().max() <= 1e-5


def test_ministral3_native_query_scale_is_kept_for_its_own_plan_and_turned_off_otherwise():
    """Ministral 3 scales its queries itself, reading llama_4_scaling_beta from its config at each
    call: its own plan keeps that (the read plan reproduces the model above); a plain RoPE turns it
    off on its layers (the logits of the same model with beta 0), and the model's config, which
    save_pretrained writes, keeps beta 0.1; its own plan again gives the model back."""
    model = build("ministral3")
    x = tokens()
    with torch.no_grad():
        scaled = model(x).logits
        plain = build("ministral3", rope_parameters={**MINISTRAL3_YARN, "llama_4_scaling_beta": 0.0})(x).logits
    assert (scaled - plain).abs().max() > 1e-3  # the scale matters at these positions
    unscaled = posenc.RoPE(16, base=1e6, scaling={k: v for k, v in MINISTRAL3_YARN.items()
                                                 if k not in ("rope_theta", "llama_4_scaling_beta")})
    use_encoding(model, PositionPlan.uniform(unscaled, 2))
    assert model.config.rope_parameters["llama_4_scaling_beta"] == 0.1
    with torch.no_grad():
        assert (model(x).logits - plain).abs().max() <= 1e-5
        # the layers' config view survives a deepcopy (a bare copy probes it for __setstate__)
        assert (copy.deepcopy(model)(x).logits - plain).abs().max() <= 1e-5
    use_encoding(model, own_plan(model))
    with torch.no_grad():
        assert (model(x).logits - scaled).abs().max() <= 1e-5


#: extend_context refusals of the test configs, each for its reason (the model and config unchanged).
EXTEND_REFUSED = {"lfm3": "already scaled", "gemma3_text": "already scaled", "gpt_oss": "already scaled", "olmo3": "already scaled",
                  "phi3": "Phi3Config refuses the extended config",  # Phi-3 accepts longrope only
                  "gemma4_text": "name the ones to scale",
                  # GPT-J's rotary: rotary_dim and base 10000 (create_sinusoidal_positions), nothing else
                  "gptj": "does not read a RoPE scaling.*create_sinusoidal_positions",
                  "arcee": "already scaled", "apertus": "already scaled",
                  "hunyuan_v1_dense": r"already scaled \(ntk\)",  # HunYuan's NTK-alpha, read as posenc's ntk
                  # PhiMoE scales cos / sin by short_mscale / long_mscale, which no posenc encoding computes
                  "phimoe": "short_mscale", "ministral3": "already scaled",
                  # Qwen3.5's text model alone: M-RoPE, which from_hf_config's one-RoPE reading refuses by name
                  "qwen3_5_text": "its layers are M-RoPE",
                  "cwm": "already scaled",  # CwmConfig's llama3 x16
                  # one theta per layer (layer_rope_theta, with a NoPE layer): extension_plan reads one RoPE
                  "granite_swa": r"RoPEs differ layer by layer \(layer_rope_theta = \[10000\.0, 0",
                  "codegen": "does not read a RoPE scaling.*create_sinusoidal_positions",
                  "dory": "name the ones to scale"}  # a rope dict per layer type, as Gemma 4


@pytest.mark.parametrize("family", families())
def test_extend_context_round_trips_through_plain_from_pretrained(family, tmp_path):
    """Item 3: linear x2 on every RoPE family; the written config loads in plain transformers
    (no posenc) to the same logits; or a refusal naming why, with nothing changed."""
    model = build(family)
    x = tokens()
    with torch.no_grad():
        before = model(x).logits
    if family in EXTEND_REFUSED:
        config = model.config.to_dict()
        with pytest.raises(InvalidArgument, match=EXTEND_REFUSED[family]):
            extend_context(model, "linear", 2.0)
        assert model.config.to_dict() == config
        return
    extend_context(model, "linear", 2.0)
    with torch.no_grad():
        extended = model(x).logits
    assert (extended - before).abs().max() > 1e-3  # the extension changed the positions: the check can fail
    reloaded = plain_reload_logits(model, FAMILIES[family][1], tmp_path, x, FAMILIES[family][4])
    assert (reloaded - extended).abs().max() <= 1e-5


@pytest.mark.parametrize("family", sorted(NOPE_HYBRIDS))
def test_a_nope_hybrid_reads_as_nope_and_takes_an_encoding_by_name(family):
    """NemotronH, Jamba, Zamba, Kimi Linear: position_plan reads every layer None, which
    use_encoding applies with the model's own logits and cached tokens (the Mamba / MLP layers
    skipped by their type, no tables handed to a model without a rotary module); RoPE by name
    moves the logits (so the check can fail) and generates the same with and without the cache;
    extend_context refuses, leaving the config as it was."""
    from posenc.integrations.transformers import position_plan

    config_class, model_class, kwargs = NOPE_HYBRIDS[family]

    def make():
        torch.manual_seed(0)
        model = model_class(config_class(**kwargs))
        with torch.no_grad():
            for parameter in model.parameters():
                torch.nn.init.normal_(parameter, std=0.2)
        return model.eval()

    reference, x = make(), tokens()
    plan = position_plan(reference.config)
    assert all(layer.encoding is None for layer in plan) and len(plan) == reference.config.num_hidden_layers
    with torch.no_grad():
        expected = reference(x).logits
        model = use_encoding(make(), plan)
        assert (model(x).logits - expected).abs().max() <= 1e-5
    prompt = x[:, :8]
    options = {"max_new_tokens": 5, "do_sample": False}
    assert torch.equal(model.generate(prompt, **options), reference.generate(prompt, **options))
    use_encoding(model, "rope")
    with torch.no_grad():
        assert (model(x).logits - expected).abs().max() > 1e-3
    assert torch.equal(model.generate(prompt, use_cache=True, **options), model.generate(prompt, use_cache=False, **options))
    fresh = make()
    config = fresh.config.to_dict()
    with pytest.raises(InvalidArgument):
        extend_context(fresh, "linear", 2.0)
    assert fresh.config.to_dict() == config


def test_extend_context_scales_olmo3s_full_attention_layers_by_default(tmp_path):
    """OLMo 3's record names the full_attention layers as those extend_context scales by default
    (its released configs carry YaRN there only): an unscaled OLMo 3 extended with linear x2 gets
    the scaling on those layers alone, and a plain transformers reload of the saved folder gives
    the same logits."""
    model = build("olmo3", rope_scaling=None)
    x = tokens()
    with torch.no_grad():
        before = model(x).logits
    extend_context(model, "linear", 2.0)
    params = model.config.rope_parameters
    assert (params["full_attention"]["rope_type"], params["sliding_attention"]["rope_type"]) == ("linear", "default")
    with torch.no_grad():
        extended = model(x).logits
    assert (extended - before).abs().max() > 1e-3  # the extension changed the positions: the check can fail
    reloaded = plain_reload_logits(model, T.Olmo3ForCausalLM, tmp_path, x)
    assert (reloaded - extended).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "cosmos3_omni"])
def test_extend_context_writes_the_qwen_vl_text_config_and_round_trips_on_mrope_positions(family, tmp_path):
    """Qwen2-VL / Qwen2.5-VL: the scaling goes to config.text_config's rope dict (where their
    text model's rotary embedding reads it), mrope_section kept; the top-level config's fields
    are not touched. On image-like M-RoPE positions (3, B, T) and past the original context, the
    extended model equals a plain transformers reload of the saved folder; refusals (already
    scaled) leave both configs unchanged."""
    text = FAMILIES[family][2]["text_config"]
    model = build(family, text_config=dict(text, max_position_embeddings=16))
    top = {k: v for k, v in model.config.to_dict().items() if k not in ("text_config", "posenc_plan")}
    ids = posenc.mrope_position_ids([4, (1, 4, 6), 4], spatial_merge_size=1)  # (3, 32)
    positions = ids[:, None].expand(3, 2, -1)
    x = tokens(length=ids.shape[1])
    with torch.no_grad():
        before = model(x, position_ids=positions).logits
    extend_context(model, "yarn", 4.0)
    rope = model.config.text_config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0 and rope["mrope_section"] == text["rope_parameters"][
        "mrope_section"]
    # (posenc_plan: use_encoding's record of the plan the model runs now)
    assert {k: v for k, v in model.config.to_dict().items() if k not in ("text_config", "posenc_plan")} == top
    with torch.no_grad():
        extended = model(x, position_ids=positions).logits
    assert (extended - before).abs().max() > 1e-3
    model.save_pretrained(tmp_path)
    plain = FAMILIES[family][1].from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    with torch.no_grad():
        assert (plain(x, position_ids=positions).logits - extended).abs().max() <= 1e-5
    config = model.config.to_dict()
    with pytest.raises(InvalidArgument, match="already scaled"):
        extend_context(model, "linear", 2.0)
    assert model.config.to_dict() == config


def test_gemma4_read_plan_reproduces_a_model_of_ten_layers_or_more():
    """From ten layers on, transformers writes Gemma 4's global width zero-padded
    (``per_layer_config {"05": {"head_dim": 32}, "11": ...}``): the plan read from the model's
    config (and from its saved dict) gives each layer that width and the model's own logits."""
    from posenc.integrations.transformers import position_plan

    reference = build("gemma4_text", num_hidden_layers=12)
    assert "05" in reference.config.to_dict()["per_layer_config"]
    x = tokens()
    with torch.no_grad():
        expected = reference(x).logits
        noise = (build("gemma4_text", "eager", num_hidden_layers=12)(x).logits - expected).abs().max().item()
    for config in (reference.config, reference.config.to_dict()):
        plan = position_plan(config)
        assert [layer.encoding.head_dim for layer in plan] == [32 if i % 6 == 5 else 16 for i in range(12)]
        model = use_encoding(build("gemma4_text", num_hidden_layers=12), plan)
        with torch.no_grad():
            difference = (model(x).logits - expected).abs().max().item()
        assert difference <= max(1e-5, 2 * noise), (difference, noise)
