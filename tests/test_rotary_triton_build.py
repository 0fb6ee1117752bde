"""The fused RoPE kernels compile for a GPU (sm_90, H100) on a machine without one.

Triton's compiler and the ptxas it ships run on the CPU: lowering to PTX and assembling to a
cubin catches what the interpreter cannot (types the GPU backend rejects, unsupported ops on
float64, register spills of the tile). Run in a subprocess because the other kernel tests set
``TRITON_INTERPRET=1``, under which the kernels are interpreted functions, not compilable ones.
Skipped without triton.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from posenc.kernels import rotary_triton as rt

import os, subprocess, tempfile

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def build(kernel, types, constexprs):
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 8, "enable_fp_fusion": True})  # as launched for this tile
    ttgir = compiled.asm["ttgir"]
    usage = ""
    if os.path.exists(CUOBJDUMP):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    return {"f64_cos": bool(re.search(r"math\.cos %\S+ : tensor<[0-9x]+xf64", ttgir)),
            "f64_sin": bool(re.search(r"math\.sin %\S+ : tensor<[0-9x]+xf64", ttgir)),
            "cubin_bytes": len(compiled.asm["cubin"]), "usage": " ".join(l.strip() for l in usage.splitlines() if "REG:" in l)}

results = {}
for dt, interleaved, axis, tail, wide in [("bf16", False, True, True, False), ("fp16", True, False, False, False),
                                           ("fp64", False, False, True, True)]:
    types = {"attention_factor": "fp64", "qpos_ptr": "*i64", "kpos_ptr": "*i64", "axis_ptr": "*i64",
             "qfreq_ptr": "*fp64", "kfreq_ptr": "*fp64"}
    types.update({n: "*" + dt for n in ("q_ptr", "qo_ptr", "k_ptr", "ko_ptr")})
    constexprs = dict(INTERLEAVED=interleaved, INVERSE=interleaved, HAS_AXIS=axis, COPY_TAIL=tail, Q_WIDE=wide, K_WIDE=wide,
                      Q_SOFT_BF16=False, K_SOFT_BF16=False, Q_BLOCK_H=8, Q_BLOCK_T=4, K_BLOCK_H=8, K_BLOCK_T=4,
                      BLOCK_P=64, BLOCK_TAIL=64 if tail else 1)
    results[f"qk-{dt}"] = build(rt._rope_qk_kernel, types, constexprs)
types = {"x_ptr": "*bf16", "o_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
results["tables-bf16"] = build(rt._tables_kernel, types, dict(INTERLEAVED=True, WIDE=False, SOFT_BF16=False, BLOCK_H=8, BLOCK_T=4, BLOCK_P=64))
print(json.dumps(results))
"""


@pytest.mark.slow  # about 10 s of compiling
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode and "ptxas" in done.stderr and ("not found" in done.stderr or "No such file" in done.stderr):
        pytest.skip("this triton install has no ptxas")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == {"qk-bf16", "qk-fp16", "qk-fp64", "tables-bf16"}
    assert all(r["cubin_bytes"] > 0 for r in results.values())
    for name in ("qk-bf16", "qk-fp16", "qk-fp64"):  # the angles' cos and sin are taken in float64
        assert results[name]["f64_cos"] and results[name]["f64_sin"], results[name]
    for name, r in results.items():  # no register spills to local memory (when cuobjdump can tell)
        assert not r["usage"] or " LOCAL:0 " in f" {r['usage']} ", (name, r["usage"])
