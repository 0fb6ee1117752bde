"""The laboratory: posenc's own small language model, its training and evaluation, the
experiments (``posenc extrapolate``, ``posenc lengthgen``), benchmarks, figures and the CLI.

The library (``import posenc``: encodings, attention, masks, kernels, the Hugging Face config
module and integrations) never imports this package; the lab builds on the library.
"""
