"""GGUF files (llama.cpp's format): their position plans, read as llama.cpp reads them.

- :func:`position_plan_from_gguf`: the :class:`~posenc.plan.PositionPlan` of a GGUF file, for
  the checkpoint's weights (the plan :func:`posenc.hf_config.position_plan` reads from the
  source config.json when the conversion kept its positions); :func:`read_gguf_positions`: the
  same with what it was read from (llama.cpp's rope type and pair layout, the keys by layer);
  :func:`gguf_rope_metadata`: the position keys and tensors of the file by their GGUF names.
- :func:`plan_differences`: two plans compared by what they compute, each difference named
  (with the GGUF key it was read from).
- :mod:`~posenc.hf_config.gguf.arches`: one record per architecture read (llama, qwen2, qwen3,
  qwen3moe, phi3, gemma3, gpt-oss, qwen2vl, deepseek2), from llama.cpp's C++.
- :func:`ggml_rope_angles`: one layer's angles and cos / sin multiplier as llama.cpp's ggml
  computes them (a float32 port of its CPU rope, YaRN and linear scaling included), the
  independent reference posenc's RoPE of a file is tested against.
- :mod:`~posenc.hf_config.gguf.file`: the bounded reader of a file's metadata (no ``gguf``
  package needed; every count checked against the file's size before anything is read).

>>> from posenc.hf_config.gguf import position_plan_from_gguf    # doctest: +SKIP
>>> print(position_plan_from_gguf("SmolLM2-135M-Instruct-Q8_0.gguf").describe())  # doctest: +SKIP
"""

from posenc.hf_config.gguf.arches import ARCHES, Arch
from posenc.hf_config.gguf.compare import PlanDifference, plan_differences
from posenc.hf_config.gguf.file import GGUFFile, read_gguf
from posenc.hf_config.gguf.ggml_rope import GGMLRope, ggml_rope_angles
from posenc.hf_config.gguf.reader import (
    GGUFPositions,
    gguf_rope_metadata,
    position_plan_from_gguf,
    read_gguf_positions,
)

__all__ = ["ARCHES", "Arch", "GGMLRope", "GGUFFile", "ggml_rope_angles", "GGUFPositions", "PlanDifference", "gguf_rope_metadata", "plan_differences",
           "position_plan_from_gguf", "read_gguf", "read_gguf_positions"]
