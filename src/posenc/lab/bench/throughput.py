"""LM training throughput per encoding, as a ratio to NoPE, on any device."""

from __future__ import annotations

import torch

from posenc.encodings import REGISTRY, create_for_model, encoding_class
from posenc.lab.bench.timing import _Device, _median_times, _one_line


#: The GPU size of ``posenc bench throughput --device cuda``: a GPT-2-small-shaped byte model.
DEVICE_THROUGHPUT = dict(d_model=768, num_layers=12, num_heads=12, seq_len=2048, batch_size=8, steps=10, repeats=3)


def throughput_benchmark(
    encodings: tuple[str, ...] | None = None,
    d_model: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    seq_len: int = 64,
    batch_size: int = 32,
    steps: int = 5,
    repeats: int = 3,
    threads: int | None = None,
    device: str = "cpu",
    autocast: str | None = None,
    compile: bool = False,
) -> tuple[list[dict], list[str]]:
    """Training tokens per second of :class:`~posenc.lab.model.TransformerLM` per encoding (AdamW
    steps on random bytes), interleaved across encodings, as a ratio to NoPE.

    ``device``: where the models train (one model per encoding, all on it at once);
    ``autocast``: None (float32) or a dtype name ("bfloat16") for ``torch.autocast``;
    ``compile``: ``torch.compile`` each model (its first step, the compile, is the untimed
    warm-up). An encoding that cannot train there (out of memory, a backend refusing) gets an
    ``error`` row.

    Returns rows ``{"encoding", "tokens_per_s", "vs_nope"}`` and notes.
    """
    import contextlib

    from posenc.lab.model import LMConfig, TransformerLM

    if threads:
        torch.set_num_threads(threads)
    if encodings is None:
        encodings = tuple(REGISTRY)
    dev = _Device(device)
    config = LMConfig(d_model=d_model, num_layers=num_layers, num_heads=num_heads, max_positions=max(seq_len, 1024))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=g).to(dev.device)
    precision = (lambda: torch.autocast(dev.device.type, dtype=getattr(torch, autocast))) if autocast \
        else contextlib.nullcontext
    runs, errors = {}, {}
    for name in encodings:
        torch.manual_seed(0)
        # built as posenc extrapolate builds it at L = seq_len (iRoPE's chunk scales with L)
        options = encoding_class(name).options_for_train_len(seq_len)
        model = TransformerLM(config, create_for_model(name, **config.encoding_sizes(), **options) if options else name)
        model = model.to(dev.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        forward = torch.compile(model) if compile else model

        def train(model=model, forward=forward, optimizer=optimizer):
            for _ in range(steps):
                with precision():
                    logits = forward(tokens[:, :-1])
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            dev.sync()

        try:
            train()  # warm-up (and compile) before the interleaved timings; a failure is the row's result
        except Exception as err:  # noqa: BLE001
            errors[name] = _one_line(err)
            dev.empty()
            continue
        runs[name] = train
    times = _median_times(runs, repeats)
    per_second = {name: batch_size * seq_len * steps / seconds for name, seconds in times.items()}
    base = per_second.get("nope")
    rows = [{"encoding": name, "tokens_per_s": per_second[name], "vs_nope": per_second[name] / base if base else None}
            if name in per_second else {"encoding": name, "error": errors[name]} for name in encodings]
    notes = [f"d_model {d_model}, {num_layers} layers, {num_heads} heads, seq len {seq_len}, batch {batch_size}, "
             f"{steps} steps per timing, median of {repeats}; device {device}"
             + (f", autocast {autocast}" if autocast else "") + (", compiled" if compile else "")]
    return rows, notes


THROUGHPUT_COLUMNS = [("encoding", "encoding", ""), ("tokens_per_s", "tokens/s", ".0f"), ("vs_nope", "x nope", ".2f")]
