"""Adapters from posenc to other libraries; each submodule imports its library when imported.

- :mod:`posenc.integrations.transformers`: any posenc encoding in a Hugging Face decoder
  (Llama, Qwen2, Mistral, ...): ``use_encoding(model, encoding)``, ``extend_context(model, ...)``.
"""
