"""position_plan(config) per family against transformers 5.x: for a config dict shaped like
each family's released config.json (shrunk), the plan's layer count, layer types, spans and
windows against the transformers config object built from the same dict, and each layer's
numbers against the family's own rotary embedding module: per frequency pair, cos and sin, and
the attention scores q_rot . k_rot of random q and k rotated by transformers' own apply
function (layout-free: a wrong base, layout or width moves them). Refusals name the key."""

from __future__ import annotations

import copy
import importlib
import inspect
import re
import warnings

import pytest
import torch

from posenc.encodings.irope import AttentionTemperature
from posenc.encodings.rope.multiaxis import MRoPE
from posenc.encodings.rope.query_scaled import QueryScaledRoPE, llama_4_attn_scale
from posenc.encodings.rope.rotary import RoPE
from posenc.errors import InvalidArgument, MissingKey
from posenc.hf_config import position_plan
from posenc.hf_config.families import FAMILIES

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402

TOL = 1e-5
SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
             intermediate_size=128, vocab_size=128, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

#: (case id, model_type, config dict shaped like the released config.json, shrunk)
CASES = [
    ("llama2", "llama", dict(SMALL, rope_theta=10000.0, rope_scaling=None)),
    ("llama3.1", "llama", dict(SMALL, rope_theta=500000.0, rope_scaling=LLAMA3)),
    ("llama-linear", "llama", dict(SMALL, rope_scaling={"type": "linear", "factor": 2.0})),
    ("llama-dynamic", "llama", dict(SMALL, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    ("llama-yarn-v5", "llama", dict(SMALL, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                            "original_max_position_embeddings": 64})),
    ("llama-longrope", "llama", dict(SMALL, max_position_embeddings=1024, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(8)],
        "long_factor": [2.0 + i / 4 for i in range(8)], "original_max_position_embeddings": 128})),
    ("llama-head_dim", "llama", dict(SMALL, head_dim=32, rope_theta=5e5)),
    ("mistral", "mistral", dict(SMALL, rope_theta=1e6, sliding_window=32, head_dim=16)),
    ("mistral-default-window", "mistral", dict(SMALL)),
    ("mixtral", "mixtral", dict(SMALL, rope_theta=1e6, sliding_window=None, num_local_experts=4)),
    ("qwen2", "qwen2", dict(SMALL, rope_theta=1e6, use_sliding_window=True, sliding_window=16, max_window_layers=2)),
    ("qwen2.5-yarn", "qwen2", dict(SMALL, rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                                                          "original_max_position_embeddings": 64})),
    ("qwen3", "qwen3", dict(SMALL, head_dim=16, rope_theta=1e6, use_sliding_window=False, sliding_window=None)),
    ("qwen3-default-head", "qwen3", dict(SMALL, rope_theta=1e6)),
    ("qwen3_moe", "qwen3_moe", dict(SMALL, head_dim=16, rope_theta=1e6, num_experts=4, moe_intermediate_size=32)),
    ("qwen3_next", "qwen3_next", dict(SMALL, head_dim=32, rope_theta=1e7, partial_rotary_factor=0.25,
                                      full_attention_interval=2, num_experts=4, moe_intermediate_size=32)),
    ("qwen2_vl-flat", "qwen2_vl", dict(SMALL, rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})),
    ("qwen2_5_vl-nested", "qwen2_5_vl", dict(text_config=dict(
        SMALL, model_type="qwen2_5_vl_text", rope_theta=1e6,
        rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [4, 2, 2]}))),
    ("gemma", "gemma", dict(SMALL, head_dim=32, rope_theta=10000.0)),
    ("gemma2", "gemma2", dict(SMALL, head_dim=16, sliding_window=16)),
    ("gemma3_text-v4", "gemma3_text", dict(SMALL, num_hidden_layers=7, head_dim=16, rope_theta=1e6,
                                           rope_local_base_freq=10000.0, sliding_window=16, sliding_window_pattern=6,
                                           rope_scaling={"rope_type": "linear", "factor": 8.0})),
    ("gemma3-nested", "gemma3", dict(text_config=dict(
        SMALL, model_type="gemma3_text", num_hidden_layers=4, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))),
    ("gemma4_text", "gemma4_text", dict(SMALL, num_hidden_layers=6, head_dim=16, global_head_dim=32, sliding_window=8,
                                        hidden_size_per_layer_input=16, vocab_size_per_layer_input=128)),
    ("phi", "phi", dict(SMALL, partial_rotary_factor=0.5, rope_theta=10000.0)),
    ("phi3-longrope", "phi3", dict(SMALL, max_position_embeddings=1024, original_max_position_embeddings=128,
                                   sliding_window=64, rope_scaling={
                                       "type": "longrope", "short_factor": [1.0 + i / 8 for i in range(8)],
                                       "long_factor": [2.0 + i / 4 for i in range(8)]})),
    ("phi4-partial", "phi3", dict(SMALL, partial_rotary_factor=0.75, rope_theta=250000.0)),
    ("cohere", "cohere", dict(SMALL, rope_theta=8e6, logit_scale=0.0625)),
    ("cohere2", "cohere2", dict(SMALL, rope_theta=50000.0, sliding_window=16, sliding_window_pattern=4)),
    ("olmo2", "olmo2", dict(SMALL, rope_theta=500000.0)),
    ("olmo3", "olmo3", dict(SMALL, num_hidden_layers=8, sliding_window=16, rope_theta=500000,
                            layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2,
                            rope_scaling={"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
                                          "factor": 4.0, "original_max_position_embeddings": 64, "rope_type": "yarn"})),
    ("olmo3-theta-defaults", "olmo3", dict(SMALL, rope_theta=1e6)),
    ("smollm3", "smollm3", dict(SMALL, num_hidden_layers=8, rope_theta=5e6, no_rope_layer_interval=4)),
    ("smollm3-list", "smollm3", dict(SMALL, no_rope_layers=[1, 0, 1, 1], use_sliding_window=True, sliding_window=8)),
    ("gpt_oss", "gpt_oss", dict(SMALL, head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
                                rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                              "truncate": False, "original_max_position_embeddings": 64})),
    ("deepseek_v3", "deepseek_v3", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                        q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                        topk_group=1, rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                                                    "mscale_all_dim": 1.0,
                                                                    "original_max_position_embeddings": 64})),
    ("gpt_neox", "gpt_neox", dict(SMALL, rotary_pct=0.5, rotary_emb_base=20000)),
    ("gpt_neox-defaults", "gpt_neox", dict(SMALL)),
    # issue 34's families (shapes of their released config.json, shrunk)
    ("arcee", "arcee", dict(SMALL, rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                                     "original_max_position_embeddings": 64})),
    ("apertus", "apertus", dict(SMALL, rope_theta=12_000_000.0, rope_scaling=LLAMA3)),
    ("apertus-defaults", "apertus", dict(SMALL)),
    ("seed_oss", "seed_oss", dict(SMALL, head_dim=16, rope_theta=1e7)),
    ("helium", "helium", dict(SMALL, head_dim=16, rope_theta=100000.0)),
    ("ernie4_5", "ernie4_5", dict(SMALL, head_dim=16, rope_theta=500000.0)),
    ("ernie4_5_moe", "ernie4_5_moe", dict(SMALL, rope_theta=500000.0, moe_num_experts=4, moe_k=2)),
    ("glm", "glm", dict(SMALL, head_dim=16, partial_rotary_factor=0.5, rope_theta=10000.0)),
    ("glm4", "glm4", dict(SMALL, head_dim=32, partial_rotary_factor=0.5, rope_theta=10000.0)),
    ("glm4_moe", "glm4_moe", dict(SMALL, head_dim=32, partial_rotary_factor=0.5, rope_theta=1e6, n_routed_experts=4)),
    ("granite", "granite", dict(SMALL, rope_theta=1e7, attention_multiplier=0.015625)),
    ("granitemoe", "granitemoe", dict(SMALL, rope_theta=10000.0, num_local_experts=4)),
    ("granitemoeshared", "granitemoeshared", dict(SMALL, rope_theta=10000.0, num_local_experts=4)),
    ("hunyuan_v1_dense-alpha", "hunyuan_v1_dense", dict(SMALL, head_dim=16, rope_theta=10000.0, rope_scaling={
        "alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "type": "dynamic"})),
    ("hunyuan_v1_moe", "hunyuan_v1_moe", dict(SMALL, head_dim=16, rope_theta=10000.0, num_experts=4)),
    ("starcoder2", "starcoder2", dict(SMALL, rope_theta=100000.0, sliding_window=32)),
    ("phimoe", "phimoe", dict(SMALL, rope_theta=1e6, sliding_window=None, num_local_experts=4)),
    ("exaone4", "exaone4", dict(SMALL, num_hidden_layers=8, head_dim=16, sliding_window=16, sliding_window_pattern="LLLG",
                                layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2, rope_theta=1e6,
                                rope_scaling=dict(LLAMA3, factor=16.0))),
    ("exaone4-pattern", "exaone4", dict(SMALL, num_hidden_layers=6, head_dim=16, sliding_window=8,
                                        sliding_window_pattern=3)),
    ("dots1", "dots1", dict(SMALL, rope_theta=1e6, sliding_window=None, max_window_layers=4)),
    ("dots1-window", "dots1", dict(SMALL, rope_theta=1e6, sliding_window=16, max_window_layers=2)),
    ("vaultgemma", "vaultgemma", dict(SMALL, head_dim=16, sliding_window=16)),
    ("minimax_m2", "minimax_m2", dict(SMALL, head_dim=32, rotary_dim=16, rope_theta=5e6)),
    ("ministral", "ministral", dict(SMALL, head_dim=16, rope_theta=1e8, sliding_window=32,
                                    layer_types=["sliding_attention", "full_attention"] * 2)),
    ("ministral-default-types", "ministral", dict(SMALL, rope_theta=1e6, sliding_window=16)),
    ("ministral3-beta0", "ministral3", dict(SMALL, head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.0, "max_position_embeddings": 256})),
    ("ministral3-scaled", "ministral3", dict(SMALL, head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1})),
    ("ministral3-default-rope", "ministral3", dict(SMALL, head_dim=16)),  # the class's own: yarn x16, beta 0.1
    ("deepseek_v2", "deepseek_v2", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                        q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                        topk_group=1, rope_scaling={"type": "yarn", "factor": 4.0, "mscale": 0.707,
                                                                    "mscale_all_dim": 0.707, "beta_fast": 32,
                                                                    "beta_slow": 1,
                                                                    "original_max_position_embeddings": 64})),
    ("qwen3_vl-nested", "qwen3_vl", dict(text_config=dict(
        SMALL, model_type="qwen3_vl_text", head_dim=16, rope_theta=5e6,
        rope_scaling={"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True}))),
    ("cosmos3_omni-nested", "cosmos3_omni", dict(text_config=dict(
        SMALL, model_type="qwen3_vl_text", head_dim=16, rope_theta=5e6,
        rope_scaling={"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True}))),
    ("qwen3_vl_moe-nested", "qwen3_vl_moe", dict(text_config=dict(
        SMALL, model_type="qwen3_vl_moe_text", head_dim=16, rope_theta=5e6, num_experts=4,
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}))),
    ("qwen3_5_text", "qwen3_5_text", dict(SMALL, head_dim=32, rope_parameters={
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
        "mrope_interleaved": True}, full_attention_interval=2)),
    ("qwen3_5-nested", "qwen3_5", dict(text_config=dict(
        SMALL, model_type="qwen3_5_text", head_dim=64, num_hidden_layers=8,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True}))),
    ("qwen3_5_moe-nested", "qwen3_5_moe", dict(text_config=dict(
        SMALL, model_type="qwen3_5_moe_text", head_dim=64, num_experts=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True}))),
    ("lfm2", "lfm2", dict(SMALL, num_hidden_layers=6, rope_theta=1e6, full_attn_idxs=[2, 5])),
    ("lfm2-types", "lfm2", dict(SMALL, rope_theta=1e6, layer_types=["conv", "full_attention", "conv", "full_attention"])),
    ("bamba", "bamba", dict(SMALL, num_hidden_layers=6, rope_theta=10000.0, attn_layer_indices=[1, 4],
                            mamba_n_heads=8)),
    ("granitemoehybrid-nope", "granitemoehybrid", dict(SMALL, position_embedding_type="nope", num_local_experts=4,
                                                       layer_types=["mamba", "mamba", "attention", "mamba"])),
    ("granitemoehybrid-rope", "granitemoehybrid", dict(SMALL, position_embedding_type="rope", rope_theta=1e7,
                                                       num_local_experts=4,
                                                       layer_types=["mamba", "attention", "mamba", "attention"])),
    ("falcon_h1", "falcon_h1", dict(SMALL, head_dim=16, rope_theta=1e11, mamba_n_heads=8)),
    ("mistral3-mistral", "mistral3", dict(text_config=dict(SMALL, model_type="mistral", head_dim=16, rope_theta=1e9,
                                                        sliding_window=None))),
    ("mistral3-ministral3", "mistral3", dict(text_config=dict(SMALL, model_type="ministral3", head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64,
        "llama_4_scaling_beta": 0.0}))),
    # Ministral 3 as released (llama_4_scaling_beta 0.1): its queries scaled past original_max_position_embeddings
    ("mistral3-ministral3-scaled", "mistral3", dict(text_config=dict(SMALL, model_type="ministral3", head_dim=16,
                                                                      rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
        "llama_4_scaling_beta": 0.1}))),
    ("mllama_text_model", "mllama_text_model", dict(SMALL, num_hidden_layers=5, cross_attention_layers=[1, 3],
                                                    rope_theta=500000.0, rope_scaling=LLAMA3)),
    ("mllama-nested", "mllama", dict(text_config=dict(SMALL, model_type="mllama_text_model", num_hidden_layers=4,
                                                      cross_attention_layers=[2], rope_theta=500000.0))),
    ("lfm2_moe", "lfm2_moe", dict(SMALL, rope_theta=1e6, num_experts=4,
                                  layer_types=["conv", "conv", "full_attention", "conv"])),
    ("glm4_moe_lite", "glm4_moe_lite", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                            kv_lora_rank=16, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
                                            rope_theta=1e6)),
    ("glm4_moe_lite-half-split", "glm4_moe_lite", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                                       kv_lora_rank=16, q_lora_rank=32, n_routed_experts=4,
                                                       num_experts_per_tok=2, rope_interleave=False)),
    ("gemma3n_text", "gemma3n_text", dict(SMALL, num_hidden_layers=10, head_dim=16, sliding_window=16, rope_theta=1e6,
                                          rope_local_base_freq=1e4, num_kv_shared_layers=0, altup_num_inputs=2,
                                          hidden_size_per_layer_input=16, vocab_size_per_layer_input=128,
                                          activation_sparsity_pattern=[0.0] * 10)),
    ("gemma3n-nested", "gemma3n", dict(text_config=dict(
        SMALL, model_type="gemma3n_text", num_hidden_layers=5, head_dim=16, sliding_window=8, num_kv_shared_layers=0,
        hidden_size_per_layer_input=16, vocab_size_per_layer_input=128, activation_sparsity_pattern=[0.0] * 5,
        rope_scaling={"rope_type": "linear", "factor": 4.0}))),
    # -- issue 34, list A (shapes of their released config.json, shrunk)
    ("deepseek_v32", "deepseek_v32", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                          q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                          index_head_dim=16, index_n_heads=2, index_topk=8,
                                          rope_scaling={"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                                        "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                                        "original_max_position_embeddings": 64})),
    ("glm_moe_dsa", "glm_moe_dsa", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                        q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, index_head_dim=16,
                                        index_n_heads=2, index_topk=8, rope_theta=1e6)),
    ("internlm3", "internlm3", dict(SMALL, head_dim=16, rope_theta=50_000_000.0,
                                    rope_scaling={"type": "dynamic", "factor": 6.0})),
    ("internlm3-default-head", "internlm3", dict(SMALL, rope_theta=1e6)),
    ("exaone", "exaone", dict({k: v for k, v in SMALL.items() if k != "num_hidden_layers"}, num_layers=3,
                              rope_theta=500000.0, rope_scaling=dict(LLAMA3, factor=8.0))),
    ("exaone-defaults", "exaone", dict(SMALL)),
    ("dbrx", "dbrx", {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256, "vocab_size": 128, "rope_theta": 5e5,
                      "attn_config": {"kv_n_heads": 2, "rope_theta": 5e5, "clip_qkv": 8}}),
    ("jetmoe", "jetmoe", dict(SMALL, kv_channels=16, num_experts_per_tok=2, num_local_experts=4, rope_theta=1e4)),
    ("bitnet", "bitnet", dict(SMALL, rope_theta=500000.0)),
    ("diffllama", "diffllama", dict(SMALL, head_dim=16, rope_theta=1e5)),
    ("cwm", "cwm", dict(SMALL, num_hidden_layers=8, head_dim=16, sliding_window=32)),  # the class's llama3 x16
    ("cwm-types", "cwm", dict(SMALL, head_dim=16, sliding_window=32, layer_types=["full_attention", "sliding_attention"] * 2,
                              rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    ("granite_swa", "granite_swa", dict(SMALL, num_hidden_layers=5, sliding_window=16, rope_theta=1e6)),
    ("granite_swa-layer-thetas", "granite_swa", dict(SMALL, sliding_window=16, rope_theta=1e4,
                                                     layer_rope_theta=[5e5, 1e4, 0, 5e5])),
    ("granitemoe_swa", "granitemoe_swa", dict(SMALL, sliding_window=16, num_local_experts=4, layer_rope_theta=[0, 1e4, 1e4, 1e5],
                                              rope_scaling={"rope_type": "linear", "factor": 2.0})),
    ("afmoe", "afmoe", dict(SMALL, num_hidden_layers=8, head_dim=16, sliding_window=16, global_attn_every_n_layers=4,
                            num_experts=4, rope_theta=1e4)),
    ("exaone_moe", "exaone_moe", dict(SMALL, num_hidden_layers=8, head_dim=16, sliding_window=16, sliding_window_pattern=4,
                                      num_experts=4, rope_theta=1e6, rope_scaling=dict(LLAMA3, factor=16.0))),
    ("cohere2_moe", "cohere2_moe", dict(SMALL, num_hidden_layers=9, head_dim=16, sliding_window=16, first_k_dense_replace=1,
                                        sliding_window_pattern=4, num_experts=4, rope_theta=50000.0)),
    ("codegen", "codegen", {"n_embd": 64, "n_head": 4, "n_layer": 2, "rotary_dim": 8, "n_positions": 256, "n_ctx": 256,
                            "vocab_size": 128}),
    ("chameleon", "chameleon", dict(SMALL, rope_theta=10000.0, vocabulary_map={"<image>": 127})),
    ("emu3-nested", "emu3", {"text_config": dict(SMALL, model_type="emu3_text_model", rope_theta=1e6,
                                                 rope_scaling={"rope_type": "linear", "factor": 2.0})}),
    ("emu3-defaults", "emu3", {"text_config": dict(SMALL, model_type="emu3_text_model")}),
    ("glm4v-nested", "glm4v", {"text_config": dict(SMALL, model_type="glm4v_text", head_dim=32, partial_rotary_factor=0.5,
                                                   rope_theta=10000.0, rope_scaling={"rope_type": "default",
                                                                                     "mrope_section": [2, 3, 3]})}),
    ("glm46v-nested", "glm46v", {"text_config": dict(SMALL, model_type="glm4v_text", head_dim=16, rope_parameters={
        "rope_type": "default", "rope_theta": 5e5, "mrope_section": [4, 2, 2]})}),
    ("glm_ocr-nested", "glm_ocr", {"text_config": dict(SMALL, model_type="glm_ocr_text", head_dim=32, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2]})}),
    ("glm4v_moe-nested", "glm4v_moe", {"text_config": dict(SMALL, model_type="glm4v_moe_text", head_dim=32,
                                                           n_routed_experts=4, rope_parameters={
                                                               "rope_type": "default", "rope_theta": 1e6,
                                                               "mrope_section": [2, 3, 3]})}),  # partial 0.5 by default
    ("doge", "doge", dict(SMALL, rope_theta=1e4, sliding_window=32, keep_window_size=16)),
    ("hyperclovax", "hyperclovax", dict(SMALL, head_dim=16, rope_theta=5e7, attention_multiplier=0.0625)),
    ("iquestcoder", "iquestcoder", dict(SMALL, rope_theta=5e5)),  # the class's head_dim 128
    ("jais2", "jais2", dict(SMALL, rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    ("flex_olmo", "flex_olmo", dict(SMALL, num_experts=4)),  # the class's theta 5e5
    ("aria-nested", "aria", {"text_config": dict(SMALL, model_type="aria_text", rope_theta=5e6)}),
    ("granite4_vision-nested", "granite4_vision", {"text_config": dict(SMALL, model_type="granite4_vision_text",
                                                                       rope_theta=1e7)}),
    ("apertus1p5_text", "apertus1p5_text", dict(SMALL)),  # the class's llama3 x8 over 8192, theta 1.2e7
    ("apertus1p5-nested", "apertus1p5", {"text_config": dict(SMALL, model_type="apertus1p5_text", vocab_size=270_000,
                                                             rope_theta=1e6, rope_scaling=LLAMA3)}),
    ("gpt_neox_japanese", "gpt_neox_japanese", dict(SMALL, rotary_emb_base=10000, rotary_pct=1.0)),
    ("gpt_neox_japanese-defaults", "gpt_neox_japanese", dict(SMALL, rotary_emb_base=5e5)),  # rotary_pct 1 by default
    ("axk1", "axk1", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                          n_routed_experts=4, num_experts_per_tok=2, rope_theta=1e6)),
    ("axk1-half-split", "axk1", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                     q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, rope_interleave=False)),
    ("axk2", "axk2", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                          n_routed_experts=4, num_experts_per_tok=2, index_head_dim=16, index_n_heads=2, rope_theta=1e6)),
    ("hy_v3", "hy_v3", dict(SMALL, num_experts=4)),  # the class's theta 11158840 and head_dim 128
    ("flint", "flint", dict(SMALL, num_hidden_layers=6, head_dim=16, sliding_window=16, num_local_experts=4,
                            rope_theta=1e5)),
    ("dory", "dory", dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=16, n_input_layers=1, n_output_layers=1)),
    # Dory's released spelling: (attention, mlp) pairs, every size doubled
    ("dory-pairs", "dory", dict(SMALL, num_hidden_layers=8, head_dim=16, sliding_window=16, n_input_layers=2,
                                n_output_layers=2, layer_types=["sliding_attention", "mlp", "full_attention", "mlp"] * 2,
                                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
                                                 "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                    "rope_theta": 1e6}})),
    ("glmga-nested", "glmga", {"text_config": dict(SMALL, model_type="glm4v_text", head_dim=32, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "mrope_section": [2, 3, 3]})}),
    ("granite_docling-nested", "granite_docling", {"text_config": dict(SMALL, model_type="granite_docling_text",
                                                                       rope_theta=1e5),
                                                   "vision_config": {"out_hidden_size": 64}}),
    ("cosmos3_edge-nested", "cosmos3_edge", {"text_config": dict(SMALL, model_type="cosmos3_edge_text", head_dim=16,
                                                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                                                  "mrope_section": [3, 3, 2]}),
                                             "vision_config": {"out_hidden_size": 64}}),
    ("hy_v4", "hy_v4", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                            n_routed_experts=4, num_experts_per_tok=2, index_head_dim=16, index_n_heads=2, rope_theta=1e6,
                            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
    ("bailing_hybrid", "bailing_hybrid", dict(SMALL, num_hidden_layers=6, layer_group_size=3, qk_rope_head_dim=8,
                                              qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                                              num_experts=4, rope_theta=1e6)),
    ("hyperclovax_vision_v2-nested", "hyperclovax_vision_v2", {"text_config": dict(
        SMALL, model_type="hyperclovax", head_dim=16, rope_theta=5e6)}),
    ("deepseek_ocr2-nested", "deepseek_ocr2", {"text_config": dict(SMALL, model_type="deepseek_ocr2_text", rope_theta=1e5,
                                                                   n_routed_experts=4)}),
    ("gemma4_unified_text", "gemma4_unified_text", dict(SMALL, num_hidden_layers=6, head_dim=16, global_head_dim=32,
                                                        sliding_window=8, hidden_size_per_layer_input=16,
                                                        vocab_size_per_layer_input=128)),
    ("gemma4_unified-nested", "gemma4_unified", {"text_config": dict(SMALL, model_type="gemma4_unified_text",
                                                                     num_hidden_layers=6, head_dim=16, global_head_dim=32,
                                                                     hidden_size_per_layer_input=16,
                                                                     vocab_size_per_layer_input=128)}),
    ("cohere2_moe-prefix", "cohere2_moe", dict(SMALL, num_hidden_layers=6, head_dim=16, sliding_window=16,
                                               first_k_dense_replace=2, prefix_dense_sliding_window_pattern=2,
                                               sliding_window_pattern=2, num_experts=4)),
    # issue 34, list B
    ("qwen2_moe", "qwen2_moe", dict(SMALL, num_hidden_layers=6, rope_theta=1e6, use_sliding_window=True,
                                    sliding_window=16, max_window_layers=4, num_experts=4, moe_intermediate_size=32)),
    ("qwen2_moe-full", "qwen2_moe", dict(SMALL, rope_theta=1e6, num_experts=4, moe_intermediate_size=32)),
    ("olmo", "olmo", dict(SMALL, rope_theta=10000.0, clip_qkv=8.0)),
    ("olmoe", "olmoe", dict(SMALL, rope_theta=10000.0, num_experts=4, num_experts_per_tok=2)),
    ("solar_open", "solar_open", dict(SMALL, head_dim=16, n_routed_experts=4, num_experts_per_tok=2)),
    ("solar_open-default-head", "solar_open", dict(SMALL, n_routed_experts=4)),
    ("nemotron", "nemotron", dict(SMALL, rope_theta=10000.0)),
    ("nemotron-partial", "nemotron", dict(SMALL, partial_rotary_factor=0.25, rope_theta=5e5)),
    ("nemotron_h-pattern", "nemotron_h", dict(SMALL, head_dim=16, hybrid_override_pattern="M-M*-E*",
                                              n_routed_experts=4)),
    ("nemotron_h-types", "nemotron_h", dict(SMALL, head_dim=16, layers_block_type=[
        "mamba", "attention", "mlp", "mamba", "attention"])),
    ("jamba", "jamba", dict(SMALL, num_hidden_layers=8, attn_layer_period=4, attn_layer_offset=2, num_experts=4)),
    ("zamba", "zamba", dict(SMALL, num_hidden_layers=5, layers_block_type=[
        "mamba", "hybrid", "mamba", "mamba", "hybrid"])),
    ("zamba2-mem-rope", "zamba2", dict(SMALL, use_mem_rope=True, rope_theta=5e4, num_hidden_layers=4,
                                       layers_block_type=["mamba", "hybrid", "mamba", "hybrid"])),
    ("zamba2-nope", "zamba2", dict(SMALL, num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"])),
    ("kimi_linear", "kimi_linear", dict(SMALL, num_hidden_layers=8, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                        linear_attn_config={"full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7]})),
    ("kimi_linear-default", "kimi_linear", dict(SMALL, num_hidden_layers=9, qk_rope_head_dim=8, qk_nope_head_dim=16)),
    ("minimax", "minimax", dict(SMALL, num_hidden_layers=6, head_dim=16, rope_theta=1e6, num_local_experts=4,
                                rotary_dim=8)),
    ("sarvam_mla", "sarvam_mla", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                      q_lora_rank=32, rope_theta=1e4)),
    ("youtu", "youtu", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 1e5, "factor": 4.0,
                                             "original_max_position_embeddings": 64})),
    ("youtu-half-split", "youtu", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                       rope_interleave=False)),
    ("mistral4-beta-0", "mistral4", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                         rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                          "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                                          "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                                          "llama_4_scaling_beta": 0.0})),
    ("minicpm3", "minicpm3", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                  q_lora_rank=32, rope_theta=1e4)),
    ("sarvam_moe", "sarvam_moe", dict(SMALL, head_dim=16, num_experts=4, rope_theta=8e6)),
    # no head_dim, hidden_size not a multiple of the heads: transformers floors (GLM-4.5) or reads qk_rope_head_dim
    ("glm4_moe-floored-head", "glm4_moe", dict(SMALL, hidden_size=66, n_routed_experts=4, rope_theta=1e6)),
    ("glm4_moe_lite-no-head", "glm4_moe_lite", dict(SMALL, num_attention_heads=6, qk_rope_head_dim=8,
                                                    qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16,
                                                    q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2)),
    ("laguna", "laguna", dict(SMALL, head_dim=16, sliding_window=16, num_experts=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
    ("mellum", "mellum", dict(SMALL, head_dim=16, sliding_window=16, num_experts=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
    ("mellum-own-thetas", "mellum", dict(SMALL, head_dim=16, sliding_window=16, num_experts=4,
                                         layer_types=["sliding_attention", "full_attention"] * 2,
                                         rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                          "sliding_attention": {"rope_type": "default",
                                                                                "rope_theta": 2e4}})),
    ("phi4_multimodal-partial", "phi4_multimodal", dict(SMALL, partial_rotary_factor=0.75, rope_theta=250000.0,
                                                        sliding_window=64)),
    ("phi4_multimodal-longrope", "phi4_multimodal", dict(SMALL, max_position_embeddings=1024,
                                                         original_max_position_embeddings=128, rope_scaling={
                                                             "type": "su", "original_max_position_embeddings": 128,
                                                             "short_factor": [1.0 + i / 8 for i in range(8)],
                                                             "long_factor": [2.0 + i / 4 for i in range(8)]})),
    ("molmo2-scaled-layers", "molmo2", dict(text_config=dict(SMALL, model_type="molmo2_text", head_dim=16,
                                                             rope_theta=5e5, rope_scaling_layers=[1, 3],
                                                             rope_scaling={"rope_type": "linear", "factor": 4.0}))),
    ("molmo2-every-layer", "molmo2", dict(text_config=dict(SMALL, model_type="molmo2_text", head_dim=16,
                                                           rope_scaling={"rope_type": "linear", "factor": 2.0}))),
    ("mimo_v2_flash", "mimo_v2_flash", dict(SMALL, num_hidden_layers=7, head_dim=24, v_head_dim=16, n_routed_experts=4)),
    ("mimo_v2_flash-window-size", "mimo_v2_flash", dict(SMALL, head_dim=24, v_head_dim=16, n_routed_experts=4,
                                                        sliding_window_size=15)),
    ("kolibri1", "kolibri1", dict(SMALL, num_hidden_layers=6, head_dim=16, sliding_window=17, rope_theta=5e5)),
    ("lfm3", "lfm3", dict(SMALL, num_hidden_layers=7, head_dim=16, sliding_window=16)),
    ("olmo_hybrid", "olmo_hybrid", dict(SMALL, num_hidden_layers=8, rope_theta=5e5)),
    ("lara_mini", "lara_mini", dict(SMALL, num_hidden_layers=5, head_dim=16, sliding_window=16, rope_theta=1e6)),
    ("minimax_m3_vl_text", "minimax_m3_vl_text", dict(SMALL, head_dim=16, rotary_dim=8, num_local_experts=4,
                                                      rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                                       "partial_rotary_factor": 0.5})),
    ("minimax_m3_vl-nested", "minimax_m3_vl", dict(text_config=dict(SMALL, model_type="minimax_m3_vl_text", head_dim=16,
                                                                    rotary_dim=8, num_local_experts=4))),
    ("modernbert-decoder-v4", "modernbert-decoder", dict(SMALL, num_hidden_layers=6, local_attention=32,
                                                         global_rope_theta=1e5, local_rope_theta=2e4)),
    ("modernbert-decoder-window", "modernbert-decoder", dict(SMALL, local_attention=32, sliding_window=12)),
    ("modernbert-decoder-defaults", "modernbert-decoder", dict(SMALL, num_hidden_layers=4,
                                                               rope_scaling={"rope_type": "linear", "factor": 2.0})),
    ("zaya", "zaya", dict(SMALL, head_dim=16, sliding_window=16, num_experts=4,
                          layer_types=["hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid"])),
    ("zaya-own-dicts", "zaya", dict(SMALL, head_dim=16, num_experts=4, rope_parameters={
        "hybrid": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}})),
    ("muse_glimmer-nested", "muse_glimmer", dict(text_config=dict(SMALL, model_type="muse_glimmer_text", head_dim=16,
                                                                  num_hidden_layers=8, sliding_window=16, rope_theta=5e5))),
    ("muse_glimmer-thetas", "muse_glimmer", dict(text_config=dict(SMALL, model_type="muse_glimmer_text", head_dim=16,
                                                                  sliding_window=16, layer_rope_theta=[0, 1e4, 1e4, 0]))),
    ("muse_spark-nested", "muse_spark", dict(audio_config=dict(out_hidden_size=SMALL["hidden_size"]), text_config=dict(SMALL, model_type="muse_spark_text", head_dim=16,
                                                              num_hidden_layers=8, sliding_window=16, rope_theta=5e5))),
    ("muse_spark-thetas", "muse_spark", dict(audio_config=dict(out_hidden_size=SMALL["hidden_size"]), text_config=dict(SMALL, model_type="muse_spark_text", head_dim=16,
                                                              sliding_window=16, layer_rope_theta=[1e4, 0, 1e4, 0]))),
    ("minimax-types", "minimax", dict(SMALL, head_dim=16, rope_theta=1e7, num_local_experts=4, layer_types=[
        "linear_attention", "linear_attention", "linear_attention", "full_attention"])),
    ("gptj", "gptj", dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=256, vocab_size=128)),
    ("stablelm", "stablelm", dict(SMALL, partial_rotary_factor=0.25, rope_theta=10000.0)),
    ("persimmon", "persimmon", dict(SMALL, partial_rotary_factor=0.5, rope_theta=25000.0)),
    ("llama4_text", "llama4_text", dict(SMALL, num_hidden_layers=8, head_dim=16, attention_chunk_size=16,
                                        rope_theta=500000.0, rope_scaling=dict(LLAMA3, factor=16.0, high_freq_factor=1.0),
                                        num_local_experts=2, attn_temperature_tuning=True)),
    ("llama4-nested", "llama4", dict(text_config=dict(SMALL, model_type="llama4_text", head_dim=16,
                                                      no_rope_layers=[1, 1, 0, 1], attn_temperature_tuning=False,
                                                      attention_chunk_size=32))),
]

#: families whose attention passes config.sliding_window on every layer (no layer_types)
ALL_SLIDING = {"mistral", "mixtral", "phi3", "phi4_multimodal", "qwen3_moe", "starcoder2", "phimoe", "ministral3", "mistral3", "doge"}
#: families whose attention applies no positions (no rotary module in their modeling file)
NO_POSITIONS = {"nemotron_h", "jamba", "zamba", "kimi_linear"}
#: families whose rotary tables lie interleaved (repeat_interleave) in transformers
HF_INTERLEAVED_TABLES = {"cohere", "cohere2", "cohere2_moe", "glm4v_text", "glm_ocr_text"}
#: families with learned attention sinks (the plan's layers say so)
SINKS = {"gpt_oss", "granite_swa", "granitemoe_swa", "flint", "hy_v4"}
#: families whose rotary tables differ per layer: theta layer_rope_theta[i], one table per theta (GraniteSWAModel)
LAYER_THETAS = {"granite_swa", "granitemoe_swa"}


def hf_text_config(model_type, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoConfig.for_model(model_type, **config)
    return getattr(hf, "text_config", None) or hf


#: families whose config class has no modeling file of its own: the class transformers maps them to
MODELING_OF = {"sarvam_mla": "deepseek_v3", "sarvam_moe": "glm4_moe"}


def rotary_class(hf):
    family = type(hf).__module__.split(".")[-2]
    family = MODELING_OF.get(family, family)
    try:
        mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ModuleNotFoundError:  # InternLM3, EXAONE 3: configs of their own, built as Llama (the auto mapping)
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf.model_type] == "LlamaForCausalLM"
        mod = importlib.import_module("transformers.models.llama.modeling_llama")
    names = [n for n in dir(mod) if n.endswith("RotaryEmbedding") and "VisionRotary" not in n and "Audio" not in n]
    assert len(names) == 1, names
    return mod, getattr(mod, names[0])


def expected_span(model_type, hf, index):
    """(span, window) as transformers' attention and masks build them."""
    if model_type in ALL_SLIDING:
        return ("sliding", hf.sliding_window) if hf.sliding_window is not None else ("full", None)
    types = getattr(hf, "layer_types", None)
    kind = types[index] if types else "full_attention"
    if kind == "hybrid_sliding":  # ZAYA (ZayaAttention: sliding_window on these layers)
        return "sliding", hf.sliding_window
    if kind == "sliding_attention":
        if model_type == "smollm3" and not hf.use_sliding_window:
            return "full", None
        return ("sliding", hf.sliding_window) if hf.sliding_window is not None else ("full", None)
    if kind == "chunked_attention":
        return "chunked", hf.attention_chunk_size
    return "full", None


def hf_uses_rope(model_type, hf, index):
    if model_type in ("smollm3", "llama4_text"):
        return bool(hf.no_rope_layers[index])
    if model_type == "cohere2":
        return hf.layer_types[index] == "sliding_attention" and hf.sliding_window is not None
    if model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        return hf.layer_types[index] != "linear_attention"
    if model_type == "mllama_text_model":  # the cross-attention layers attend to the image
        return index not in hf.cross_attention_layers
    if model_type in ("lfm2", "lfm2_moe", "bamba"):  # their attention layers only
        return hf.layer_types[index] == "full_attention"
    if model_type == "granitemoehybrid":
        return hf.layer_types[index] == "full_attention" and hf.position_embedding_type == "rope"
    if model_type in NO_POSITIONS:
        return False
    if model_type == "zamba2":  # the shared attention blocks, with use_mem_rope (Zamba2Attention.forward)
        return hf.layers_block_type[index] == "hybrid" and hf.use_mem_rope
    if model_type in ("lfm3", "olmo_hybrid"):  # their attention layers only (not conv / Gated DeltaNet)
        return hf.layer_types[index] in ("full_attention", "sliding_attention")
    if model_type in ("muse_glimmer_text", "muse_spark_text"):  # MuseGlimmerTextModel: no position embeddings where the theta is 0
        return bool(hf.layer_rope_theta[index])
    if model_type == "lara_mini":  # LaraMiniAttention: RoPE on the sliding layers only
        return hf.layer_types[index] == "sliding_attention"
    if model_type == "minimax":  # softmax attention; the lightning layers have no positions
        return hf.layer_types[index] == "full_attention"
    if model_type in ("exaone4", "exaone_moe", "kolibri1"):  # "global NoPE" (Exaone4Attention, Kolibri1Attention)
        return hf.sliding_window is None or hf.layer_types[index] == "sliding_attention"
    if model_type in ("afmoe", "flint"):  # AfmoeAttention, FlintAttention: RoPE on the local layers only
        return hf.layer_types[index] == "sliding_attention"
    if model_type == "cohere2_moe":  # Cohere2MoeAttention: a window, or force_rope on the dense prefix
        sliding = hf.layer_types[index] == "sliding_attention" and hf.sliding_window is not None
        return sliding or (hf.mlp_layer_types[index] == "dense" and hf.prefix_dense_sliding_window_pattern == 1)
    if model_type == "bailing_hybrid":  # its linear-attention layers take no positions
        return hf.layer_types[index] == "full_attention"
    if model_type in LAYER_THETAS:  # theta 0: NoPE
        return bool(hf.layer_rope_theta[index])
    return True


def hf_tables_and_rotate(model_type, hf, mod, rotary, layer_type, q, k, positions):
    """transformers' per-pair (cos, sin) (T, r/2) and its rotated q, k (1, H, T, D) for this layer."""
    x = q
    pos = positions[None]
    kwargs = {"layer_type": layer_type} if "layer_type" in inspect.signature(rotary.forward).parameters else {}
    if model_type in ("gptj", "codegen"):
        sin, cos = rotary(x, pos)
        r = hf.rotary_dim
        bthd = [t.transpose(1, 2) for t in (q, k)]
        out = [torch.cat([mod.apply_rotary_pos_emb(t[..., :r], sin, cos), t[..., r:]], -1).transpose(1, 2) for t in bthd]
        return cos[0], sin[0], out
    if model_type == "deepseek_v2":  # complex pairs over the qk_rope_head_dim part
        freqs = rotary(x, pos)
        return freqs.real[0], freqs.imag[0], list(mod.apply_rotary_emb(q, k, freqs))
    if model_type == "llama4_text":
        freqs = rotary(x, pos)
        qo, ko = mod.apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), freqs)
        return freqs.real[0], freqs.imag[0], [qo.transpose(1, 2), ko.transpose(1, 2)]
    cos, sin = rotary(x, pos, **kwargs)
    if model_type == "gpt_oss":  # tables of r/2, _apply_rotary_emb halves the head
        return cos[0], sin[0], list(mod.apply_rotary_pos_emb(q, k, cos, sin))
    if model_type in ("deepseek_v32", "glm_moe_dsa", "axk2", "bailing_hybrid"):  # MLA: interleaved pairs always (no rope_interleave)
        half = cos.shape[-1] // 2
        return cos[0, :, :half], sin[0, :, :half], list(mod.apply_rotary_pos_emb_interleave(q, k, cos, sin))
    if model_type in ("deepseek_v3", "glm4_moe_lite", "axk1", "sarvam_mla", "youtu", "mistral4"):
        apply = mod.apply_rotary_pos_emb_interleave if hf.rope_interleave else mod.apply_rotary_pos_emb
        half = cos.shape[-1] // 2
        return cos[0, :, :half], sin[0, :, :half], list(apply(q, k, cos, sin))
    r = cos.shape[-1]
    if list(inspect.signature(mod.apply_rotary_pos_emb).parameters)[0] == "x":  # Gemma 4: one tensor at a time
        q_rot, k_rot = (mod.apply_rotary_pos_emb(t[..., :r], cos, sin) for t in (q, k))
    else:
        q_rot, k_rot = mod.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
    out = [torch.cat([q_rot, q[..., r:]], -1), torch.cat([k_rot, k[..., r:]], -1)]
    if model_type in HF_INTERLEAVED_TABLES:
        return cos[0, :, ::2], sin[0, :, ::2], out
    return cos[0, :, : r // 2], sin[0, :, : r // 2], out


def posenc_pairs(encoding, positions):
    cos, sin = encoding.cos_sin(positions, torch.float32)
    if encoding.interleaved:
        return cos[..., ::2], sin[..., ::2]
    half = cos.shape[-1] // 2
    return cos[..., :half], sin[..., :half]


def scores(q, k):
    return q.double() @ k.double().transpose(-1, -2)


def check_layer(model_type, hf, mod, rotary, layer, positions):
    """Max |cos/sin| difference per pair, asserting pairs and scores match within TOL."""
    encoding = layer.encoding
    head = encoding.head_dim
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, positions.numel(), head, generator=gen)
    k = torch.randn(1, 2, positions.numel(), head, generator=gen)
    cos_hf, sin_hf, (q_hf, k_hf) = hf_tables_and_rotate(model_type, hf, mod, rotary, layer.layer_type, q, k, positions)
    cos_pe, sin_pe = posenc_pairs(encoding, positions)
    assert cos_pe.shape == cos_hf.shape, (cos_pe.shape, cos_hf.shape)
    diff = max(float((cos_pe - cos_hf).abs().max()), float((sin_pe - sin_hf).abs().max()))
    assert diff <= TOL, diff
    q_pe, k_pe = encoding.rotate(q, k, positions, positions)
    params = getattr(hf, "rope_parameters", None) or {}
    if hf.model_type == "ministral3" and params.get("llama_4_scaling_beta"):
        # Ministral3Attention.forward: the rotated queries times the scale, in the queries' dtype
        from transformers.models.ministral3 import modeling_ministral3 as ministral3

        q_hf = q_hf * ministral3.get_llama_4_attn_scale(positions[None], params["llama_4_scaling_beta"],
                                             params["original_max_position_embeddings"]).to(q_hf.dtype)
    s_hf, s_pe = scores(q_hf, k_hf), scores(q_pe, k_pe)
    assert float((s_hf - s_pe).abs().max()) <= TOL * float(s_hf.abs().max()), float((s_hf - s_pe).abs().max())
    return diff


MEASURED: dict[str, float] = {}


def check_query_scale(hf, encoding, positions):
    """Ministral 3's query scale (transformers ``get_llama_4_attn_scale``): read where its beta is
    not 0, with the factor transformers computes at these positions; plain RoPE elsewhere."""
    params = getattr(hf, "rope_parameters", None) or {}
    beta = params.get("llama_4_scaling_beta") if hf.model_type == "ministral3" else None
    if not beta:
        assert not isinstance(encoding, QueryScaledRoPE)
        return
    from transformers.models.ministral3 import modeling_ministral3 as ministral3

    original = params["original_max_position_embeddings"]
    assert isinstance(encoding, QueryScaledRoPE)
    assert (encoding.llama_4_scaling_beta, encoding.original_max_position_embeddings) == (beta, original)
    want = ministral3.get_llama_4_attn_scale(positions[None], beta, original).flatten()
    got = llama_4_attn_scale(positions, beta=encoding.llama_4_scaling_beta,
                             original_max_position_embeddings=encoding.original_max_position_embeddings)
    torch.testing.assert_close(got.float(), want, atol=1e-7, rtol=0)
    if positions.max() >= original:  # past original_max_position_embeddings the factor is not 1: the check can fail
        assert want.max() > 1


@pytest.mark.parametrize("case, model_type, config", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_transformers(case, model_type, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = position_plan({"model_type": model_type, **config})
    hf = hf_text_config(model_type, config)
    assert len(plan) == hf.num_hidden_layers == plan.layers.__len__()
    types = getattr(hf, "layer_types", None)
    mod, rotary_cls = rotary_class(hf) if hf.model_type not in NO_POSITIONS else (None, None)
    rotary = rotary_cls(hf) if rotary_cls is not None else None
    positions = torch.arange(40) + 3
    worst = 0.0
    for index, layer in enumerate(plan):
        if types and model_type not in ALL_SLIDING:
            assert layer.layer_type == types[index]
        assert (layer.span, layer.window) == expected_span(hf.model_type, hf, index), index
        assert layer.sinks == (hf.model_type in SINKS)
        assert layer.softcap == (hf.attn_logit_softcapping if hf.model_type in ("gemma2", "vaultgemma") else None)
        if not hf_uses_rope(hf.model_type, hf, index):
            if hf.model_type == "llama4_text" and hf.attn_temperature_tuning:
                assert isinstance(layer.encoding, AttentionTemperature)
                assert (layer.encoding.floor_scale, layer.encoding.attn_scale) == (hf.floor_scale, hf.attn_scale)
            else:
                assert layer.encoding is None
            continue
        assert isinstance(layer.encoding, (RoPE, MRoPE))
        check_query_scale(hf, layer.encoding, positions)
        if hf.model_type in LAYER_THETAS:  # the layer's own table, as GraniteSWAModel builds it
            rotary = rotary_cls(copy.deepcopy(hf))
            rotary.config.rope_parameters = {**hf.rope_parameters, "rope_theta": hf.layer_rope_theta[index]}
            rotary = rotary_cls(rotary.config)
        if hf.model_type == "molmo2_text":  # Molmo2TextModel: rotary_emb_unscaled outside rope_scaling_layers
            rotary = rotary_cls(hf, scaled=index in hf.rope_scaling_layers)
        worst = max(worst, check_layer(hf.model_type, hf, mod, rotary, layer, positions))
    MEASURED[case] = worst


@pytest.mark.parametrize("softcap", [30.0, None, "absent"])
def test_gemma2_logit_softcap_is_read_as_transformers_reads_it(softcap):
    config = dict(SMALL, head_dim=16, sliding_window=16)
    if softcap != "absent":
        config["attn_logit_softcapping"] = softcap
    plan = position_plan({"model_type": "gemma2", **config})
    expected = hf_text_config("gemma2", config).attn_logit_softcapping  # the class's default 50 when absent
    assert [layer.softcap for layer in plan] == [expected] * len(plan)
    assert plan[0].describe().endswith(f"softcap {expected:g}") if expected else "softcap" not in plan.describe()


def test_a_wrong_base_layout_or_width_fails():
    """The comparison catches each kind of misreading (Cohere read half-split, the issue's bug)."""
    for model_type, config, wrong in [
        ("cohere", dict(SMALL, rope_theta=8e6), dict(interleaved=False)),
        ("gpt_neox", dict(SMALL, rotary_pct=0.5, rotary_emb_base=20000), dict(base=10000.0)),
        ("gpt_neox", dict(SMALL, rotary_pct=0.5, rotary_emb_base=20000), dict(rotary_dim=16)),
    ]:
        plan = position_plan({"model_type": model_type, **config})
        hf = hf_text_config(model_type, config)
        mod, cls = rotary_class(hf)
        good = plan[0].encoding
        args = dict(head_dim=good.head_dim, rotary_dim=good.rotary_dim, base=good.base, interleaved=good.interleaved)
        bad = type(plan[0])(RoPE(**{**args, **wrong}))
        with pytest.raises(AssertionError):
            check_layer(model_type, hf, mod, cls(hf), bad, torch.arange(40) + 3)


def test_qwen2_vl_mrope_sections_against_transformers():
    """Distinct (t, h, w) positions: posenc's MRoPE picks the axis per pair as Qwen2-VL does."""
    config = dict(SMALL, rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    encoding = position_plan({"model_type": "qwen2_vl", **config})[0].encoding
    assert encoding.mrope_section == [2, 3, 3]
    hf = hf_text_config("qwen2_vl", config)
    mod, cls = rotary_class(hf)
    positions = torch.stack([torch.arange(12), torch.arange(12) // 3, torch.arange(12) % 5])[:, None]  # (3, 1, T)
    cos, sin = cls(hf)(torch.zeros(1), positions)
    cos_pe, sin_pe = encoding.cos_sin(positions, torch.float32)
    assert float((cos_pe[0] - cos[0]).abs().max()) <= TOL and float((sin_pe[0] - sin[0]).abs().max()) <= TOL
    written = __import__("posenc.hf_config", fromlist=["to_hf_dict"]).to_hf_dict(encoding)
    assert written["rope_scaling"]["mrope_section"] == [2, 3, 3]


@pytest.mark.parametrize("wrapper, text, head_dim, share", [("qwen3_vl", "qwen3_vl_text", 16, 1.0),
                                                            ("qwen3_5", "qwen3_5_text", 64, 0.25),
                                                            ("cosmos3_edge", "cosmos3_edge_text", 16, 1.0)])
@pytest.mark.parametrize("section", [[3, 3, 2], [4, 2, 2]])
def test_qwen3_vl_interleaved_mrope_against_transformers(wrapper, text, head_dim, share, section):
    """Distinct (t, h, w) positions: posenc's interleaved M-RoPE takes each pair's axis as
    Qwen3-VL's and Qwen3.5's recomposition_frequencies do (T H W T H W ..., the rest T; Qwen3.5
    over its partial_rotary_factor share); Qwen2-VL's chunked sections on the same pairs do not."""
    config = dict(text_config=dict(SMALL, model_type=text, head_dim=head_dim, num_hidden_layers=4,
                                   layer_types=["full_attention"] * 4,
                                   rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": section,
                                                    "mrope_interleaved": True, "partial_rotary_factor": share}))
    encoding = position_plan({"model_type": wrapper, **config})[0].encoding
    assert encoding.mrope_section == section and encoding.mrope_interleaved
    hf = hf_text_config(wrapper, config)
    _, cls = rotary_class(hf)
    positions = torch.stack([torch.arange(12), torch.arange(12) // 3 + 20, torch.arange(12) % 5 + 40])[:, None]
    cos, sin = cls(hf)(torch.zeros(1), positions)
    cos_pe, sin_pe = encoding.cos_sin(positions, torch.float32)
    r = cos.shape[-1]  # the rotated width (the rest passes through)
    assert float((cos_pe[0, :, :r] - cos[0]).abs().max()) <= TOL and float((sin_pe[0, :, :r] - sin[0]).abs().max()) <= TOL
    chunked = MRoPE(head_dim, mrope_section=section, base=100.0, rotary_dim=r).cos_sin(positions, torch.float32)[0]
    assert float((chunked[0, :, :r] - cos[0]).abs().max()) > 1e-2  # the check can fail


@pytest.mark.parametrize("wrapper, text", [("glm4v", "glm4v_text"), ("glm_ocr", "glm_ocr_text"),
                                           ("glm4v_moe", "glm4v_moe_text")])
def test_glm4v_mrope_against_transformers(wrapper, text):
    """Distinct (t, h, w) positions: GLM-4V's M-RoPE (chunked sections over half the head, pairs
    interleaved on GLM-4.1V / GLM-OCR, half-split on GLM-4.5V) as its text rotary embedding
    builds the tables; the other pair layout does not give them."""
    config = {"text_config": dict(SMALL, model_type=text, head_dim=32, num_hidden_layers=2, rope_parameters={
        "rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 3, 3]})}
    encoding = position_plan({"model_type": wrapper, **config})[0].encoding
    assert encoding.mrope_section == [2, 3, 3] and encoding.rotary_dim == 16
    hf = hf_text_config(wrapper, config)
    _, cls = rotary_class(hf)
    positions = torch.stack([torch.arange(12), torch.arange(12) // 3 + 20, torch.arange(12) % 5 + 40])[:, None]
    cos, sin = cls(hf)(torch.zeros(1), positions)
    cos_pe, sin_pe = encoding.cos_sin(positions, torch.float32)
    assert cos.shape[-1] == 16
    assert float((cos_pe[0, :, :16] - cos[0]).abs().max()) <= TOL and float((sin_pe[0, :, :16] - sin[0]).abs().max()) <= TOL
    other = MRoPE(32, mrope_section=[2, 3, 3], base=100.0, rotary_dim=16, interleaved=not encoding.interleaved)
    assert float((other.cos_sin(positions, torch.float32)[0][0, :, :16] - cos[0]).abs().max()) > 1e-2  # the check can fail
#: Families posenc refuses whatever the config (issue 34, list B), each with a config shaped like theirs:
#: NanoChat's clockwise rotation, Mistral Large 4's and Qwen4-Exp's indexers (and their wrappers).
ALWAYS_REFUSED = {"nanochat": dict(SMALL), "mistral_large4_text": dict(SMALL),
                  "mistral_large4": dict(text_config=dict(SMALL, model_type="mistral_large4_text")),
                  "qwen4_exp_text": dict(SMALL, layer_types=["linear_attention", "full_attention"] * 2),
                  "qwen4_exp": dict(text_config=dict(SMALL, model_type="qwen4_exp_text")),
                  "unlimited_ocr": dict(text_config=dict(SMALL, model_type="unlimited_ocr_text"))}


def test_every_family_in_the_table_is_tested():
    tested = {mt for _, mt, _ in CASES} | {FAMILIES[mt].text_config for _, mt, _ in CASES}
    # the families with a reader of their own are tested in tests/test_position_plan_other.py
    tested |= {mt for mt, family in FAMILIES.items() if family.reader is not None}
    # the families their record refuses: their reasons, in test_a_refused_family_names_its_positional_feature
    tested |= REFUSED.keys()
    for model_type, config in ALWAYS_REFUSED.items():  # tested by their refusal, named
        with pytest.raises(InvalidArgument, match=model_type.removesuffix("_text")):
            position_plan({"model_type": model_type, **config})
        tested.add(model_type)
    assert set(FAMILIES) - tested <= {"gemma4"}, set(FAMILIES) - tested


def test_transformers_config_object_reads_the_same():
    for model_type, config in [("gemma3_text", CASES[20][2]), ("smollm3", CASES[31][2]), ("gptj", CASES[-5][2])]:
        hf = hf_text_config(model_type, config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a, b = position_plan({"model_type": model_type, **config}), position_plan(hf)
        assert a.describe() == b.describe()


def test_two_spellings_that_disagree_follow_transformers_with_a_warning():
    config = dict(SMALL, model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0},
                  rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64})
    with pytest.warns(UserWarning, match="rope_scaling.*rope_parameters"):
        plan = position_plan(config)
    assert plan[0].encoding.scaling["rope_type"] == "linear" and plan[0].encoding.scaling["factor"] == 2.0
    assert any("rope_parameters" in note for note in plan.notes)
    hf = hf_text_config("llama", {k: v for k, v in config.items() if k != "model_type"})
    assert hf.rope_parameters["rope_type"] == "linear"
    from posenc.rope import from_hf_config
    with pytest.warns(UserWarning, match="rope_scaling"):
        assert from_hf_config(config).scaling["rope_type"] == "linear"


def test_gpt_neox_rope_theta_top_level_is_not_what_transformers_reads():
    config = dict(SMALL, rope_theta=1e6, rotary_pct=0.5)
    with pytest.warns(UserWarning, match="rope_theta"):
        plan = position_plan({"model_type": "gpt_neox", **config})
    hf = hf_text_config("gpt_neox", config)
    assert plan[0].encoding.base == hf.rope_parameters["rope_theta"] == 10000.0


def test_from_hf_config_layer_type_without_per_layer_parameters_raises():
    from posenc.rope import from_hf_config
    with pytest.raises(InvalidArgument, match="layer_type"):
        from_hf_config(dict(SMALL, model_type="llama"), layer_type="full_attention")
    with pytest.raises(InvalidArgument, match="layer_type"):
        from_hf_config(dict(SMALL, model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
                       layer_type="sliding_attention")


def test_mrope_type_accepted_and_written_back():
    from posenc.rope import from_hf_config
    config = dict(SMALL, rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    rope = from_hf_config(config)
    assert rope.scaling is None and rope.base == 1e6
    assert rope.to_hf_dict()["rope_scaling"] == {"type": "mrope", "mrope_section": [2, 3, 3]}


@pytest.mark.parametrize("config, key", [
    (dict(SMALL, model_type="nonesuch"), "model_type"),
    ({k: v for k, v in SMALL.items() if k != "num_hidden_layers"} | {"model_type": "llama"}, "num_hidden_layers"),
    (dict(model_type="llama", num_hidden_layers=2, hidden_size=64), "num_attention_heads"),
    (dict(model_type="gptj", n_embd=64, n_head=4, n_layer=2, rotary_dim=None), "rotary_dim"),
    (dict(model_type="gemma3", vision_config={}), "text_config"),
    (dict(SMALL), "model_type"),
    (dict(SMALL, model_type="mistral", sliding_window=0), "sliding_window"),
    # Phi-3.5-MoE's longrope: cos / sin times short_mscale or long_mscale, which no posenc encoding computes
    (dict(SMALL, model_type="phimoe", rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                                    "long_factor": [2.0] * 8, "short_mscale": 1.2, "long_mscale": 1.2,
                                                    "original_max_position_embeddings": 64}), "short_mscale"),
    # EXAONE 4's released "LLLG" pattern spelling, without layer_types (transformers' % fails on it)
    (dict(SMALL, model_type="exaone4", sliding_window=16, sliding_window_pattern="LLLG"), "sliding_window_pattern"),
    # an interleaved section whose width axis runs past the last pair (transformers' slice drops it)
    (dict(model_type="qwen3_vl", text_config=dict(SMALL, head_dim=16, rope_scaling={
        "rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True})), "mrope_section"),
    # Ministral 3's query scale: a negative beta (the factor would shrink), a beta without the
    # length it steps by (transformers divides by None)
    (dict(SMALL, model_type="ministral3", head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64,
        "llama_4_scaling_beta": -0.1}), r"llama_4_scaling_beta'\] = -0.1: must be >= 0"),
    (dict(SMALL, model_type="ministral3", head_dim=16, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1}), "needs 'original_max_position_embeddings'"),
    (dict(model_type="mistral3", text_config=dict(SMALL, model_type="llama")), "text_config"),
    (dict(SMALL, model_type="hunyuan_v1_dense", head_dim=16, partial_rotary_factor=0.5,
          rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0}), "partial_rotary_factor"),
    # LFM2-MoE has no default schedule (LFM2's full_attn_idxs fallback is not its class's)
    (dict(SMALL, model_type="lfm2_moe", num_experts=4), "layer_types"),
    # DeepSeek-V4's compressed attention branches, DiffusionGemma's bidirectional canvas: refused by name
    (dict(model_type="diffusion_gemma", text_config=dict(SMALL)), "bidirectionally"),
    (dict(model_type="hunyuan_vl", text_config=dict(SMALL, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                            "mrope_section": [4, 4, 4, 4]})), "XD-RoPE"),
    (dict(model_type="ernie4_5_vl_moe", text_config=dict(SMALL)), "3D RoPE"),
    (dict(SMALL, model_type="deepseek_v4"), "compressed"),
    (dict(SMALL, model_type="dory", layer_types=["sliding_attention", "mlp", "mlp", "full_attention"]), "layer_types"),
    # issue 34, list B: NanoChat's clockwise rotation (rotate_half returns (x2, -x1))
    (dict(SMALL, model_type="nanochat"), "rotate_half"),
    # GLM-4.5 without head_dim: 64 // 6 = 10 floored, x 0.5 = 5 rotated dimensions (odd)
    (dict(SMALL, model_type="glm4_moe", num_attention_heads=6), "odd"),
    # sparse attention: a learned indexer picks the keys (Qwen4-Exp, MiniMax-M3)
    (dict(SMALL, model_type="qwen4_exp_text", head_dim=16, layer_types=[
        "linear_attention", "linear_attention", "linear_attention", "indexed_attention"]), "indexer"),
    (dict(SMALL, model_type="minimax_m3_vl_text", head_dim=16, layer_types=[
        "full_attention", "minimax_m3_sparse", "full_attention", "full_attention"]), "Lightning Indexer"),
    (dict(model_type="mistral_large4", text_config=dict(SMALL, model_type="mistral_large4_text")), "index_topk"),
    # Mistral 4's query temperature (its class's default rope dict: llama_4_scaling_beta 0.1)
    (dict(SMALL, model_type="mistral4", qk_rope_head_dim=8, qk_nope_head_dim=16), "llama_4_scaling_beta"),
    # a rope dict without the key: transformers' Mistral 4 fails at its first forward (None * tensor)
    (dict(SMALL, model_type="mistral4", qk_rope_head_dim=8, qk_nope_head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}),
     "needs 'llama_4_scaling_beta'"),
])
def test_refusals_name_the_key(config, key):
    with pytest.raises((MissingKey, InvalidArgument), match=key):
        position_plan(config)


def test_describe_groups_layers():
    plan = position_plan(dict(SMALL, model_type="cohere2", num_hidden_layers=8, sliding_window=16))
    assert plan.describe().splitlines() == [
        "0-2, 4-6: rope theta 10000, rotary 16/16, interleaved; sliding 16", "3, 7: NoPE; full"]


@pytest.mark.parametrize("model_type, config, layer_type", [
    ("cohere", dict(SMALL, rope_theta=8e6), None),
    ("gptj", dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, n_positions=256), None),
    ("gpt_neox", dict(SMALL, rotary_pct=0.5, rotary_emb_base=20000), None),
    ("deepseek_v3", dict(SMALL, qk_rope_head_dim=8, qk_nope_head_dim=16), None),
    ("gemma3_text", dict(SMALL, num_hidden_layers=6, head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4, sliding_window=16,
                         rope_scaling={"rope_type": "linear", "factor": 8.0}), "sliding_attention"),
    ("gemma3_text", dict(SMALL, num_hidden_layers=6, head_dim=16, rope_theta=1e6, rope_local_base_freq=1e4, sliding_window=16,
                         rope_scaling={"rope_type": "linear", "factor": 8.0}), "full_attention"),
    ("llama4_text", dict(SMALL, head_dim=16, attention_chunk_size=16), None),
    # a class default of the RoPE's own keys that the config lacks (Seed-OSS's head_dim 128, PhiMoE's
    # theta 1e6, GLM-4.5's and Phi's partial_rotary_factor 0.5): applied, as transformers does
    ("seed_oss", dict(SMALL), None),
    ("phimoe", dict(SMALL), None),
    ("glm4_moe", dict(SMALL), None),
    ("phi", dict(SMALL), None),
])
def test_from_hf_config_reads_these_families_as_transformers(model_type, config, layer_type):
    """The issue's silent misreadings through from_hf_config: Cohere's interleaved pairs, GPT-J's
    keys (no KeyError), GPT-NeoX's rotary_pct / rotary_emb_base, DeepSeek-V3's qk_rope_head_dim,
    Gemma 3's rope_local_base_freq: checked against the family's own rotary module."""
    from posenc.rope import from_hf_config
    no_layers = {k: v for k, v in config.items() if k not in ("num_hidden_layers", "n_layer")}
    rope = from_hf_config({"model_type": model_type, **no_layers}, layer_type=layer_type)
    hf = hf_text_config(model_type, config)
    mod, cls = rotary_class(hf)
    layer = type(position_plan({"model_type": model_type, **config})[0])(rope, layer_type=layer_type)
    check_layer(hf.model_type, hf, mod, cls(hf), layer, torch.arange(40) + 3)


def test_from_hf_config_gemma3_needs_layer_type():
    from posenc.rope import from_hf_config
    with pytest.raises(InvalidArgument, match="layer_type"):
        from_hf_config(dict(SMALL, model_type="gemma3_text", num_hidden_layers=6, head_dim=16, sliding_window=16))


GEMMA4 = dict(SMALL, model_type="gemma4_text", num_hidden_layers=12, head_dim=16, sliding_window=8,
              hidden_size_per_layer_input=16, vocab_size_per_layer_input=128)


def gemma4_to_dict(**config):
    """The dict transformers writes for a Gemma 4 config (``per_layer_config`` keys zero-padded: "05")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model("gemma4_text", **config).to_dict()


@pytest.mark.parametrize("spelling", ["to_dict", "global_head_dim", "per_layer_config", "null"])
def test_gemma4_reads_each_layers_head_width_as_transformers_does(spelling):
    """Each layer's head width against transformers' own per-layer config (the one its
    attention and its per-layer-type rotary table are built from), and each RoPE layer against
    that rotary module: to_dict()'s ``per_layer_config {"05": {"head_dim": 32}, "11": ...}``,
    a released file's ``global_head_dim``, unpadded keys, and ``per_layer_config: null`` (no
    override: transformers' global layers keep head_dim)."""
    config = {"to_dict": gemma4_to_dict(**{k: v for k, v in GEMMA4.items() if k != "model_type"}, global_head_dim=32),
              "global_head_dim": dict(GEMMA4, global_head_dim=32),
              "per_layer_config": dict(GEMMA4, per_layer_config={"5": {"head_dim": 48}, "11": {"head_dim": 48}}),
              "null": dict(GEMMA4, per_layer_config=None)}[spelling]
    if spelling == "to_dict":
        assert set(config["per_layer_config"]) == {"05", "11"}  # the spelling this test is about
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = position_plan(config)
        hf = AutoConfig.for_model(**config)
    mod, rotary_cls = rotary_class(hf)
    rotary = rotary_cls(hf)
    widths = [hf.per_layer_config[i].head_dim for i in range(hf.num_hidden_layers)]
    assert [layer.encoding.head_dim for layer in plan] == widths
    assert len(set(widths)) == (1 if spelling == "null" else 2)
    for layer in plan:
        check_layer("gemma4_text", hf, mod, rotary, layer, torch.arange(40) + 3)


@pytest.mark.parametrize("override, named", [({"rope_parameters": {"rope_type": "default"}}, "rope_parameters"),
                                             ({"sliding_window": 4}, "sliding_window")])
def test_gemma4_refuses_a_positional_per_layer_override_by_name(override, named):
    config = dict(GEMMA4, per_layer_config={"5": {"head_dim": 32, **override}})
    with pytest.raises(InvalidArgument, match=named):
        position_plan(config)


def test_gemma4_refuses_a_per_layer_override_past_the_last_layer():
    config = dict(GEMMA4, per_layer_config={"12": {"head_dim": 32}})
    with pytest.raises(ValueError):  # transformers' own verdict on the same dict
        AutoConfig.for_model(**config)
    with pytest.raises(InvalidArgument, match="per_layer_config.*num_hidden_layers"):
        position_plan(config)


def test_gemma4_refuses_layers_of_one_type_with_two_head_widths():
    """transformers builds one rotary table per layer type (from its first layer's config)."""
    config = dict(GEMMA4, per_layer_config={"05": {"head_dim": 32}, "11": {"head_dim": 48}})
    with pytest.raises(InvalidArgument, match="per_layer_config"):
        position_plan(config)


# -- issue 34, non-rotary families: refused by name ---------------------------------------------

#: model_type -> the positional feature its refusal must name, as the family's modeling file
#: builds it (transformers 5.24: the module or function computing the positions, and the feature).
REFUSED = {
    # issue 34, the rest
    "longcat_flash": r"two attention modules per decoder layer \(LongcatFlashDecoderLayer",
    "beam": r"NoPE with a scalable-softmax query scale.*compute_attention_scaling", "hrm_text": "hierarchical recurrence",
    "unlimited_ocr_text": r"reference sliding-window attention \(create_reference_sliding_window_causal_mask",
    "pp_formulanet": r"offset of 2 rows \(PPFormulaNetLearnedPositionalEmbedding", "pi0": "vision-language-action",
    "blt": r"byte latent transformer.*BltCrossAttention",
    "deepseek_v4": "compressed key/value branches", "diffusion_gemma": "bidirectionally",
    "hunyuan_vl": "XD-RoPE", "ernie4_5_vl_moe": "3D RoPE",
    "mamba": "recurrent state: no attention positions", "mamba2": "recurrent state: no attention positions",
    "falcon_mamba": "recurrent state: no attention positions", "rwkv": "recurrent state: no attention positions",
    "xlstm": "recurrent state: no attention positions",
    "recurrent_gemma": r"RG-LRU.*RecurrentGemmaAttention\.rotary_emb",
    "longt5": "local_radius", "pix2struct": "Pix2StructVisionEmbeddings",
    "udop": "RelativePositionBiasAggregated", "t5gemma": "RoPE in both stacks", "t5gemma2": "T5Gemma2MergedAttention",
    "roberta": r"create_position_ids_from_input_ids.*RobertaEmbeddings",
    "roberta-prelayernorm": r"create_position_ids_from_input_ids.*RobertaPreLayerNormEmbeddings",
    "xlm-roberta": r"create_position_ids_from_input_ids.*XLMRobertaEmbeddings",
    "xlm-roberta-xl": r"create_position_ids_from_input_ids.*XLMRobertaXLEmbeddings",
    "camembert": r"create_position_ids_from_input_ids.*CamembertEmbeddings",
    "xmod": r"create_position_ids_from_input_ids.*XmodEmbeddings",
    "electra": r"ElectraEmbeddings\.position_embeddings", "ernie": r"ErnieEmbeddings\.position_embeddings",
    "rembert": r"RemBertEmbeddings\.position_embeddings", "roc_bert": r"RoCBertEmbeddings\.position_embeddings",
    "megatron-bert": r"MegatronBertEmbeddings\.position_embeddings",
    "big_bird": r"block-sparse.*BigBirdEmbeddings", "roformer": "RoFormerSinusoidalPositionalEmbedding",
    "git": r"image tokens prefixed.*GitEmbeddings", "blip": "BlipTextEmbeddings",
    "csm_depth_decoder_model": r"position-indexed weights.*CsmCodebooksHead",
    "gpt_neo": r"transformer\.wpe.*GPTNeoSelfAttention\._attn.*window_size",
    "xglm": r"XGLMSinusoidalPositionalEmbedding.*offset of 2",
    "trocr": r"TrOCRLearnedPositionalEmbedding.*TrOCRSinusoidalPositionalEmbedding",
    "clvp_decoder": "position_embeds_layer", "cpmant": "CpmAntSegmentPositionEmbedding",
    "prophetnet": r"ProphetNetNgramSelfAttention.*ProphetNetPositionalEmbeddings",
    "mvp": r"MvpLearnedPositionalEmbedding.*MvpPrompt",
    "kosmos-2": r"Kosmos2TextSinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "kosmos_2_text_model": r"Kosmos2TextSinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "kosmos-2.5": r"Kosmos2_5TextSinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "kosmos_2_5_text_model": r"Kosmos2_5TextSinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "idefics": r"IdeficsAttention\.rotary_emb.*cross_layer_interval",
    "musicgen": r"cos in the first half.*MusicgenSinusoidalPositionalEmbedding",
    "musicgen_melody": r"cos in the first half.*MusicgenMelodySinusoidalPositionalEmbedding",
    "moshi": r"MoshiAttention\.rotary_emb.*MoshiFlexibleLinear",
    "bart": r"offset of 2 rows \(BartLearnedPositionalEmbedding", "mbart": r"offset of 2 rows \(MBartLearnedPositionalEmbedding",
    "plbart": r"offset of 2 rows \(PLBartLearnedPositionalEmbedding", "marian": "MarianSinusoidalPositionalEmbedding",
    "pegasus": "PegasusSinusoidalPositionalEmbedding", "pegasus_x": r"block-local.*PegasusXSinusoidalPositionalEmbedding",
    "blenderbot": r"without offset.*BlenderbotLearnedPositionalEmbedding",
    "blenderbot-small": r"without offset.*BlenderbotSmallLearnedPositionalEmbedding",
    "fsmt": r"SinusoidalPositionalEmbedding.*make_positions",
    "m2m_100": r"M2M100SinusoidalPositionalEmbedding.*offset of 2.*create_position_ids_from_input_ids",
    "nllb-moe": r"NllbMoeSinusoidalPositionalEmbedding.*offset of 2.*create_position_ids_from_input_ids",
    "seamless_m4t": r"SeamlessM4TSinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "seamless_m4t_v2": r"SeamlessM4Tv2SinusoidalPositionalEmbedding.*create_position_ids_from_input_ids",
    "led": r"Longformer.*LEDLearnedPositionalEmbedding", "bigbird_pegasus": r"block-sparse.*BigBirdPegasusLearnedPositionalEmbedding",
    "whisper": r"sinusoidal table over the audio frames.*WhisperPositionalEmbedding",
    "encoder-decoder": r"composite of two independent models.*config\['decoder'\]",
    "vision-encoder-decoder": r"composite of two independent models.*config\['decoder'\]",
}

#: A name the refusals cite from the modeling file: a class or function of transformers.
_CITED = re.compile(r"\b([A-Z][A-Za-z0-9_]*(?:Embeddings?|Attention|Prompt|Linear|Aggregated)|"
                    r"create_position_ids_from_input_ids|make_positions)\b")


def _modeling_source(model_type: str) -> str:
    folder = FAMILIES[model_type].source.split("/")[2]
    return inspect.getsource(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"))


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_refused_family_names_its_positional_feature(model_type):
    """Its default config (transformers' own class, as the family sweep reads it) is refused with
    InvalidArgument naming the feature; every transformers name the reason cites is defined in the
    family's modeling file (so the reason points at code that exists)."""
    config = AutoConfig.for_model(model_type).to_dict()
    with pytest.raises(InvalidArgument, match=REFUSED[model_type]) as caught:
        position_plan(config)
    message = str(caught.value)
    assert f"({model_type})" in message
    source = _modeling_source(model_type)
    cited = set(_CITED.findall(message))
    missing = [name for name in cited if not re.search(rf"^(class|def) {name}\b|^\s+def {name}\b", source, re.MULTILINE)]
    assert not missing, f"{model_type}'s refusal cites names its modeling file does not define: {missing}"


def test_a_refused_record_refuses_before_reading_anything():
    """Refusal comes from the record alone: a config with no other key is refused by the same reason."""
    assert {name for name, family in FAMILIES.items() if family.refused} >= REFUSED.keys()
    with pytest.raises(InvalidArgument, match="recurrent state"):
        position_plan({"model_type": "mamba"})


def test_a_refused_family_is_not_listed_as_read():
    from posenc.hf_config import reads_model_type
    from posenc.hf_config.families import Family

    assert not reads_model_type("roberta") and reads_model_type("gpt2") and not reads_model_type("nonesuch")
    with pytest.raises(InvalidArgument) as caught:
        position_plan(dict(SMALL, model_type="nonesuch"))
    assert "'gpt2'" in str(caught.value) and "'roberta'" not in str(caught.value)
    with pytest.raises(InvalidArgument, match="refused"):
        Family("x", refused="  ")


@pytest.mark.parametrize("rope_parameters, rotary, note", [
    ({"rope_type": "default", "rope_theta": 5e6}, 16, "partial_rotary_factor 0.5"),
    # the rope dict's factor is read first (MiniMaxM2Config.convert_rope_params_to_dict): no note of rotary_dim's
    ({"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.25}, 8, None),
])
def test_minimax_m2_rotary_dim_yields_to_the_rope_dicts_factor(rope_parameters, rotary, note):
    config = dict(SMALL, model_type="minimax_m2", head_dim=32, rotary_dim=16, rope_parameters=rope_parameters)
    plan = position_plan(config)
    assert plan[0].encoding.rotary_dim == rotary
    hf = hf_text_config("minimax_m2", {k: v for k, v in config.items() if k != "model_type"})
    assert int(hf.head_dim * hf.rope_parameters["partial_rotary_factor"]) == rotary
    notes = [n for n in plan.notes if "rotary_dim" in n]
    assert (notes == []) if note is None else any(note in n for n in notes)
