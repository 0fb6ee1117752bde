"""`posenc bench`: wired to posenc.lab.bench, one-line errors; a smoke run of the RoPE table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import posenc
from posenc.lab import bench
from posenc.lab.cli import main


def test_bench_rejects_unknown_target(capsys):
    assert main(["bench", "nonsense"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error:") and "rope, attention, throughput" in err and "\n" not in err


def test_bench_rope_quick(capsys):
    assert main(["bench", "rope", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "RoPE on q and k" in out and "apply_rotary" in out and "HF-style" in out


def test_rope_rows_are_ratios_to_the_copy():
    rows, _ = bench.rope_benchmark((1, 2, 16, 8), dtypes=("float32",), repeats=1, threads=None, compile_peers=False)
    by_method = {row["method"]: row for row in rows}
    assert by_method["copy (clone: new tensors)"]["vs_clone"] == 1.0
    assert by_method["copy_ (into preallocated)"]["vs_copy_"] == 1.0


@pytest.mark.slow  # Inductor's compile: about 20 s of the default run's budget
def test_rope_compiled_peer_row_is_a_ratio_to_the_copy():
    rows, _ = bench.rope_benchmark((1, 2, 16, 8), dtypes=("float32",), repeats=1, threads=None, peers=False)
    row = {row["method"]: row for row in rows}["torch.compile(posenc apply_rotary)"]
    assert row["ms"] > 0 and row["vs_clone"] > 0


# -- on a device (the GPU tables' code path, run here on the CPU at tiny sizes) -----------------

def test_device_attention_rows_are_ratios_to_bias_free_sdpa():
    rows, notes = bench.device_attention_benchmark("cpu", (32,), encodings=("alibi", "t5"), backends=("flex", "auto"),
                                                   heads=2, head_dim=16, tokens=64, repeats=1, dtype="float32")
    by_key = {(row["encoding"], row["backend"]): row for row in rows}
    baseline = by_key["none (bias-free SDPA)", "sdpa"]
    assert baseline["fwd_ratio"] == 1.0 and baseline["fwd_bwd_ratio"] == 1.0 and baseline["batch"] == 2
    for name in ("alibi", "t5"):
        auto = by_key[name, "auto"]
        assert auto["fwd_ms"] > 0 and auto["fwd_bwd_ratio"] == auto["fwd_bwd_ms"] / baseline["fwd_bwd_ms"]
        flex = by_key[name, "flex"]  # forward only on the CPU: torch's FlexAttention has no backward here
        assert flex["fwd_ms"] > 0 and "no backward for q, k, v on the CPU" in flex["bwd_error"]
    assert any("flash-attn not installed" in note for note in notes) or ("alibi (FlashAttention-2 native)", "flash_attn") in by_key


def test_device_attention_reports_every_row_as_it_is_measured():
    """A run cut at its time limit keeps what it measured: ``progress`` sees the rows so far
    after each row, each with its ratios, and its last call holds the whole table."""
    seen = []
    rows, _ = bench.device_attention_benchmark("cpu", (32,), encodings=("alibi",), backends=("auto",), heads=2,
                                               head_dim=16, tokens=64, repeats=1, dtype="float32",
                                               progress=lambda so_far: seen.append([dict(r) for r in so_far]))
    assert [len(so_far) for so_far in seen] == list(range(1, len(rows) + 1))
    assert seen[-1] == rows
    assert seen[1][-1]["fwd_ratio"] == seen[1][-1]["fwd_ms"] / seen[0][0]["fwd_ms"]


def test_flex_reference_alibi_is_alibi():
    """The GPU table's reference row (FlexAttention's own index-based ALiBi) computes causal
    ALiBi: equal to posenc's eager backend (here on the CPU, forward only)."""
    alibi = posenc.create("alibi", num_heads=2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        got = bench.attention.flex_reference_alibi(q, k, v, alibi.slopes)()
        expected = posenc.attention(q, k, v, alibi, causal=True, backend="eager")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_bench_on_a_device_writes_its_tables(tmp_path, capsys):
    assert main(["bench", "throughput", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    assert "LM training throughput on cpu" in capsys.readouterr().out
    table = json.loads((tmp_path / "throughput-cpu.json").read_text())
    assert table["meta"]["device"] == "cpu" and table["meta"]["torch"] == torch.__version__
    assert {row["encoding"] for row in table["rows"]} == set(posenc.available())
    assert next(row for row in table["rows"] if row["encoding"] == "nope")["vs_nope"] == 1.0
    markdown = (tmp_path / "throughput-cpu.md").read_text()
    assert markdown.startswith("| encoding | tokens/s | x nope | notes |") and "device cpu" in markdown
    assert (tmp_path / "throughput-cpu.csv").read_text().startswith("encoding,tokens_per_s,vs_nope")


def test_bench_device_arguments(capsys):
    assert main(["bench", "attention", "--device", "cpu", "--backends", "fast"]) == 2
    assert "--backends: unknown ['fast']" in capsys.readouterr().err
    assert main(["bench", "attention", "--device", "cpu", "--dtype", "float99"]) == 2
    assert "--dtype must be a torch dtype name" in capsys.readouterr().err


def test_bench_rope_on_a_device_writes_its_table(tmp_path, capsys):
    assert main(["bench", "rope", "--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "rope-cpu.json").read_text())
    assert {row["method"] for row in table["rows"]} >= {bench.COPY_FLOOR, "posenc RoPE.rotate"}


def test_rope_device_benchmark_harness_on_cpu(tmp_path):
    """The accelerator comparison's harness at tiny sizes on the CPU: every mode, the copy as
    the ratio's base, the forward checked against float64, the table written to a file."""
    rows, notes = bench.rope_device_benchmark(
        "cpu", lengths=(16,), q_heads=2, kv_heads=1, head_dim=8, repeats=1, compile_peers=False)
    modes = {(row["mode"], row["method"]) for row in rows}
    assert ("forward", bench.COPY_FLOOR) in modes and ("forward+backward", "posenc RoPE.rotate") in modes
    for row in rows:
        if row["method"] == bench.COPY_FLOOR:
            assert row["vs_copy"] == 1.0
        if row["mode"] == "forward" and row["method"] != bench.COPY_FLOOR:
            assert row["max_err"] < 0.05  # bf16 rounding of values of a few units
    assert any("Liger and flash-attn run on CUDA only" in note for note in notes)
    bench.write_table(tmp_path / "rope.md", "t", rows, bench.ROPE_DEVICE_COLUMNS, notes)
    assert "| 16 | forward | copy q, k" in (tmp_path / "rope.md").read_text()
    assert (tmp_path / "rope.json").exists()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_cpu_peak_counts_a_call_that_reuses_freed_heap():
    """After a warm-up call freed its memory, glibc keeps that heap: the measured call reuses it
    without new pages, and a peak read without handing the heap back counts almost nothing."""
    from posenc.lab.bench.timing import _Device

    pins = []

    def allocate():
        small = [torch.ones(25_000) for _ in range(3000)]  # 300 MB of 100 KB tensors (glibc's heap)
        pins.append(torch.ones(25_000))  # above them: the freed heap cannot shrink by itself
        del small

    allocate()  # the warm-up every measurement runs first
    assert 280 < _Device("cpu").peak_mb(allocate) < 380
