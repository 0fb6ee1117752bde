"""Adapters from posenc to other libraries; each submodule imports its library when imported.

- :mod:`posenc.integrations.transformers`: any posenc encoding, or a per-layer position plan,
  in a Hugging Face decoder (Llama, Qwen, Mistral, Gemma 1-3, Cohere 1/2, SmolLM3, gpt-oss,
  GPT-NeoX, GPT-J, Llama 4, OLMo 3, ...; one record per family in ``FAMILIES``, the family table
  of :mod:`posenc.hf_config.families`, which says where its modules live and names its adapter
  where it has one): ``use_encoding(model, plan_or_encoding, layers=...)``, ``extend_context(model, ...)``.
- :mod:`posenc.integrations.branch_attention`: the training-free position maps (Self-Extend,
  DCA, ReRoPE, STRING, ...) of ``extend_context``, a ``BranchedRoPE`` per layer on posenc's
  attention route.
"""
